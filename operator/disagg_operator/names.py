"""Child object names and the recommended `app.kubernetes.io/*` labels, in one place."""

from __future__ import annotations

import re
from enum import StrEnum

from disagg_contract import Role
from disagg_operator.errors import SpecError
from disagg_operator.models import (
    MAX_NAME_LENGTH,
    NAME_PATTERN,
    RESERVED_ANNOTATION_PREFIX,
    RESERVED_LABEL_PREFIX,
)

APP_NAME = "disagg"
MANAGED_BY = "disagg-operator"
LABEL_PREFIX = RESERVED_LABEL_PREFIX
CONFIG_HASH_ANNOTATION = f"{RESERVED_ANNOTATION_PREFIX}connector-config-hash"


class Component(StrEnum):
    """The parts one DisaggregatedModel becomes; each names its children `<name>-<component>`."""

    PREFILL = Role.PREFILL.value
    DECODE = Role.DECODE.value
    ROUTER = "router"
    CONNECTOR = "connector"
    OFFER_KEY = "offer-key"
    """The offer-signing Secret: prefill and decode only."""
    ENGINE_KEY = "engine-key"
    """The engine credential Secret: the engines require it, the router sends it."""


ROLES = (Component.PREFILL, Component.DECODE)
"""The serving roles, each a StatefulSet of vLLM servers."""


def child_name(name: str, component: Component) -> str:
    """`<name>-<component>`; `name` must pass the CRD's metadata.name rule."""
    if len(name) > MAX_NAME_LENGTH or not re.fullmatch(NAME_PATTERN, name):
        raise SpecError(
            [
                f"metadata.name: {name!r} must be a DNS-1035 label of at most "
                f"{MAX_NAME_LENGTH} characters (children add suffixes such as -prefill)"
            ]
        )
    return f"{name}-{component}"


COMPONENT_LABEL = f"{LABEL_PREFIX}component"


def instance_labels(name: str) -> dict[str, str]:
    """The labels every object of one DisaggregatedModel shares."""
    return {f"{LABEL_PREFIX}name": APP_NAME, f"{LABEL_PREFIX}instance": name}


def selector_labels(name: str, component: Component) -> dict[str, str]:
    """The labels that select one component's pods."""
    return {**instance_labels(name), COMPONENT_LABEL: str(component)}


def redis_prefix(name: str, namespace: str) -> str:
    """The model's own Redis key prefix: names and namespaces are DNS labels (no `:`), so two
    models sharing one Redis never read each other's conversations."""
    return f"disagg:{namespace}:{name}:conv:"


def labels(name: str, component: Component) -> dict[str, str]:
    """All recommended labels of one component's objects (a superset of the selector)."""
    return {
        **selector_labels(name, component),
        f"{LABEL_PREFIX}part-of": APP_NAME,
        f"{LABEL_PREFIX}managed-by": MANAGED_BY,
    }
