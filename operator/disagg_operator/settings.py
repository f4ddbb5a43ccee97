"""Operator-wide kopf settings, applied once by the startup handler."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, cast

import kopf
from pydantic import ValidationError

from disagg_operator.models import DisaggregatedModelSpec
from disagg_operator.options import PERSISTENCE_PREFIX, OperatorOptions

DIFF_BASE_KEY = "last-handled-configuration"
"""The annotation (under `disagg.dev/`) that holds the spec the operator last handled."""


class SpecDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """kopf's annotation diff base, with each spec compared by meaning rather than by bytes.

    Both sides of kopf's diff (the spec last handled, read back from the annotation, and the
    spec now) are written with every field at its API default left out. A new CRD field that
    the API server fills in with its default, once an upgrade applies the new CRD, then makes
    no spec change: the operator runs no update handler and writes nothing to the model, as an
    upgrade must (tests/cluster/test_operator_upgrade.py). A spec that does not validate is
    compared as it is, so the reconciler still runs and reports it.
    """

    def build(
        self, *, body: kopf.Body, extra_fields: Iterable[kopf.FieldSpec] | None = None
    ) -> kopf.BodyEssence:
        return _without_defaults(super().build(body=body, extra_fields=extra_fields))

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        essence = super().fetch(body=body)
        return None if essence is None else _without_defaults(essence)


def _without_defaults(essence: kopf.BodyEssence) -> kopf.BodyEssence:
    """The essence with its spec (when it validates) less every field at its default."""
    spec = essence.get("spec")
    if not isinstance(spec, dict):
        return essence
    try:
        model = DisaggregatedModelSpec.model_validate(spec)
    except ValidationError:
        return essence
    bare = model.model_dump(by_alias=True, mode="json", exclude_defaults=True)
    return cast(kopf.BodyEssence, {**cast(dict[str, Any], essence), "spec": bare})


def configure(settings: kopf.OperatorSettings, options: OperatorOptions) -> None:
    """Operator-wide kopf settings, all in one place.

    kopf's bookkeeping (handler progress, the diff base of the last handled spec, compared by
    meaning (`SpecDiffBaseStorage`), and the finalizer name, though no handler needs a
    finalizer) lives under `disagg.dev/`; status is ours alone. Events are posted only where
    the operator calls for them; resource and namespace scanning is off, so no cluster-wide
    permission is needed in namespaced mode.
    """
    persistence = settings.persistence
    persistence.finalizer = f"{PERSISTENCE_PREFIX}/finalizer"
    persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PERSISTENCE_PREFIX)
    persistence.diffbase_storage = SpecDiffBaseStorage(prefix=PERSISTENCE_PREFIX, key=DIFF_BASE_KEY)
    settings.posting.enabled = True
    settings.posting.loggers = False
    settings.posting.level = logging.INFO
    settings.scanning.disabled = True
    settings.peering.stealth = True
    settings.peering.priority = options.priority
    settings.peering.name = options.peering
