"""Anomaly detection on an hourly series: robust z-scores against a reference window.

The first `baseline` samples are the reference (commissioning-like period): its median is
the expected level and 1.4826 x MAD its spread (robust to a stray spike inside it). A point
is anomalous when |z| > threshold. Anomalous points closer than `merge_gap` samples are
merged into one episode; an episode spanning at most 3 samples is a spike, a longer one a
shift (a step or a drift). A lone anomalous sample must clear `isolated_factor` x threshold:
with a few hundred samples per week a 4-sigma noise point is expected now and then, while a
real spike stands far above it (and a real shift produces many points). A fixed reference, unlike
a rolling window, does not learn a slow
drift as the new normal, so drifts stay visible until they end.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

MAD_TO_SIGMA = 1.4826


@dataclass(frozen=True)
class Episode:
    start: int  # index of the first anomalous sample
    end: int  # index of the last anomalous sample (inclusive)
    points: int  # anomalous samples in the episode
    peak_index: int
    peak_value: float
    peak_z: float

    @property
    def kind(self) -> str:
        return "spike" if self.end - self.start + 1 <= 3 else "shift"

    @property
    def direction(self) -> str:
        return "up" if self.peak_z > 0 else "down"


@dataclass(frozen=True)
class Reference:
    median: float
    sigma: float


def reference(values: list[float], baseline: int) -> Reference:
    window = values[:baseline]
    if len(window) < 3:
        raise ValueError("the reference window needs at least 3 samples")
    median = statistics.median(window)
    mad = statistics.median(abs(v - median) for v in window)
    # A flat reference (MAD 0) would make every wiggle infinite; fall back to the stdev.
    sigma = MAD_TO_SIGMA * mad or statistics.pstdev(window) or 1e-9
    return Reference(median, sigma)


def detect(values: list[float], baseline: int = 48, threshold: float = 4.0,
           merge_gap: int = 3, isolated_factor: float = 1.5) -> tuple[Reference, list[Episode]]:
    """Return the reference and the anomalous episodes of `values`, in time order."""
    ref = reference(values, baseline)
    flagged = [(i, (v - ref.median) / ref.sigma) for i, v in enumerate(values)]
    flagged = [(i, z) for i, z in flagged if abs(z) > threshold]

    episodes: list[list[tuple[int, float]]] = []
    for index, z in flagged:
        if episodes and index - episodes[-1][-1][0] <= merge_gap:
            episodes[-1].append((index, z))
        else:
            episodes.append([(index, z)])

    result = []
    for points in episodes:
        peak_index, peak_z = max(points, key=lambda p: abs(p[1]))
        if len(points) == 1 and abs(peak_z) < isolated_factor * threshold:
            continue
        result.append(Episode(start=points[0][0], end=points[-1][0], points=len(points),
                              peak_index=peak_index, peak_value=values[peak_index],
                              peak_z=round(peak_z, 1)))
    return ref, result


def slope(values: list[float]) -> float:
    """Least-squares slope per sample (0 for fewer than two samples)."""
    n = len(values)
    if n < 2:
        return 0.0
    mean_x = (n - 1) / 2
    mean_y = sum(values) / n
    covariance = sum((i - mean_x) * (v - mean_y) for i, v in enumerate(values))
    variance = sum((i - mean_x) ** 2 for i in range(n))
    return covariance / variance
