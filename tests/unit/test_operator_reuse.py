"""Reuse health in status: the routers' summaries summed, `status.reuse` written only when it
changed, stale (once) when the routers stop answering, and the reader against HTTP stand-ins."""

from __future__ import annotations

import argparse
import asyncio
import copy
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, cast

import aiohttp
import jsonschema
import pytest
from aiohttp import web

from crd_admission import root_schema
from disagg_contract import REUSE_SUMMARY_PATH, ReuseSummary
from disagg_operator.conditions import Observed, PodState, build_status
from disagg_operator.kubeapi import KubeApi
from disagg_operator.loading import load_spec
from disagg_operator.models import DisaggregatedModelStatus, ReuseStatus
from disagg_operator.names import Component
from disagg_operator.options import add_arguments, options_from_args
from disagg_operator.reconcile import Live, Reconciler
from disagg_operator.resources import ApiResource
from disagg_operator.reuse import (
    STALE_AFTER,
    Model,
    Reading,
    ReusePoller,
    RouterTarget,
    hit_ratio,
    next_reuse,
    parse_summary,
    pod_urls,
    summed,
    target_of,
    template_urls,
)
from dmodel_samples import minimal_spec, spec_with
from router_harness import router_rig

NOW, LATER = "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z"
OWNER = {
    "apiVersion": "disagg.dev/v1alpha1",
    "kind": "DisaggregatedModel",
    "metadata": {"name": "m", "namespace": "ml", "uid": "u-1", "resourceVersion": "1"},
    "spec": minimal_spec(),
}


def summary(**counters: int) -> ReuseSummary:
    """A router's answer: zeros but for `counters`."""
    base: ReuseSummary = {
        "turns": 0,
        "hits": 0,
        "reused_tokens": 0,
        "recomputed_tokens": 0,
        "leases_held": 0,
        "released": {"idle": 0},
        "store_errors": 0,
    }
    return cast(ReuseSummary, {**base, **counters})


def figures(**counters: int) -> ReuseStatus:
    return summed([parse_summary(summary(**counters))])


# ---- the math ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("hits", "turns", "ratio"),
    [(0, 0, None), (0, 5, "0.0%"), (1, 3, "33.3%"), (2, 3, "66.7%"), (7, 7, "100.0%")],
)
def test_hit_ratio_is_a_percentage_of_turns(hits: int, turns: int, ratio: str | None) -> None:
    assert hit_ratio(hits, turns) == ratio


def test_summaries_are_summed_over_routers() -> None:
    one = parse_summary(summary(turns=10, hits=4, reused_tokens=4000, recomputed_tokens=600))
    two = parse_summary(summary(turns=6, hits=4, reused_tokens=3000, leases_held=3, store_errors=2))
    offers = {"offered_tokens": 9000, "verified_tokens": 8000, "diverged_tokens": 1000}
    three = parse_summary(summary(**offers))
    total = summed([one, two, three])
    assert total.model_dump(exclude_none=True) == {
        "hitRatio": "50.0%",
        "turns": 16,
        "hits": 8,
        "reusedTokens": 7000,
        "recomputedTokens": 600,
        "leasesHeld": 3,
        "storeErrors": 2,
        "offeredTokens": 9000,
        "verifiedTokens": 8000,
        "divergedTokens": 1000,
        "routers": 3,
    }


def test_a_router_older_than_the_offer_counters_counts_zero_for_them() -> None:
    """The operator may be upgraded before the routers roll: their answers still count."""
    older = parse_summary(summary())
    assert (older["offered_tokens"], older["verified_tokens"], older["diverged_tokens"]) == (
        0,
        0,
        0,
    )


