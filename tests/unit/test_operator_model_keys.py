"""The Secrets the operator generates per model (offer-signing key, engine credential): created
when absent, owned by the model, never written again, their problems named; the key format is
the one the connector and the router read; and the client-keys Secret checked like the other
Secrets a spec names."""

from __future__ import annotations

import asyncio
import base64
import copy
import logging
import re
from pathlib import Path
from typing import Any, cast

import pytest

from disagg_connector.offer import load_offer_keys
from disagg_contract import OFFER_KEY_FILE_ENV, SECRET_KEY_NAME
from disagg_operator.conditions import Problem
from disagg_operator.kubeapi import ApiException, KubeApi
from disagg_operator.loading import load_spec
from disagg_operator.model_keys import (
    ENGINE_KEY,
    MODEL_KEYS,
    OFFER_KEY,
    ensure_model_keys,
    key_secret,
    new_key,
)
from disagg_operator.models import SecretRef
from disagg_operator.reconcile import Live, Reconciler, secret_problem, secret_refs
from disagg_operator.resources import ApiResource
from disagg_router.tenants import key_problem, read_key_file
from dmodel_samples import spec_with

OWNER: dict[str, Any] = {
    "apiVersion": "disagg.dev/v1alpha1",
    "kind": "DisaggregatedModel",
    "metadata": {"name": "m", "namespace": "ml", "uid": "u-1", "generation": 1},
    "spec": spec_with({}),
}
LOG = logging.getLogger("test")


class SecretsApi:
    """Secrets by name, creates recorded; `refuse` maps a verb to the status it answers."""

    def __init__(self, refuse: dict[str, int] | None = None) -> None:
        self.secrets: dict[str, dict[str, Any]] = {}
        self.created: list[str] = []
        self.refuse = refuse or {}

    def get(self, resource: ApiResource, namespace: str, name: str) -> dict[str, Any] | None:
        if "get" in self.refuse:
            raise ApiException(status=self.refuse["get"], reason="refused")
        found = self.secrets.get(name)
        return copy.deepcopy(found) if found is not None else None

    def request(self, method: str, path: str, *, body: dict[str, Any]) -> dict[str, Any]:
        assert (method, path) == ("POST", "/api/v1/namespaces/ml/secrets")
        if "create" in self.refuse:
            raise ApiException(status=self.refuse["create"], reason="refused")
        name = body["metadata"]["name"]
        self.created.append(name)
        self.secrets[name] = copy.deepcopy(body)
        return body


def _ensure(api: SecretsApi) -> list[Problem]:
    return ensure_model_keys(cast(KubeApi, api), OWNER, LOG)


def _value(secret: dict[str, Any]) -> str:
    return base64.b64decode(secret["data"][SECRET_KEY_NAME]).decode()


def test_absent_keys_are_created_owned_by_the_model_and_then_left_alone() -> None:
    api = SecretsApi()
    assert _ensure(api) == []
    assert api.created == ["m-offer-key", "m-engine-key"]
    for name, secret in api.secrets.items():
        meta = secret["metadata"]
        assert (secret["type"], meta["namespace"]) == ("Opaque", "ml")
        (ref,) = meta["ownerReferences"]
        assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == (
            "DisaggregatedModel",
            "m",
            "u-1",
            True,
        )
        assert meta["labels"]["app.kubernetes.io/instance"] == "m"
        assert meta["labels"]["app.kubernetes.io/component"] == name.removeprefix("m-")
        assert re.fullmatch("[0-9a-f]{64}", _value(secret))
    assert _value(api.secrets["m-offer-key"]) != _value(api.secrets["m-engine-key"])

    # A person rotated the offer key (new key first, old second): never written back.
    rotated = f"{new_key()}\n{_value(api.secrets['m-offer-key'])}"
    api.secrets["m-offer-key"]["data"][SECRET_KEY_NAME] = base64.b64encode(rotated.encode())
    before = copy.deepcopy(api.secrets)
    api.created.clear()
    assert _ensure(api) == []
    assert api.created == [] and api.secrets == before


def test_a_deleted_key_is_created_afresh() -> None:
    api = SecretsApi()
    _ensure(api)
    old = _value(api.secrets.pop("m-offer-key"))
    api.created.clear()
    assert _ensure(api) == []
    assert api.created == ["m-offer-key"]
    assert _value(api.secrets["m-offer-key"]) != old


@pytest.mark.parametrize(
    ("edit", "reason", "says"),
    [
        ({"ownerReferences": [{"uid": "other", "controller": True}]}, "ChildConflict", "delete"),
        ({"data": {SECRET_KEY_NAME: ""}}, "SecretKeyEmpty", "holds no key under 'disagg-key'"),
        ({"data": {"other": "eA=="}}, "SecretKeyNotFound", "rollout restart the prefill"),
    ],
    ids=["controlled-by-another", "empty", "other-key"],
)
def test_an_unusable_existing_key_is_a_problem_naming_the_secret(
    edit: dict[str, Any], reason: str, says: str
) -> None:
    api = SecretsApi()
    _ensure(api)
    secret = api.secrets["m-offer-key"]
    if "data" in edit:
        secret["data"] = edit["data"]
    else:
        secret["metadata"]["ownerReferences"] = edit["ownerReferences"]
    api.created.clear()
    (problem,) = _ensure(api)
    assert problem.reason == reason
    assert "Secret m-offer-key" in problem.message and says in problem.message
    assert api.created == []


