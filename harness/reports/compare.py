"""Compare replay results side by side: ratios against the first run, and plots.

``compare(paths, out_dir)`` reads results files (``results.py``), computes each run's key
metrics and their ratio to the first run (the baseline), and writes three figures as PNG
and SVG: latency/TTFT distributions (CDF), TTFT per request in manifest order, and
reused vs computed prompt tokens (stacked bars, with the ideal when known).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure  # Figure + savefig uses the Agg canvas; no pyplot state

from harness.reports.results import RunResult, load_results

#: (key, heading, lower is better) in table order.
METRICS: tuple[tuple[str, str, bool], ...] = (
    ("ttft_p50", "TTFT p50 s", True),
    ("ttft_mean", "TTFT mean s", True),
    ("latency_p50", "lat p50 s", True),
    ("latency_mean", "lat mean s", True),
    ("latency_p95", "lat p95 s", True),
    ("computed_tokens", "computed tok", True),
    ("computed_over_ideal", "comp/ideal", True),
    ("requests_per_s", "req/s", False),
    ("output_tokens_per_s", "out tok/s", False),
)


def run_metrics(run: RunResult) -> dict[str, float | None]:
    """The compared metrics of one run, from its stored summary."""
    s = run.summary
    ideal = s.get("ideal") or {}
    return {
        "ttft_p50": (s.get("ttft_s") or {}).get("p50"),
        "ttft_mean": (s.get("ttft_s") or {}).get("mean"),
        "latency_p50": (s.get("latency_s") or {}).get("p50"),
        "latency_mean": (s.get("latency_s") or {}).get("mean"),
        "latency_p95": (s.get("latency_s") or {}).get("p95"),
        "computed_tokens": (s.get("tokens") or {}).get("computed"),
        "computed_over_ideal": ideal.get("computed_over_ideal", ideal.get("computed_over_ideal_estimate")),
        "requests_per_s": (s.get("throughput") or {}).get("requests_per_s"),
        "output_tokens_per_s": (s.get("throughput") or {}).get("output_tokens_per_s"),
    }


def ratio(value: float | None, base: float | None) -> float | None:
    """value / base, or None when either is unknown or the base is zero."""
    if value is None or base is None or base == 0:
        return None
    return value / base


@dataclass
class Comparison:
    """Labels, per-run metrics, ratios to the first run, and the files written."""

    labels: list[str]
    metrics: list[dict[str, float | None]]
    ratios: list[dict[str, float | None]]
    plots: list[Path] = field(default_factory=list)

    def table(self) -> str:
        """A plain-text table: each metric's value, then its ratio to the first run (x)."""
        headers = ["run", *(heading for _, heading, _ in METRICS)]
        rows = []
        for label, values, ratios in zip(self.labels, self.metrics, self.ratios):
            cells = [label]
            for key, _, _ in METRICS:
                value, r = values[key], ratios[key]
                text = "-" if value is None else (f"{value:.0f}" if key == "computed_tokens" else f"{value:.3g}")
                cells.append(text if r is None else f"{text} ({r:.2f}x)")
            rows.append(cells)
        widths = [max(len(row[i]) for row in [headers, *rows]) for i in range(len(headers))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [headers, *rows]]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)


def _labels(runs: Sequence[RunResult], paths: Sequence[Path]) -> list[str]:
    labels: list[str] = []
    for run, path in zip(runs, paths):
        label = run.metadata.get("label") or path.stem
        if label in labels:
            label = f"{label}#{len(labels) + 1}"
        labels.append(label)
    return labels


def _save(fig: Figure, out_dir: Path, stem: str) -> list[Path]:
    written = []
    for suffix in ("png", "svg"):
        path = out_dir / f"{stem}.{suffix}"
        fig.savefig(path, dpi=120, bbox_inches="tight")
        written.append(path)
    return written


def _cdf_figure(runs: Sequence[RunResult], labels: Sequence[str]) -> Figure:
    fig = Figure(figsize=(11, 4.2))
    for ax, attr, title in ((fig.add_subplot(1, 2, 1), "ttft_s", "Time to first token"),
                            (fig.add_subplot(1, 2, 2), "latency_s", "End-to-end latency")):
        for run, label in zip(runs, labels):
            values = np.sort([getattr(r, attr) for r in run.requests if r.ok and getattr(r, attr) is not None])
            if len(values):
                xs = np.concatenate([values[:1], values])  # start the curve at 0
                ys = np.arange(0, len(values) + 1) / len(values)
                ax.step(xs, ys, where="post", label=label)
        ax.set_title(title)
        ax.set_xlabel("seconds")
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    return fig


def _ttft_order_figure(runs: Sequence[RunResult], labels: Sequence[str]) -> Figure:
    fig = Figure(figsize=(11, 4.2))
    ax = fig.add_subplot(1, 1, 1)
    for run, label in zip(runs, labels):
        points = [(r.index, r.ttft_s) for r in run.requests if r.ok and r.ttft_s is not None]
        if points:
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker=".", linewidth=0.8, label=label)
    ax.set_title("TTFT per request (manifest order)")
    ax.set_xlabel("request index")
    ax.set_ylabel("TTFT (s)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return fig


def _tokens_figure(runs: Sequence[RunResult], labels: Sequence[str]) -> Figure:
    fig = Figure(figsize=(max(5.0, 1.4 * len(runs) + 2), 4.2))
    ax = fig.add_subplot(1, 1, 1)
    x = np.arange(len(runs))
    tokens = [run.summary.get("tokens") or {} for run in runs]
    cached = np.array([t.get("cached") or 0 for t in tokens])
    computed = np.array([t.get("computed") or 0 for t in tokens])
    ax.bar(x, computed, label="computed", color="#d95f02")
    ax.bar(x, cached, bottom=computed, label="reused (cached)", color="#1b9e77")
    for i, run in enumerate(runs):
        ideal = run.summary.get("ideal") or {}
        if ideal.get("unit") == "tokens" and ideal.get("ideal_computed_tokens") is not None:
            legend: dict[str, Any] = {"label": "ideal computed"} if i == 0 else {}
            ax.hlines(ideal["ideal_computed_tokens"], i - 0.4, i + 0.4, colors="black", linestyles="dashed", **legend)
    ax.set_xticks(x, labels, rotation=20, ha="right")
    ax.set_ylabel("prompt tokens")
    ax.set_title("Prompt tokens: reused vs computed")
    ax.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3)
    return fig


def compare(paths: Sequence[str | Path], out_dir: str | Path | None = None) -> Comparison:
    """Compare results files; write plots to ``out_dir`` when given."""
    if len(paths) < 1:
        raise ValueError("compare needs at least one results file")
    files = [Path(p) for p in paths]
    runs = [load_results(p) for p in files]
    labels = _labels(runs, files)
    metrics = [run_metrics(run) for run in runs]
    base = metrics[0]
    ratios = [{key: ratio(m[key], base[key]) for key, _, _ in METRICS} for m in metrics]
    comparison = Comparison(labels=labels, metrics=metrics, ratios=ratios)
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        comparison.plots += _save(_cdf_figure(runs, labels), out, "latency_cdf")
        comparison.plots += _save(_ttft_order_figure(runs, labels), out, "ttft_per_request")
        comparison.plots += _save(_tokens_figure(runs, labels), out, "prompt_tokens")
    return comparison
