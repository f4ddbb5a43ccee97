"""disagg connector: verified-prefix bidirectional KV connector, launcher and router."""
