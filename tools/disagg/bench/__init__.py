"""``disagg bench``: multi-turn TTFT with bidirectional KV reuse (ON) against recompute (OFF).

Pure parts (records, aggregation, Prometheus parsing, vLLM stats reading, table, figures) are
importable without a running server; ``runner`` and ``client`` talk HTTP to a router.
"""
