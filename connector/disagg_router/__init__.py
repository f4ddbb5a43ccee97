"""KV-cache-aware router for prefill/decode disaggregated vLLM.

Per turn it sends the prompt to a prefill replica with the decode KV metadata of the
conversation's previous turn (so prefill can READ that KV back, D->P), forwards prefill's
metadata to a decode replica, streams decode's answer to the client and keeps decode's final
metadata for the next turn. ``proxy.ProxyService.serve_turn`` is that turn top to bottom;
``app.create_app`` wires the router's parts into an ASGI app; ``disagg router`` runs it.
"""
