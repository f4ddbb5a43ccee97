"""Capacity model behind ``disagg plan``: predicted TTFT with and without KV reuse.

A physical model (FLOPs over achieved FLOP/s, KV bytes over achieved link bandwidth, a fixed
latency per serialized step) with three efficiency constants shared by every model and GPU,
calibrated on the published AWS P5en points. Pure Python, no third-party imports.
"""
