"""The operator's kopf peering object: created at start so `--peering NAME` needs no setup."""

from __future__ import annotations

from disagg_operator.kubeapi import APPLY_PATCH, FIELD_MANAGER, ApiException, KubeApi
from disagg_operator.options import OperatorOptions

PEERING_API = "kopf.dev/v1"


class PeeringMissing(RuntimeError):
    """The kopf peering CRDs are not installed."""


def ensure_peering(api: KubeApi, options: OperatorOptions) -> None:
    """Create the peering object(s) the operator's replicas meet in (no-op if they exist)."""
    if options.standalone:
        return
    targets: list[tuple[str, str | None]]
    if options.clusterwide:
        targets = [(f"/apis/{PEERING_API}/clusterkopfpeerings/{options.peering}", None)]
    else:
        targets = [
            (f"/apis/{PEERING_API}/namespaces/{ns}/kopfpeerings/{options.peering}", ns)
            for ns in options.namespaces
        ]
    for path, namespace in targets:
        kind = "KopfPeering" if namespace else "ClusterKopfPeering"
        metadata = {"name": options.peering, **({"namespace": namespace} if namespace else {})}
        try:
            api.request(
                "PATCH",
                path,
                body={"apiVersion": PEERING_API, "kind": kind, "metadata": metadata},
                query=[("fieldManager", FIELD_MANAGER)],
                content_type=APPLY_PATCH,
            )
        except ApiException as exc:
            if exc.status == 404:
                raise PeeringMissing(
                    f"{kind} is not served: install crds/ (kubectl apply -f crds/) "
                    "or run with --standalone"
                ) from None
            raise