def test_a_key_someone_made_without_an_owner_is_used_as_it_is() -> None:
    api = SecretsApi()
    made = key_secret(OWNER, OFFER_KEY, new_key())
    del made["metadata"]["ownerReferences"]
    api.secrets["m-offer-key"] = made
    assert _ensure(api) == []
    assert api.created == ["m-engine-key"]


def test_without_access_to_secrets_nothing_is_checked_or_created(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api = SecretsApi(refuse={"get": 403})
    with caplog.at_level(logging.WARNING):
        assert _ensure(api) == []
    assert api.created == []
    assert "cannot read Secret ml/m-offer-key" in caplog.text


def test_a_create_refused_is_a_problem_and_a_create_raced_is_not() -> None:
    problems = _ensure(SecretsApi(refuse={"create": 422}))
    assert [p.reason for p in problems] == ["ApplyFailed", "ApplyFailed"]
    assert [p.message.split(" failed")[0] for p in problems] == [
        "creating Secret m-offer-key",
        "creating Secret m-engine-key",
    ]
    assert _ensure(SecretsApi(refuse={"create": 409})) == []
    with pytest.raises(ApiException):
        _ensure(SecretsApi(refuse={"create": 500}))


def test_generated_keys_are_what_the_connector_and_the_router_read(tmp_path: Path) -> None:
    """The offer key as the engines load it (one key a line, two during a rotation) and the
    engine credential as the router reads its file."""
    offer, engine = (key_secret(OWNER, key, new_key()) for key in MODEL_KEYS)
    path = tmp_path / SECRET_KEY_NAME
    path.write_text(_value(offer))
    keys = load_offer_keys({OFFER_KEY_FILE_ENV: str(path)})
    assert keys is not None and keys.keys == (_value(offer).encode(),)
    path.write_text(f"{new_key()}\n{_value(offer)}\n")
    rotated = load_offer_keys({OFFER_KEY_FILE_ENV: str(path)})
    assert rotated is not None and len(rotated.keys) == 2
    assert rotated.keys[1] == _value(offer).encode()
    path.write_text(_value(engine))
    assert key_problem(read_key_file(path)) is None
    assert ENGINE_KEY.component == "engine-key"


def test_a_pass_creates_the_keys_before_the_children_and_then_writes_none() -> None:
    class Api(SecretsApi):
        def __init__(self) -> None:
            super().__init__()
            self.order: list[str] = []

        def request(self, method: str, path: str, *, body: dict[str, Any]) -> dict[str, Any]:
            self.order.append(f"Secret/{body['metadata']['name']}")
            return super().request(method, path, body=body)

        def apply(self, resource: ApiResource, manifest: dict[str, Any]) -> dict[str, Any]:
            self.order.append(f"{manifest['kind']}/{manifest['metadata']['name']}")
            return manifest

        def patch_status(self, *args: Any) -> dict[str, Any]:
            return copy.deepcopy(OWNER)

    api = Api()
    reconciler = Reconciler(cast(KubeApi, api))
    outcome = asyncio.run(reconciler.reconcile(OWNER, Live(children={})))
    assert not outcome.problems
    assert api.order[:2] == ["Secret/m-offer-key", "Secret/m-engine-key"]
    assert "NetworkPolicy/m-prefill" in api.order
    api.created.clear()
    asyncio.run(reconciler.reconcile(OWNER, Live(children={})))
    assert api.created == []


def test_the_client_keys_secret_is_checked_like_the_other_named_secrets() -> None:
    spec = load_spec(spec_with({"auth": {"clientKeysSecret": {"name": "clients"}}}))
    assert [(path, ref.name) for path, ref in secret_refs(spec)] == [
        ("spec.auth.clientKeysSecret", "clients")
    ]
    ref = SecretRef(name="clients")
    missing = secret_problem("spec.auth.clientKeysSecret", ref, "ml", None)
    assert missing is not None and missing.reason == "SecretNotFound"
    assert "named by spec.auth.clientKeysSecret" in missing.message
    assert "--from-literal=<tenant>=<key>" in missing.message
    empties: list[dict[str, Any]] = [{}, {"data": {}}, {"data": {"team-a": ""}}]
    for empty in empties:
        problem = secret_problem("spec.auth.clientKeysSecret", ref, "ml", empty)
        assert problem is not None and problem.reason == "SecretKeyNotFound", empty
        assert "holds no key: add one per tenant" in problem.message
    assert secret_problem("spec.auth.clientKeysSecret", ref, "ml", {"data": {"a": "eA=="}}) is None
