"""Operator-wide kopf settings, applied once by the startup handler."""

from __future__ import annotations

import logging

import kopf

from disagg_operator.options import PERSISTENCE_PREFIX, OperatorOptions


def configure(settings: kopf.OperatorSettings, options: OperatorOptions) -> None:
    """Operator-wide kopf settings, all in one place.

    kopf's bookkeeping (handler progress, the diff base of the last handled spec and the
    finalizer name, though no handler needs a finalizer) lives under `disagg.dev/`; status is
    ours alone. Events are posted only where the operator calls for them; resource and
    namespace scanning is off, so no cluster-wide permission is needed in namespaced mode.
    """
    persistence = settings.persistence
    persistence.finalizer = f"{PERSISTENCE_PREFIX}/finalizer"
    persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PERSISTENCE_PREFIX)
    persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=PERSISTENCE_PREFIX, key="last-handled-configuration"
    )
    settings.posting.enabled = True
    settings.posting.loggers = False
    settings.posting.level = logging.INFO
    settings.scanning.disabled = True
    settings.peering.stealth = True
    settings.peering.priority = options.priority
    settings.peering.name = options.peering
