"""Reuse health in a model's status: the routers' reuse summaries, read at an interval.

Each router serves its reuse counters since it started (:class:`disagg_contract.ReuseSummary`)
at ``REUSE_SUMMARY_PATH``. Every `interval_s` the operator reads them from each ready router pod
of every bidirectional model, sums them and hands the reconciler a :class:`Reading`; the
reconciler writes `status.reuse` only when the figures changed (:func:`next_reuse`). A reading
counts only when every router answered: a partial sum would drop and come back. Routers that do
not answer leave the last figures in place; after `STALE_AFTER` failed readings in a row the
figures are marked stale, once, and the model is not Degraded for it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from disagg_contract import REUSE_SUMMARY_PATH
from disagg_operator.conditions import PodState
from disagg_operator.errors import SpecError
from disagg_operator.loading import load_spec
from disagg_operator.models import ReuseStatus
from disagg_operator.names import Component, child_name

FETCH_TIMEOUT_S = 5.0
"""How long one router may take to answer."""
STALE_AFTER = 3
"""Failed readings in a row after which the figures are marked stale (one failure is noise)."""
CONCURRENCY = 32
"""Routers read at once, over all models."""
SUMMED_FIELDS = (
    "turns",
    "hits",
    "reused_tokens",
    "recomputed_tokens",
    "leases_held",
    "store_errors",
    "offered_tokens",
    "verified_tokens",
    "diverged_tokens",
)
"""The counters of a ReuseSummary that status carries, summed over a model's routers."""
LATER_FIELDS = frozenset({"offered_tokens", "verified_tokens", "diverged_tokens"})
"""Counters added to the summary after its first form: a router that predates them (the
operator upgraded first) counts as zero for them instead of failing the reading."""


@dataclass(frozen=True)
class RouterTarget:
    """Where one model's routers are: what a URL source needs."""

    namespace: str
    name: str
    service: str
    """The router Service's name."""
    port: int
    """The router's port (`spec.router.port`)."""
    pod_ips: tuple[str, ...]
    """The IPs of the model's ready router pods."""


UrlSource = Callable[[RouterTarget], list[str]]
"""The reuse-summary URLs to read for one model: one per router replica."""


def _host(ip: str) -> str:
    return f"[{ip}]" if ipaddress.ip_address(ip).version == 6 else ip


def pod_urls(target: RouterTarget) -> list[str]:
    """The default source: each ready router pod by its IP, so the sum covers every replica (a
    request to the Service reaches one replica, a different one each time)."""
    return [f"http://{_host(ip)}:{target.port}{REUSE_SUMMARY_PATH}" for ip in target.pod_ips]


def template_urls(template: str) -> UrlSource:
    """A source of one URL per model: `template` with {namespace}, {name}, {service} and {port}
    filled in, then the summary path (e.g. ``http://{service}.{namespace}.svc:{port}``, the
    router Service by DNS, for one replica; or a stand-in's address in tests)."""

    def urls(target: RouterTarget) -> list[str]:
        base = template.format(
            namespace=target.namespace, name=target.name, service=target.service, port=target.port
        )
        return [base.rstrip("/") + REUSE_SUMMARY_PATH]

    return urls


@dataclass(frozen=True)
class Reading:
    """One reading of a model's routers: the summed figures, or why there are none."""

    figures: ReuseStatus | None = None
    """The sums (no `observedAt`): set when every router answered."""
    failure: str = ""
    """Why the reading failed (a router did not answer, or answered nonsense)."""


def parse_summary(payload: object) -> dict[str, int]:
    """The summed counters of one router's answer (ValueError when it is not a summary)."""
    if not isinstance(payload, Mapping):
        raise ValueError("the answer is not a JSON object")
    counters = {}
    for field in SUMMED_FIELDS:
        value = payload.get(field, 0 if field in LATER_FIELDS else None)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{field} is not a non-negative integer: {value!r}")
        counters[field] = value
    return counters


def hit_ratio(hits: int, turns: int) -> str | None:
    """Hits as a percentage of turns, one decimal (None before the first turn)."""
    if turns <= 0:
        return None
    return f"{100 * min(hits, turns) / turns:.1f}%"


def summed(summaries: Sequence[Mapping[str, int]]) -> ReuseStatus:
    """The figures of a model: each counter summed over its routers, and the hit ratio."""
    totals = {field: sum(summary[field] for summary in summaries) for field in SUMMED_FIELDS}
    return ReuseStatus.model_validate(
        {
            "hitRatio": hit_ratio(totals["hits"], totals["turns"]),
            "turns": totals["turns"],
            "hits": totals["hits"],
            "reusedTokens": totals["reused_tokens"],
            "recomputedTokens": totals["recomputed_tokens"],
            "leasesHeld": totals["leases_held"],
            "storeErrors": totals["store_errors"],
            "offeredTokens": totals["offered_tokens"],
            "verifiedTokens": totals["verified_tokens"],
            "divergedTokens": totals["diverged_tokens"],
            "routers": len(summaries),
        }
    )


