"""Prefill's measured costs of a D->P read and of recomputing, and the decision between them.

Pure logic, no vLLM. The scheduler side feeds it what it times itself: each prefill, from
the step that first schedules the request to its end (tokens computed, the context they
start at, seconds), and each D->P read, from the allocation that starts it to the step that
reports it done (tokens read, seconds). From recent samples it fits

* compute: ``a + b*x + c*x*(start + x/2)`` seconds for ``x`` tokens after ``start`` cached
  ones (a per-request cost, a per-token cost and attention's cost growing with context);
* read: ``f + g*n`` seconds for ``n`` tokens (a fixed cost: scheduling the load, the round
  trip and the steps until it is reported; and a per-token cost: the bytes over the link).

Reading ``n`` tokens pays when ``f + g*n`` is below the compute they replace, ``b*n +
c*n*(start + n/2)``: the per-request cost is paid either way, since the suffix is computed
after a read. Fits fall back to fewer terms while the samples cannot tell the terms apart,
and a term fitted negative is dropped. Reads are fitted per decode engine (its first read,
NIXL's handshake, left out), and pooled for an engine not yet measured. Until both sides have
samples the decision is to read, as vLLM does; while recomputing wins, every
``probe_every``-th decision on a link reads anyway so that the read estimate follows the link.
"""

from __future__ import annotations

import enum
import math
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

SAMPLE_WINDOW = 64
"""Samples kept per fit: recent enough to follow the engine and the link as they change."""
PROBE_EVERY = 16
"""While recomputing wins, one decision in this many reads anyway to re-measure the read."""
MAX_LINKS = 256
"""Decode engines with read estimates of their own; the least recently used is forgotten (an
engine restarted under a new id is a new link)."""


class Choice(enum.StrEnum):
    """What the decision was, and on what grounds."""

    READ = "read"
    """The estimated read is cheaper than the compute it replaces."""
    RECOMPUTE = "recompute"
    """The estimated compute is cheaper than the read."""
    UNMEASURED = "unmeasured"
    """A side has no samples yet: read, as with a fixed threshold."""
    PROBE = "probe"
    """Recompute would win, but the read is re-measured now and then."""

    @property
    def reads(self) -> bool:
        """Whether prefill reads the KV on this decision."""
        return self is not Choice.RECOMPUTE


@dataclass(frozen=True)
class Decision:
    """One read-or-recompute decision with the two estimates it compared (seconds)."""

    choice: Choice
    read_s: float | None
    compute_s: float | None


@dataclass(frozen=True)
class Estimates:
    """The fitted costs, for metrics and logs; ``None`` where a side has no samples."""

    read_fixed_s: float | None
    read_tokens_per_s: float | None
    compute_tokens_per_s: float | None
    """Compute speed at a context of zero (the per-token term alone)."""


Fit = tuple[float, ...]
"""Coefficients of a fit, one per feature of the full model (a dropped term is zero)."""


def _solve(rows: Sequence[Sequence[float]], values: Sequence[float]) -> list[float] | None:
    """Least squares by the normal equations; None when the features are not independent.

    Each feature is scaled to a largest magnitude of one first, so that a count of tokens
    and a product of two counts can be told apart without losing precision.
    """
    size = len(rows[0])
    scales = [max(abs(row[i]) for row in rows) or 1.0 for i in range(size)]
    scaled = [[row[i] / scales[i] for i in range(size)] for row in rows]
    matrix = [
        [sum(row[i] * row[j] for row in scaled) for j in range(size)]
        + [sum(row[i] * value for row, value in zip(scaled, values, strict=True))]
        for i in range(size)
    ]
    trace = sum(matrix[i][i] for i in range(size))
    for col in range(size):
        pivot = max(range(col, size), key=lambda r: abs(matrix[r][col]))
        if abs(matrix[pivot][col]) <= 1e-9 * trace:
            return None
        matrix[col], matrix[pivot] = matrix[pivot], matrix[col]
        for r in range(size):
            if r != col:
                factor = matrix[r][col] / matrix[col][col]
                matrix[r] = [a - factor * b for a, b in zip(matrix[r], matrix[col], strict=True)]
    return [matrix[i][size] / matrix[i][i] / scales[i] for i in range(size)]


def fit_nonnegative(
    features: Sequence[Sequence[float]], values: Sequence[float], fallbacks: Sequence[Fit]
) -> Fit | None:
    """Fit ``values`` on ``features`` with the first term mask of ``fallbacks`` that works.

    Each mask says which features a candidate model keeps (1) or drops (0); a candidate
    works when its kept features are independent on the samples and every coefficient
    comes out non-negative. Returns the full-length coefficients, or None if none works.
    """
    for mask in fallbacks:
        kept = [i for i, keep in enumerate(mask) if keep]
        rows = [[row[i] for i in kept] for row in features]
        solved = _solve(rows, values) if len(rows) >= len(kept) else None
        if solved is not None and all(c >= 0 and math.isfinite(c) for c in solved):
            coefficients = [0.0] * len(mask)
            for i, c in zip(kept, solved, strict=True):
                coefficients[i] = c
            return tuple(coefficients)
    return None


