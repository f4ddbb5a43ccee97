"""How vLLM's server argument parser (0.32, 0.33) reads an option's spelling.

It takes ``_`` for ``-``, ``--flag=value``, dotted keys of JSON options (``--flag.key value``)
and argparse's unique abbreviations, so every such spelling sets the option. The operator
(``extraArgs`` admission) and ``disagg serve`` (the connector config) refuse flags through
these rules; tests/engine checks them against vLLM's real parsers. Standard library only.
"""

from __future__ import annotations

from collections.abc import Iterable


def vllm_option_name(arg: str) -> str:
    """The option name vLLM reads in ``arg``: cut at the first ``=`` and ``.``, ``_`` as ``-``.

    ``--max_model_len=10`` and ``--kv-transfer-config.kv_role`` name ``--max-model-len`` and
    ``--kv-transfer-config``.
    """
    return arg.split("=", 1)[0].split(".", 1)[0].replace("_", "-")


def flags_named(arg: str, flags: Iterable[str]) -> list[str]:
    """The options among ``flags`` vLLM's parser may read ``arg`` as.

    Its option name is the option or, as argparse's abbreviations, a prefix of it (``--max-model``,
    ``-t`` for ``-tp``); a prefix of several options is one vLLM refuses as ambiguous. None of
    vLLM's own options is a prefix of a managed one (tests/engine checks this), so no other option
    is taken for one.
    """
    name = vllm_option_name(arg)
    if len(name) < 2 or name == "--":
        return []
    return [flag for flag in flags if flag.startswith(name)]
