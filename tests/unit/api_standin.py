"""API server stand-in: the object store the operator's reconcile tests write to.

It is *not* an API server: it keeps each object under its (kind, name), numbers
``resourceVersion`` as etcd does and gives an object a uid the first time it is stored. Each
test's stand-in adds the verbs (apply, delete, patch_status, get) its reconciler calls.
"""

from __future__ import annotations

import copy
from typing import Any

from disagg_operator.children import key


class StoreStandIn:
    """Stored objects by (kind, name), each write a new ``resourceVersion``."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.version = 1

    def _store(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Store ``obj`` as the API server would and return a copy of what it stored."""
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        obj["metadata"].setdefault("uid", f"uid-{obj['kind']}-{obj['metadata']['name']}")
        self.objects[key(obj)] = obj
        return copy.deepcopy(obj)
