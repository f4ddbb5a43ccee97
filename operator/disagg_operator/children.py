"""What to do with each child: adopt the rendered manifest, compare it to the live object and
decide whether to apply it (pure; no API calls)."""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from disagg_operator.drift import differences
from disagg_operator.models import RESERVED_ANNOTATION_PREFIX

APPLIED_HASH_ANNOTATION = f"{RESERVED_ANNOTATION_PREFIX}applied-hash"
"""On every child: the hash of the manifest last applied (a spec change shows as a new hash)."""

Manifest = dict[str, Any]


def owner_reference(owner: Mapping[str, Any]) -> dict[str, Any]:
    """The controller owner reference to a DisaggregatedModel (the GC deletes children with it)."""
    meta = owner["metadata"]
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def applied_hash(manifest: Manifest) -> str:
    """A short, stable hash of a manifest."""
    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:16]


def adopt(manifest: Manifest, owner: Mapping[str, Any]) -> Manifest:
    """A copy of `manifest` owned by `owner` and stamped with its applied hash.

    Only the owner reference is added: copying the owner's labels (as `kopf.adopt` does)
    would copy a GitOps tool's tracking label onto children the tool does not own.
    """
    adopted = copy.deepcopy(manifest)
    meta = adopted["metadata"]
    meta["ownerReferences"] = [owner_reference(owner)]
    meta.setdefault("annotations", {})[APPLIED_HASH_ANNOTATION] = applied_hash(adopted)
    return adopted


def key(manifest: Mapping[str, Any]) -> tuple[str, str]:
    """A child's identity within its namespace: (kind, name)."""
    return manifest["kind"], manifest["metadata"]["name"]


def controller_uid(live: Mapping[str, Any]) -> str | None:
    """The uid of the live object's controller owner, if any."""
    for ref in live.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("controller"):
            uid: str = ref["uid"]
            return uid
    return None


def owns_replicas(live: Mapping[str, Any], manager: str) -> bool:
    """Whether `manager`'s server-side apply owns the live object's `spec.replicas`."""
    for entry in live.get("metadata", {}).get("managedFields") or []:
        applied = entry.get("manager") == manager and entry.get("operation") == "Apply"
        fields = (entry.get("fieldsV1") or {}).get("f:spec") or {}
        if applied and not entry.get("subresource") and "f:replicas" in fields:
            return True
    return False


class Action(StrEnum):
    """What a child needs."""

    NONE = "none"
    CREATE = "create"
    UPDATE = "update"
    REPAIR = "repair"
    CONFLICT = "conflict"


@dataclass(frozen=True)
class Decision:
    """The action for one child and why."""

    action: Action
    detail: str = ""


def decide(desired: Manifest, live: Mapping[str, Any] | None, owner_uid: str) -> Decision:
    """Compare an adopted manifest with the live child.

    A child controlled by another object is never taken over (no forced apply): that is a
    conflict for a person to resolve. A changed applied hash means the spec changed; lost or
    changed fields mean someone edited the child (drift).
    """
    if live is None:
        return Decision(Action.CREATE)
    if controller_uid(live) != owner_uid:
        return Decision(
            Action.CONFLICT,
            f"{desired['kind']} {desired['metadata']['name']} already exists and is not "
            "controlled by this DisaggregatedModel: delete or rename it",
        )
    live_hash = live.get("metadata", {}).get("annotations", {}).get(APPLIED_HASH_ANNOTATION)
    if live_hash != desired["metadata"]["annotations"][APPLIED_HASH_ANNOTATION]:
        return Decision(Action.UPDATE)
    changed = differences(desired, dict(live))
    if changed:
        return Decision(Action.REPAIR, ", ".join(changed[:5]))
    return Decision(Action.NONE)
