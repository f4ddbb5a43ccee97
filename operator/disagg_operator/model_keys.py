"""The Secrets the operator generates for each model: its offer-signing key and its engine
credential.

Each is the Secret `<name>-offer-key` or `<name>-engine-key`, with one data key
(`SECRET_KEY_NAME`) holding 32 random bytes in hex, owned by the model (the garbage collector
deletes it with the model). Unlike the rendered children it is created only when absent and
never written again: its value cannot be rendered, and a person may rotate it (a second line
in the offer key, or a deleted Secret that the next pass creates afresh). Each pass reads both
by name, which is not a write, so the steady state stays write-free.

The offer key is mounted in prefill and decode only, the engine credential is the engines'
`VLLM_API_KEY` and a file in the router (:mod:`disagg_operator.render`); no Role the operator
renders grants reading either.
"""

from __future__ import annotations

import base64
import logging
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from disagg_contract import SECRET_KEY_NAME
from disagg_operator.children import controller_uid, owner_reference
from disagg_operator.conditions import Problem
from disagg_operator.kubeapi import ApiException, KubeApi
from disagg_operator.names import Component, child_name, labels
from disagg_operator.resources import SECRETS

KEY_BYTES = 32
"""Random bytes in each generated key (hex-encoded: 64 characters, one line)."""
PURPOSE_ANNOTATION = "disagg.dev/purpose"
"""On each generated Secret: what the key is for and who holds it."""


@dataclass(frozen=True)
class ModelKey:
    """One generated Secret of a model."""

    component: Component
    purpose: str
    restart: str
    """What reads the key, to restart after replacing it."""


OFFER_KEY = ModelKey(
    Component.OFFER_KEY,
    "signs and verifies the KV offers between prefill and decode (one key a line: the first "
    "signs, every one verifies); mounted in prefill and decode only",
    "the prefill and decode StatefulSets",
)
ENGINE_KEY = ModelKey(
    Component.ENGINE_KEY,
    "the engine credential: prefill and decode require it (VLLM_API_KEY), only the router "
    "holds and sends it",
    "the prefill and decode StatefulSets and the router Deployment",
)
MODEL_KEYS = (OFFER_KEY, ENGINE_KEY)


def new_key() -> str:
    """A fresh random key."""
    return secrets.token_hex(KEY_BYTES)


def secret_name(name: str, key: ModelKey) -> str:
    """The generated Secret's name for model `name`."""
    return child_name(name, key.component)


def key_secret(owner: Mapping[str, Any], key: ModelKey, value: str) -> dict[str, Any]:
    """The Secret holding `value`, owned by `owner` (the model)."""
    meta = owner["metadata"]
    return {
        "apiVersion": SECRETS.api_version,
        "kind": SECRETS.kind,
        "metadata": {
            "name": secret_name(meta["name"], key),
            "namespace": meta["namespace"],
            "labels": labels(meta["name"], key.component),
            "annotations": {PURPOSE_ANNOTATION: key.purpose},
            "ownerReferences": [owner_reference(owner)],
        },
        "type": "Opaque",
        "data": {SECRET_KEY_NAME: base64.b64encode(value.encode()).decode()},
    }


def key_problem(owner: Mapping[str, Any], key: ModelKey, live: Mapping[str, Any]) -> Problem | None:
    """What keeps an existing Secret from serving as the model's key (None: it serves).

    A Secret nobody controls is taken as it is (a key someone made on purpose); one
    controlled by another object is a conflict, as for a child.
    """
    meta = owner["metadata"]
    name = secret_name(meta["name"], key)
    controller = controller_uid(live)
    if controller is not None and controller != meta["uid"]:
        return Problem(
            "ChildConflict",
            f"Secret {name} already exists and is not controlled by this DisaggregatedModel: "
            "delete or rename it",
        )
    value = (live.get("data") or {}).get(SECRET_KEY_NAME)
    if not value:
        return Problem(
            "SecretKeyEmpty" if value is not None else "SecretKeyNotFound",
            f"Secret {name} holds no key under {SECRET_KEY_NAME!r}: delete it and the operator "
            f"creates a new one, then kubectl rollout restart {key.restart}",
        )
    return None


def ensure_model_keys(api: KubeApi, owner: Mapping[str, Any], log: logging.Logger) -> list[Problem]:
    """Create each generated Secret the model lacks; the problems of those that exist.

    Without permission to read Secrets (the chart's `rbac.readSecrets: false`) nothing is
    checked or created: whoever runs the operator so creates the Secrets.
    """
    meta = owner["metadata"]
    namespace = meta["namespace"]
    problems = []
    for key in MODEL_KEYS:
        name = secret_name(meta["name"], key)
        try:
            live = api.get(SECRETS, namespace, name)
        except ApiException as exc:
            if exc.status != 403:
                raise
            log.warning("cannot read Secret %s/%s: %s", namespace, name, exc.reason)
            continue
        if live is not None:
            problem = key_problem(owner, key, live)
            if problem is not None:
                problems.append(problem)
            continue
        try:
            api.request("POST", SECRETS.path(namespace), body=key_secret(owner, key, new_key()))
        except ApiException as exc:
            if exc.status == 409:  # created since the read; the next pass checks it
                continue
            if exc.status not in (403, 422):
                raise
            problems.append(Problem("ApplyFailed", f"creating Secret {name} failed: {exc.reason}"))
            continue
        log.info("created Secret %s/%s", namespace, name)
    return problems
