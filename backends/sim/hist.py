"""The simulator's hot-path histograms and their bucket bounds (vLLM 0.26's).

A :class:`Hist` observation is a bisect and two additions, no lock: everything runs on the event
loop. ``backends.sim.metrics`` turns them into metric families when ``/metrics`` is scraped.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

# Bucket bounds as vLLM 0.26 declares them (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
REQUEST_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
LAG_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class Hist:
    """A histogram cheap enough to observe once per generated token."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def observe_many(self, value: float, n: int) -> None:
        self.counts[bisect_left(self.bounds, value)] += n
        self.sum += value * n

    @property
    def count(self) -> int:
        return sum(self.counts)

    def buckets(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        acc = 0
        for bound, n in zip(self.bounds, self.counts, strict=False):
            acc += n
            out.append((repr(float(bound)), acc))
        out.append(("+Inf", acc + self.counts[-1]))
        return out
