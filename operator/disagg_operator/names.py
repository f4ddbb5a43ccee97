"""Child object names and the recommended `app.kubernetes.io/*` labels, in one place."""

from __future__ import annotations

from enum import StrEnum

APP_NAME = "disagg"
MANAGED_BY = "disagg-operator"
LABEL_PREFIX = "app.kubernetes.io/"
CONFIG_HASH_ANNOTATION = "disagg.dev/connector-config-hash"
MAX_DNS_LABEL = 63


class Component(StrEnum):
    """The parts one DisaggregatedModel becomes; each names its children `<name>-<component>`."""

    PREFILL = "prefill"
    DECODE = "decode"
    ROUTER = "router"
    CONNECTOR = "connector"


ROLES = (Component.PREFILL, Component.DECODE)
"""The serving roles, each a StatefulSet of vLLM servers."""


def child_name(name: str, component: Component) -> str:
    """`<name>-<component>`, refused when it would not fit a DNS label."""
    child = f"{name}-{component}"
    if len(child) > MAX_DNS_LABEL:
        raise ValueError(f"metadata.name: {name!r} is too long for the child name {child!r}")
    return child


COMPONENT_LABEL = f"{LABEL_PREFIX}component"


def instance_labels(name: str) -> dict[str, str]:
    """The labels every object of one DisaggregatedModel shares."""
    return {f"{LABEL_PREFIX}name": APP_NAME, f"{LABEL_PREFIX}instance": name}


def selector_labels(name: str, component: Component) -> dict[str, str]:
    """The labels that select one component's pods."""
    return {**instance_labels(name), COMPONENT_LABEL: str(component)}


def labels(name: str, component: Component) -> dict[str, str]:
    """All recommended labels of one component's objects (a superset of the selector)."""
    return {
        **selector_labels(name, component),
        f"{LABEL_PREFIX}part-of": APP_NAME,
        f"{LABEL_PREFIX}managed-by": MANAGED_BY,
    }
