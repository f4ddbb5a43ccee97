"""Does a live child still hold what the operator would apply? (pure; no API calls)

The API server adds defaults, drops empty fields and canonicalises quantities, so a live
object is compared to its desired manifest as a superset: every field the operator sets must
be there with the same value; fields others add are left alone (server-side apply would not
remove them either).
"""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal, InvalidOperation
from typing import Any

from kubernetes.utils.quantity import parse_quantity

IGNORED_PATHS = frozenset({".metadata.ownerReferences"})
"""Compared separately: ownership decides whether the operator may apply at all."""
QUANTITY_KEYS = (".averageValue",)
"""Quantities outside `resources` (an autoscaler's target): the API server stores "0.8" as
"800m"."""


def _quantity(value: object) -> Decimal | None:
    if isinstance(value, bool) or not isinstance(value, int | str):
        return None
    try:
        parsed: Decimal = parse_quantity(value)  # type: ignore[no-untyped-call]
    except (ValueError, InvalidOperation):
        return None
    return parsed


def _empty(value: object) -> bool:
    """Values the API server omits when stored (omitempty): false, 0, "", {}, [] and null."""
    return value is None or value is False or value == 0 or value == "" or value in ({}, [])


def _scalars_equal(want: object, have: object, path: str) -> bool:
    if want == have and type(want) is type(have):
        return True
    if have is None and _empty(want):
        return True
    if ".resources." in path or path.endswith(QUANTITY_KEYS):
        quantity = _quantity(want)
        return quantity is not None and quantity == _quantity(have)
    return False


def _walk(want: Any, have: Any, path: str) -> Iterator[str]:
    if path in IGNORED_PATHS:
        return
    if isinstance(want, dict):
        if not isinstance(have, dict):
            if not (have is None and not want):
                yield path
            return
        for key, value in want.items():
            yield from _walk(value, have.get(key), f"{path}.{key}")
    elif isinstance(want, list):
        if not isinstance(have, list) or len(have) != len(want):
            if not (have is None and not want):
                yield path
            return
        for index, (w, h) in enumerate(zip(want, have, strict=True)):
            yield from _walk(w, h, f"{path}[{index}]")
    elif not _scalars_equal(want, have, path):
        yield path


def differences(desired: dict[str, Any], live: dict[str, Any]) -> list[str]:
    """Paths (e.g. `.spec.replicas`) where `live` lost or changed what `desired` sets."""
    return list(_walk(desired, live, ""))