def _compute_features(tokens: int, start: int) -> tuple[float, float, float]:
    return 1.0, float(tokens), tokens * (start + tokens / 2)


_COMPUTE_FALLBACKS: tuple[Fit, ...] = ((1, 1, 1), (1, 1, 0), (0, 1, 1), (0, 1, 0))
_READ_FALLBACKS: tuple[Fit, ...] = ((1, 1), (1, 0))


@dataclass
class _Link:
    """The reads from one decode engine: recent samples, their fit, recomputes since a read,
    and whether its first read (which includes NIXL's handshake) was seen."""

    samples: deque[tuple[int, float]]
    fit: Fit | None = None
    recomputes: int = 0
    handshaken: bool = False


def _fit_reads(samples: Iterable[tuple[int, float]]) -> Fit | None:
    rows = list(samples)
    return fit_nonnegative(
        [(1.0, float(tokens)) for tokens, _ in rows], [s for _, s in rows], _READ_FALLBACKS
    )


class CostModel:
    """Running estimates of prefill's compute and D->P read times; decides each read.

    Reads are estimated per decode engine (links differ: another rack, zone or fabric), and
    from all of them pooled for an engine with no sample of its own yet.
    """

    def __init__(
        self,
        *,
        window: int = SAMPLE_WINDOW,
        probe_every: int = PROBE_EVERY,
        max_links: int = MAX_LINKS,
    ) -> None:
        self._window = window
        self._computes: deque[tuple[int, int, float]] = deque(maxlen=window)
        self._reads: deque[tuple[int, float]] = deque(maxlen=window)
        self._links: OrderedDict[str, _Link] = OrderedDict()
        self._max_links = max_links
        self._probe_every = probe_every
        self._compute_fit: Fit | None = None
        self._read_fit: Fit | None = None

    def record_compute(self, tokens: int, start: int, seconds: float) -> None:
        """One prefill: ``tokens`` computed after ``start`` cached or read ones."""
        if tokens > 0 and seconds > 0:
            self._computes.append((tokens, start, seconds))
            self._compute_fit = fit_nonnegative(
                [_compute_features(t, s) for t, s, _ in self._computes],
                [seconds for *_, seconds in self._computes],
                _COMPUTE_FALLBACKS,
            )

    def record_read(self, tokens: int, seconds: float, engine: str) -> None:
        """One D->P read of ``tokens`` from decode ``engine``, from its start to the step that
        reported it done. A link's first read is no sample: it includes NIXL's handshake, a
        one-time cost."""
        link = self._link(engine)
        if not link.handshaken:
            link.handshaken = True
        elif tokens > 0 and seconds > 0:
            self._reads.append((tokens, seconds))
            self._read_fit = _fit_reads(self._reads)
            link.samples.append((tokens, seconds))
            link.fit = _fit_reads(link.samples)

    def _link(self, engine: str) -> _Link:
        link = self._links.get(engine)
        if link is None:
            link = self._links[engine] = _Link(deque(maxlen=self._window))
            if len(self._links) > self._max_links:
                self._links.popitem(last=False)
        self._links.move_to_end(engine)
        return link

    def read_seconds(self, tokens: int, engine: str | None = None) -> float | None:
        """Estimated time to read ``tokens`` from decode ``engine`` (None: any engine)."""
        link = self._links.get(engine) if engine is not None else None
        fit = link.fit if link is not None and link.fit is not None else self._read_fit
        if fit is None:
            return None
        fixed, per_token = fit
        return fixed + per_token * tokens

    def compute_seconds(self, tokens: int, start: int) -> float | None:
        """Estimated time ``tokens`` add to a prefill that starts after ``start`` tokens."""
        if self._compute_fit is None:
            return None
        _, per_token, attention = self._compute_fit
        return per_token * tokens + attention * tokens * (start + tokens / 2)

    def decide(self, tokens: int, start: int, engine: str) -> Decision:
        """Read ``tokens`` of decode ``engine``'s KV (after ``start`` local ones), or recompute?"""
        read_s = self.read_seconds(tokens, engine)
        compute_s = self.compute_seconds(tokens, start)
        link = self._link(engine)
        if read_s is None or compute_s is None:
            choice = Choice.UNMEASURED
        elif read_s < compute_s:
            choice = Choice.READ
        elif link.recomputes + 1 >= self._probe_every:
            choice = Choice.PROBE
        else:
            choice = Choice.RECOMPUTE
        link.recomputes = 0 if choice.reads else link.recomputes + 1
        return Decision(choice, read_s, compute_s)

    def estimates(self) -> Estimates:
        """The fitted costs as figures a person reads."""
        read, compute = self._read_fit, self._compute_fit
        return Estimates(
            read_fixed_s=read[0] if read else None,
            read_tokens_per_s=_rate(read[1]) if read else None,
            compute_tokens_per_s=_rate(compute[1]) if compute else None,
        )


def _rate(seconds_per_token: float) -> float | None:
    return 1 / seconds_per_token if seconds_per_token > 0 else None
