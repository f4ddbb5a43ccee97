"""The operator's kopf diff base compares specs by meaning: a field the API server fills in
with its default (a new CRD field after an upgrade) is no change, so the operator writes
nothing to the model; any real change, and any spec that does not validate, still is."""

from __future__ import annotations

import json
from typing import Any

import kopf
import pytest

from disagg_operator.options import PERSISTENCE_PREFIX
from disagg_operator.settings import DIFF_BASE_KEY, SpecDiffBaseStorage
from dmodel_samples import minimal_spec, resource, spec_with


def _storage() -> SpecDiffBaseStorage:
    return SpecDiffBaseStorage(prefix=PERSISTENCE_PREFIX, key=DIFF_BASE_KEY)


def _handled(last: dict[str, Any], now: dict[str, Any]) -> kopf.Body:
    """A model whose spec is `now` and whose diff base is what kopf stored for `last`."""
    storage, handled = _storage(), kopf.Body(resource(last))
    patch = kopf.Patch()
    storage.store(body=handled, patch=patch, essence=storage.build(body=handled))
    obj = resource(now)
    obj["metadata"]["annotations"] = dict(patch["metadata"]["annotations"])
    return kopf.Body(obj)


def _changed(last: dict[str, Any], now: dict[str, Any]) -> bool:
    body = _handled(last, now)
    storage = _storage()
    return storage.fetch(body=body) != storage.build(body=body)


def test_a_field_the_api_server_defaults_is_no_change() -> None:
    filled = spec_with({"router": {"prefillRouting": "affinity"}})
    assert filled != minimal_spec()
    assert not _changed(minimal_spec(), filled)
    assert not _changed(filled, minimal_spec())


@pytest.mark.parametrize(
    "patch",
    [
        {"router": {"prefillRouting": "least-loaded"}},
        {"decode": {"replicas": 3}},
        {"kvTransfer": {"bidirectional": False}},
    ],
)
def test_a_change_of_meaning_is_a_change(patch: dict[str, Any]) -> None:
    assert _changed(minimal_spec(), spec_with(patch))


def test_a_spec_that_does_not_validate_is_compared_as_it_is() -> None:
    broken = spec_with({"decode": {"replicas": "three"}})
    essence = _storage().build(body=kopf.Body(resource(broken)))
    assert essence["spec"] == broken
    assert _changed(minimal_spec(), broken)


def test_the_stored_diff_base_leaves_defaults_out() -> None:
    filled = spec_with({"router": {"prefillRouting": "affinity"}})
    body = _handled(filled, filled)
    stored = json.loads(body["metadata"]["annotations"][f"{PERSISTENCE_PREFIX}/{DIFF_BASE_KEY}"])
    assert "prefillRouting" not in json.dumps(stored)
    assert stored["spec"]["model"] == minimal_spec()["model"]
