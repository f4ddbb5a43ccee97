"""Turning pydantic validation errors into `field.path: reason` lines."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from disagg_operator.base import CROSS_FIELD_ERROR


class SpecError(ValueError):
    """A DisaggregatedModel the operator cannot accept; each problem names its field path."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def field_path(loc: Iterable[int | str]) -> str:
    """Join a pydantic location into a dotted path with `[i]` list indices."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else part
    return path


def _problem(error: Mapping[str, Any], prefix: tuple[int | str, ...]) -> str:
    loc = (*prefix, *error["loc"])
    if error["type"] == CROSS_FIELD_ERROR:
        ctx = error["ctx"]
        return f"{field_path((*loc, *str(ctx['field']).split('.')))}: {ctx['message']}"
    return f"{field_path(loc) or '(root)'}: {error['msg']}"


def spec_error(exc: ValidationError, prefix: tuple[int | str, ...] = ()) -> SpecError:
    """Convert a ValidationError into a SpecError, paths prefixed with `prefix`."""
    return SpecError([_problem(error, prefix) for error in exc.errors()])
