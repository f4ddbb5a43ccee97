"""Loading DisaggregatedModel objects from dicts and YAML, with field-path errors."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from disagg_operator.errors import SpecError, spec_error
from disagg_operator.models import DisaggregatedModel, DisaggregatedModelSpec


def load_spec(spec: Mapping[str, Any]) -> DisaggregatedModelSpec:
    """Validate a spec dict (as the API server stores it); problems are named `spec.<path>`."""
    try:
        return DisaggregatedModelSpec.model_validate(spec)
    except ValidationError as exc:
        raise spec_error(exc, ("spec",)) from None


def load_resource(obj: object) -> DisaggregatedModel:
    """Validate a whole DisaggregatedModel object (apiVersion, kind, metadata, spec)."""
    try:
        return DisaggregatedModel.model_validate(obj)
    except ValidationError as exc:
        raise spec_error(exc) from None


def load_file(path: Path | str) -> list[DisaggregatedModel]:
    """Read every YAML document of a file ('-' for stdin) as a DisaggregatedModel."""
    text = sys.stdin.read() if str(path) == "-" else Path(path).read_text()
    try:
        documents = [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as exc:
        raise SpecError([f"(yaml): {exc}"]) from None
    if not documents:
        raise SpecError(["(file): no DisaggregatedModel document found"])
    return [load_resource(doc) for doc in documents]
