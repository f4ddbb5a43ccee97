"""disagg connector: what runs inside vLLM (the verified-prefix bidirectional KV connector and
its plugin) and the launcher (`disagg serve`); the serving image's package."""