def _figures(status: ReuseStatus) -> ReuseStatus:
    return status.model_copy(update={"observed_at": None, "stale": None, "message": None})


def next_reuse(
    previous: ReuseStatus | None, reading: Reading, failures: int, now: str
) -> ReuseStatus | None:
    """`status.reuse` after `reading` (`failures`: failed readings in a row, this one included).

    New figures replace the old ones (read `now`); the same figures, fresh, change nothing. A
    failed reading keeps what was there; the `STALE_AFTER`-th in a row marks it stale once.
    """
    if reading.figures is not None:
        if previous is not None and not previous.stale and _figures(previous) == reading.figures:
            return previous
        return reading.figures.model_copy(update={"observed_at": now})
    if previous is None or previous.stale or failures < STALE_AFTER:
        return previous
    message = f"no reading since {previous.observed_at}: {reading.failure}"
    return previous.model_copy(update={"stale": True, "message": message[:1024]})


Model = Mapping[str, Any]
Report = Callable[[Model, Reading, int], Awaitable[None]]
"""What the poller hands each reading to: (the model as listed, the reading, failed readings in
a row)."""


def target_of(model: Model, pods: Iterable[PodState]) -> RouterTarget | None:
    """Where the routers of a stored model are; None when it has no reuse to read (bidirectional
    off, being deleted, or a spec the operator cannot load)."""
    meta = model["metadata"]
    if meta.get("deletionTimestamp"):
        return None
    try:
        spec = load_spec(model["spec"])
    except SpecError:
        return None
    if not spec.kv_transfer.bidirectional:
        return None
    ips = sorted(p.ip for p in pods if p.component == Component.ROUTER and p.ready and p.ip)
    return RouterTarget(
        namespace=meta["namespace"],
        name=meta["name"],
        service=child_name(meta["name"], Component.ROUTER),
        port=spec.router.port,
        pod_ips=tuple(ips),
    )


class ReusePoller:
    """Reads every bidirectional model's routers each `interval_s` and reports the readings."""

    def __init__(
        self,
        report: Report,
        interval_s: float,
        urls: UrlSource = pod_urls,
        timeout_s: float = FETCH_TIMEOUT_S,
        logger: logging.Logger | None = None,
    ) -> None:
        self._report = report
        self._urls = urls
        self.interval_s = interval_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._log = logger or logging.getLogger(__name__)
        self._failures: dict[str, int] = {}
        self._limit = asyncio.Semaphore(CONCURRENCY)

    async def run(self, models: Callable[[], list[tuple[Model, list[PodState]]]]) -> None:
        """Read, then wait `interval_s`, until cancelled; `models` lists the models and their
        pods as the operator sees them now."""
        async with aiohttp.ClientSession(timeout=self._timeout) as session:
            while True:
                try:
                    await self.poll(session, models())
                except Exception:  # a bug in one round must not end the readings for good
                    self._log.exception("reading the routers' reuse summaries failed")
                await asyncio.sleep(self.interval_s)

    async def poll(
        self, session: aiohttp.ClientSession, models: Sequence[tuple[Model, list[PodState]]]
    ) -> None:
        """One reading of every model's routers, reported model by model."""
        targets: dict[str, tuple[Model, RouterTarget]] = {}
        for model, pods in models:
            target = target_of(model, pods)
            if target is not None:
                targets[model["metadata"]["uid"]] = (model, target)
        for gone in set(self._failures) - set(targets):
            del self._failures[gone]
        readings = await asyncio.gather(*(self._read(session, t) for _, t in targets.values()))
        for (uid, (model, target)), reading in zip(targets.items(), readings, strict=True):
            failures = 0 if reading.figures is not None else self._failures.get(uid, 0) + 1
            self._failures[uid] = failures
            try:
                await self._report(model, reading, failures)
            except Exception as exc:  # the next reading tries again; the loop must go on
                self._log.warning(
                    "writing the reuse of %s/%s failed: %s", target.namespace, target.name, exc
                )

    async def _read(self, session: aiohttp.ClientSession, target: RouterTarget) -> Reading:
        urls = self._urls(target)
        if not urls:
            return Reading(failure="no ready router pod")
        try:
            summaries = [await self._fetch(session, url) for url in urls]
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            self._log.debug("reuse of %s/%s: %s", target.namespace, target.name, exc)
            return Reading(failure=str(exc) or type(exc).__name__)
        return Reading(figures=summed(summaries))

    async def _fetch(self, session: aiohttp.ClientSession, url: str) -> dict[str, int]:
        async with self._limit, session.get(url) as response:
            if response.status != 200:
                raise ValueError(f"GET {url}: HTTP {response.status}")
            try:
                payload = await response.json(content_type=None)
            except ValueError:
                raise ValueError(f"GET {url}: not JSON") from None
        try:
            return parse_summary(payload)
        except ValueError as exc:
            raise ValueError(f"GET {url}: {exc}") from None