@pytest.mark.parametrize(
    ("payload", "says"),
    [
        ([], "not a JSON object"),
        ({**summary(), "turns": -1}, "turns"),
        ({**summary(), "hits": True}, "hits"),
        ({**summary(), "reused_tokens": 1.5}, "reused_tokens"),
        ({k: v for k, v in summary().items() if k != "leases_held"}, "leases_held"),
        ({**summary(), "store_errors": None}, "store_errors"),
        ({**summary(), "diverged_tokens": -4}, "diverged_tokens"),
    ],
)
def test_a_router_answer_that_is_not_a_summary_is_refused(payload: object, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_summary(payload)


def test_the_status_shape_is_short_camel_case_and_admitted_by_the_crd() -> None:
    reuse = next_reuse(None, Reading(figures=figures(turns=4, hits=1)), 0, NOW)
    assert reuse is not None
    dumped = reuse.model_dump(exclude_none=True)
    assert dumped == {
        "hitRatio": "25.0%",
        "turns": 4,
        "hits": 1,
        "reusedTokens": 0,
        "recomputedTokens": 0,
        "leasesHeld": 0,
        "storeErrors": 0,
        "offeredTokens": 0,
        "verifiedTokens": 0,
        "divergedTokens": 0,
        "routers": 1,
        "observedAt": NOW,
    }
    schema = root_schema()["properties"]["status"]["properties"]["reuse"]
    jsonschema.Draft4Validator(schema).validate(dumped)
    stale = next_reuse(reuse, Reading(failure="refused"), STALE_AFTER, LATER)
    assert stale is not None
    jsonschema.Draft4Validator(schema).validate(stale.model_dump(exclude_none=True))


# ---- what changes status ----------------------------------------------------------------------


def test_new_figures_replace_the_old_and_the_same_figures_change_nothing() -> None:
    first = next_reuse(None, Reading(figures=figures(turns=2, hits=1)), 0, NOW)
    assert first is not None and first.observed_at == NOW and first.hit_ratio == "50.0%"
    assert next_reuse(first, Reading(figures=figures(turns=2, hits=1)), 0, LATER) is first
    moved = next_reuse(first, Reading(figures=figures(turns=3, hits=2)), 0, LATER)
    assert moved is not None and moved.observed_at == LATER and moved.hit_ratio == "66.7%"


def test_unanswered_readings_keep_the_figures_and_mark_them_stale_once() -> None:
    failed = Reading(failure="Cannot connect to host")
    assert next_reuse(None, failed, STALE_AFTER + 5, NOW) is None, "nothing read, nothing written"
    kept = next_reuse(None, Reading(figures=figures(turns=5, hits=5)), 0, NOW)
    assert kept is not None
    for failures in range(1, STALE_AFTER):
        assert next_reuse(kept, failed, failures, LATER) is kept
    stale = next_reuse(kept, failed, STALE_AFTER, LATER)
    assert stale is not None and stale.stale is True
    assert stale.message == f"no reading since {NOW}: Cannot connect to host"
    assert stale.model_copy(update={"stale": None, "message": None}) == kept
    assert next_reuse(stale, failed, STALE_AFTER + 1, LATER) is stale
    fresh = next_reuse(stale, Reading(figures=figures(turns=5, hits=5)), 0, LATER)
    assert fresh is not None and fresh.stale is None and fresh.message is None
    assert fresh.observed_at == LATER


def _observed(spec: dict[str, Any], previous: DisaggregatedModelStatus) -> Observed:
    return Observed(
        spec=load_spec(spec),
        name="m",
        namespace="ml",
        generation=1,
        workloads={},
        previous=previous,
    )


def test_a_reconcile_pass_keeps_the_reuse_and_bidirectional_off_drops_it() -> None:
    reuse = next_reuse(None, Reading(figures=figures(turns=1)), 0, NOW)
    previous = DisaggregatedModelStatus.model_validate({"reuse": reuse})
    assert build_status(_observed(minimal_spec(), previous), NOW).reuse == reuse
    off = spec_with({"kvTransfer": {"bidirectional": False}})
    assert build_status(_observed(off, previous), NOW).reuse is None


# ---- which models, which URLs -----------------------------------------------------------------


def _pods() -> list[PodState]:
    return [
        PodState("m-router-a", Component.ROUTER, True, ip="10.0.0.7"),
        PodState("m-router-b", Component.ROUTER, False, "phase Pending", ip="10.0.0.8"),
        PodState("m-router-c", Component.ROUTER, True, ip="fd00::9"),
        PodState("m-decode-0", Component.DECODE, True, ip="10.0.0.9"),
    ]


def test_targets_are_the_ready_router_pods_of_bidirectional_models() -> None:
    model = {**OWNER, "spec": spec_with({"router": {"port": 9000}})}
    target = target_of(model, _pods())
    assert target == RouterTarget("ml", "m", "m-router", 9000, ("10.0.0.7", "fd00::9"))
    assert pod_urls(target) == [
        f"http://10.0.0.7:9000{REUSE_SUMMARY_PATH}",
        f"http://[fd00::9]:9000{REUSE_SUMMARY_PATH}",
    ]
    off = {**OWNER, "spec": spec_with({"kvTransfer": {"bidirectional": False}})}
    assert target_of(off, _pods()) is None
    deleting = copy.deepcopy(OWNER)
    deleting["metadata"]["deletionTimestamp"] = NOW
    assert target_of(deleting, _pods()) is None
    assert target_of({**OWNER, "spec": {"model": {}}}, _pods()) is None


def test_a_url_template_names_the_model() -> None:
    target = RouterTarget("ml", "m", "m-router", 8000, ())
    by_dns = template_urls("http://{service}.{namespace}.svc:{port}")
    assert by_dns(target) == [f"http://m-router.ml.svc:8000{REUSE_SUMMARY_PATH}"]
    standin = template_urls("http://127.0.0.1:4000/{namespace}/{name}/")
    assert standin(target) == [f"http://127.0.0.1:4000/ml/m{REUSE_SUMMARY_PATH}"]


def _options(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(["-A", *argv])


def test_reuse_options_default_and_refuse_nonsense(capsys: pytest.CaptureFixture[str]) -> None:
    options = options_from_args(_options())
    assert (options.reuse_interval_s, options.reuse_url) == (60.0, "")
    options = options_from_args(_options("--reuse-interval", "0", "--reuse-url", "http://x/{name}"))
    assert (options.reuse_interval_s, options.reuse_url) == (0.0, "http://x/{name}")
    for bad, says in (
        (["--reuse-interval", "-1"], "not a number of seconds"),
        (["--reuse-interval", "inf"], "not a number of seconds"),
        (["--reuse-url", "http://x/{model}"], "the placeholders are {namespace}"),
        (["--reuse-url", "x.svc:8000"], "not an http:// or https:// URL"),
    ):
        with pytest.raises(SystemExit):
            _options(*bad)
        assert says in capsys.readouterr().err


# ---- reading routers over HTTP (stand-ins) ----------------------------------------------------


class RouterStandIns:
    """HTTP stand-ins for routers: each path serves the answer set for it (a summary, or a
    status code, or text that is not JSON)."""

    def __init__(self) -> None:
        self.answers: dict[str, object] = {}
        self.url = ""

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        answer = self.answers.get(request.path, 404)
        if isinstance(answer, int):
            return web.Response(status=answer)
        if isinstance(answer, str):
            return web.Response(text=answer)
        return web.json_response(answer)

    def router(self, name: str) -> str:
        """The summary URL of stand-in `name`."""
        return f"{self.url}/{name}{REUSE_SUMMARY_PATH}"

    def answer(self, name: str, value: object) -> None:
        self.answers[f"/{name}{REUSE_SUMMARY_PATH}"] = value


@asynccontextmanager
async def stand_ins() -> AsyncIterator[RouterStandIns]:
    routers = RouterStandIns()
    app = web.Application()
    app.router.add_get("/{tail:.*}", routers._serve)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server = site._server
    assert server is not None and server.sockets
    routers.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield routers
    finally:
        await runner.cleanup()


Reports = list[tuple[str, Reading, int]]


async def _poll_rounds(
    setup: Callable[[RouterStandIns], list[str]],
    rounds: list[Callable[[RouterStandIns], None]],
) -> Reports:
    """Poll OWNER once per round (after the round's change) against stand-ins."""
    reports: Reports = []

    async def report(model: Model, reading: Reading, failures: int) -> None:
        reports.append((model["metadata"]["uid"], reading, failures))

    async with stand_ins() as routers, aiohttp.ClientSession() as session:
        urls = setup(routers)
        poller = ReusePoller(report, interval_s=60, urls=lambda _target: urls, timeout_s=5)
        for change in rounds:
            change(routers)
            await poller.poll(session, [(OWNER, [])])
    return reports


def test_the_poller_sums_every_router_or_reports_a_failure() -> None:
    def two_routers(routers: RouterStandIns) -> list[str]:
        return [routers.router("a"), routers.router("b")]

    def both_answer(routers: RouterStandIns) -> None:
        routers.answer("a", summary(turns=3, hits=1))
        routers.answer("b", summary(turns=1, hits=1, leases_held=1))

    def b_fails(routers: RouterStandIns) -> None:
        routers.answer("b", 503)

    def b_talks_nonsense(routers: RouterStandIns) -> None:
        routers.answer("b", "<html>")

    reports = asyncio.run(_poll_rounds(two_routers, [both_answer, b_fails, b_talks_nonsense]))
    (uid, ok, zero), (_, down, one), (_, nonsense, two) = reports
    assert (uid, zero, one, two) == ("u-1", 0, 1, 2)
    assert ok.figures == figures(turns=4, hits=2, leases_held=1).model_copy(update={"routers": 2})
    assert down.figures is None and "HTTP 503" in down.failure, "no partial sum"
    assert nonsense.figures is None and "not JSON" in nonsense.failure


def test_a_model_without_a_ready_router_is_a_failed_reading() -> None:
    reports = asyncio.run(_poll_rounds(lambda _routers: [], [lambda _routers: None]))
    assert [(r.failure, n) for _, r, n in reports] == [("no ready router pod", 1)]


# ---- the reconciler writes it -----------------------------------------------------------------


def _merge(target: dict[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """RFC 7386 JSON merge patch, as the API server applies a status patch."""
    for name, value in patch.items():
        if value is None:
            target.pop(name, None)
        elif isinstance(value, Mapping) and isinstance(target.get(name), dict):
            _merge(target[name], value)
        else:
            target[name] = copy.deepcopy(value)
    return target


class StatusApi:
    """An API server for one model that counts status patches and stores them merged."""

    def __init__(self) -> None:
        self.owner = copy.deepcopy(OWNER)
        self.patches: list[dict[str, Any]] = []

    def patch_status(
        self, resource: ApiResource, namespace: str, name: str, status: dict[str, Any]
    ) -> dict[str, Any]:
        self.patches.append(copy.deepcopy(status))
        self.owner["status"] = _merge(self.owner.get("status", {}), status)
        version = int(self.owner["metadata"]["resourceVersion"]) + 1
        self.owner["metadata"]["resourceVersion"] = str(version)
        return copy.deepcopy(self.owner)

    def get(self, resource: ApiResource, namespace: str, name: str) -> None:
        return None

    def request(self, method: str, path: str, *, body: dict[str, Any]) -> dict[str, Any]:
        return copy.deepcopy(body)

    def apply(self, resource: ApiResource, manifest: dict[str, Any]) -> dict[str, Any]:
        return copy.deepcopy(manifest)


def test_the_reconciler_writes_reuse_only_when_it_changed() -> None:
    api = StatusApi()
    reconciler = Reconciler(cast(KubeApi, api))

    def report(reading: Reading, failures: int = 0) -> None:
        asyncio.run(reconciler.report_reuse("u-1", lambda: api.owner, reading, failures))

    report(Reading(figures=figures(turns=2, hits=1)))
    assert api.patches[-1]["reuse"]["hitRatio"] == "50.0%"
    report(Reading(figures=figures(turns=2, hits=1)))
    assert len(api.patches) == 1, "the same figures again: no write"
    for failures in range(1, STALE_AFTER + 3):
        report(Reading(failure="refused"), failures)
    assert len(api.patches) == 2, "stale is written once"
    assert api.owner["status"]["reuse"]["stale"] is True
    report(Reading(figures=figures(turns=2, hits=1)))
    assert len(api.patches) == 3
    assert api.patches[-1]["reuse"]["stale"] is None, "the marker is removed"
    assert "stale" not in api.owner["status"]["reuse"]
    reuse = copy.deepcopy(api.owner["status"]["reuse"])
    asyncio.run(reconciler.reconcile(copy.deepcopy(api.owner), Live(children={})))
    assert len(api.patches) == 4, "the pass wrote its conditions"
    assert api.owner["status"]["reuse"] == reuse, "a reconcile pass keeps the reuse"


def test_the_poller_reads_real_routers_that_require_client_keys() -> None:
    """What `disagg router` serves is what the operator sums (the path is open: the operator
    holds no client key)."""
    with router_rig(prefills=1, decodes=1, api_key="sk-client-key-of-tenant-default") as rig:
        rig.start_router(api_key="sk-client-key-of-tenant-default")
        urls = [router.url + REUSE_SUMMARY_PATH for router in rig.routers]
        reports: Reports = []

        async def report(model: Model, reading: Reading, failures: int) -> None:
            reports.append((model["metadata"]["uid"], reading, failures))

        async def poll() -> None:
            poller = ReusePoller(report, interval_s=60, urls=lambda _target: urls)
            async with aiohttp.ClientSession() as session:
                await poller.poll(session, [(OWNER, [])])

        asyncio.run(poll())
    ((_, reading, failures),) = reports
    assert (reading.failure, failures) == ("", 0)
    assert reading.figures == summed([parse_summary(summary()), parse_summary(summary())])
    assert reading.figures is not None and reading.figures.routers == 2


def test_a_reading_after_bidirectional_was_turned_off_writes_nothing() -> None:
    api = StatusApi()
    api.owner["spec"] = spec_with({"kvTransfer": {"bidirectional": False}})
    reconciler = Reconciler(cast(KubeApi, api))
    reading = Reading(figures=figures(turns=2, hits=1))
    asyncio.run(reconciler.report_reuse("u-1", lambda: api.owner, reading, 0))
    asyncio.run(reconciler.report_reuse("u-1", lambda: None, reading, 0))
    assert api.patches == []
