"""The PNG plots of BENCHMARKS.md, drawn with matplotlib from the samples the benchmarks wrote.

- `drain_throughput.png`: records/s over time during each drain of a backlog (`series.drains` of any
  benchmark: `[seconds since the process started, records done]` points, polled every 50 ms);
- `freshness.png`: the distribution of marker latencies under steady load (`series.freshness_ms`);
- `audit_lag.png`: produce -> searchable latency of each marker over the lag phase, with the
  puller's own seconds behind (`series.audit_lag` of the audit benchmark);
- `likes_at_size.png`: likes/s against the likes already in the state, from `likes_at_size.json` in
  the results folder (`python -m loadgen.likes_at_size`, a run of its own or of the suite).

A plot without data is not drawn; its entry says why, and a stale PNG of an earlier run is removed
so that it cannot be committed by mistake. Figures are built with `matplotlib.figure.Figure`
(no pyplot, no display, no global state).
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Mapping, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import orjson
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator

from loadgen.common.freshness import percentile
from loadgen.suite.markdown import Plot

DPI = 110
LIKES_AT_SIZE = "likes_at_size"  # <results>/likes_at_size.json
# The curve measured before the changes of issue 14 (460c6f9, shared_buffers=1GB), drawn beside each new one.
LIKES_AT_SIZE_BASELINE = Path(__file__).resolve().parents[2] / "docs" / "bench" / "likes_at_size-baseline.json"


def rate_over_time(
    points: Sequence[Sequence[float]], window: float | None = None, steps: int = 200
) -> list[tuple[float, float]]:
    """Records/s over a trailing window from cumulative `(t, done)` samples: `(t, rate)` at `steps` times.

    A pipeline commits in batches (tens of thousands of records at once), so the count moves in
    steps; a window spanning about two commits (default: twice the median time between commits, at
    least 1 s and a twentieth of the run) turns them into a rate a reader can follow. The count at
    any time is the last sample at or before it; the divisor is always the window (the first window
    of the run reads low rather than a lone commit reading high).
    """
    if len(points) < 2:
        return []
    times = [float(p[0]) for p in points]
    counts = [float(p[1]) for p in points]
    start, end = times[0], times[-1]
    if end <= start:
        return []
    commits = [t for t, before, after in zip(times[1:], counts, counts[1:], strict=False) if after != before]
    gaps = [b - a for a, b in pairwise(commits)]
    width = window or max(1.0, (end - start) / 20, 2 * statistics.median(gaps) if gaps else 0.0)

    def done_at(t: float) -> float:
        return counts[max(bisect.bisect_right(times, t) - 1, 0)]

    out = []
    for i in range(steps + 1):
        t = start + (end - start) * i / steps
        out.append((t, (done_at(t) - done_at(max(start, t - width))) / width))
    return out


def timed_rate(drain: Mapping[str, Any]) -> float | None:
    """The drain's average rate from its first commit to its end (the headline's definition)."""
    points, first = drain.get("points") or [], float(drain.get("first_commit") or 0.0)
    after = [p for p in points if p[0] >= first]
    if len(after) < 2 or after[-1][0] <= after[0][0]:
        return None
    return (after[-1][1] - after[0][1]) / (after[-1][0] - after[0][0])


def _thousands(ax: Axes) -> None:
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))


def _save(figure: Figure, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=DPI, bbox_inches="tight")


def plot_drains(drains: Mapping[str, Mapping[str, Any]], path: Path) -> None:
    """One panel per drain: records/s over time, the start of the timed part, the timed average."""
    columns = 2 if len(drains) > 1 else 1
    rows = (len(drains) + columns - 1) // columns
    figure = Figure(figsize=(6.4 * columns, 3.2 * rows), layout="constrained")
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    for ax, drain in zip(axes, drains.values(), strict=False):
        points = drain.get("points") or []
        series = rate_over_time(points)
        if series:
            ax.plot(
                [t for t, _ in series], [r for _, r in series], color="tab:blue", label="records/s (trailing window)"
            )
            done = ax.twinx()
            done.plot([p[0] for p in points], [p[1] for p in points], color="tab:gray", alpha=0.5, linewidth=1)
            done.set_ylabel("records committed (gray)", fontsize=8, color="tab:gray")
            done.set_ylim(bottom=0)
            done.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
            done.tick_params(axis="y", labelsize=7, colors="tab:gray")
        first = float(drain.get("first_commit") or 0.0)
        if first:
            ax.axvline(first, color="tab:gray", linestyle="--", linewidth=1, label="first commit (clock starts)")
        for name, at in (drain.get("marks") or {}).items():
            ax.axvline(float(at), color="tab:orange", linestyle=":", linewidth=1.2, label=name)
        average = timed_rate(drain)
        if average:
            ax.axhline(average, color="tab:red", linestyle=":", linewidth=1, label=f"timed average {average:,.0f}/s")
        ax.set_title(str(drain.get("label", "")), fontsize=9)
        ax.set_xlabel("seconds since the process started")
        ax.set_ylabel("records/s")
        ax.set_ylim(bottom=0)
        _thousands(ax)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    for ax in axes[len(drains) :]:
        ax.set_visible(False)
    _save(figure, path)


def plot_freshness(series: Mapping[str, Mapping[str, Any]], path: Path) -> None:
    """Histogram of each series' latencies (ms) beside their cumulative distributions, p50 and p99 marked."""
    figure = Figure(figsize=(12.8, 3.8), layout="constrained")
    hist, cdf = figure.subplots(1, 2)
    for name, entry in series.items():
        values = [float(v) for v in entry.get("values") or []]
        if not values:
            continue
        p50, p99 = statistics.median(values), percentile(values, 99)
        label = f"{entry.get('label', name)} (n={len(values)}, p50 {p50:,.0f} ms, p99 {p99:,.0f} ms)"
        hist.hist(values, bins=40, alpha=0.55, label=label)
        cdf.ecdf(values, label=label)
        for q, style in ((p50, "--"), (p99, ":")):
            cdf.axvline(q, linestyle=style, linewidth=0.8, color=cdf.lines[-1].get_color())
    hist.set_title("freshness: latency of marker events under steady load", fontsize=9)
    hist.set_xlabel("ms from produce (or COMMIT) until visible")
    hist.set_ylabel("markers")
    hist.yaxis.set_major_locator(MaxNLocator(integer=True))
    cdf.set_title("cumulative share of markers (dashed p50, dotted p99)", fontsize=9)
    cdf.set_xlabel("ms")
    cdf.set_ylabel("share visible within")
    cdf.set_ylim(0, 1.01)
    for ax in (hist, cdf):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    _save(figure, path)


def plot_audit_lag(lag: Mapping[str, Any], path: Path, limit_s: float | None = 5.0) -> None:
    """Each marker's produce -> searchable latency at its send time, and the puller's own seconds behind."""
    figure = Figure(figsize=(9.6, 3.8), layout="constrained")
    ax = figure.subplots()
    markers = lag.get("markers") or []
    if markers:
        ax.plot(
            [t for t, _ in markers], [s for _, s in markers], ".", markersize=4, label="marker: produce -> searchable"
        )
    behind = [row for row in lag.get("puller_behind") or [] if row[1] is not None]
    if behind:
        ax.plot([r[0] for r in behind], [r[1] for r in behind], "-", linewidth=1.2, label="puller's seconds_behind")
    if limit_s:
        ax.axhline(limit_s, color="tab:red", linestyle=":", linewidth=1, label=f"target: under {limit_s:g} s")
    ax.set_title(f"audit lag over the lag phase, {lag.get('label', '')}", fontsize=9)
    ax.set_xlabel("seconds since the lag phase began")
    ax.set_ylabel("seconds")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    _save(figure, path)


def curve_points(document: Mapping[str, Any] | None) -> list[tuple[float, float]]:
    """(likes in state, likes/s) points of a likes-at-size document; none when there is no document.

    Its `series.likes_at_size.points`, or `points` in the documents of runs before the one output
    protocol (the committed baseline's): `[{"likes_in_state": N, "likes_per_second": R}, ...]`.
    """
    document = document or {}
    points = (document.get("series") or {}).get(LIKES_AT_SIZE, {}).get("points") or document.get("points") or []
    return sorted((float(p["likes_in_state"]), float(p["likes_per_second"])) for p in points)


def likes_at_size_document(results: Path) -> dict[str, Any] | None:
    """The likes-at-size result a run left in `results` (a fill of 20 M likes is a run of its own), if any."""
    path = results / f"{LIKES_AT_SIZE}.json"
    return orjson.loads(path.read_bytes()) if path.is_file() else None


def load_likes_at_size(results: Path) -> list[tuple[float, float]] | None:
    """The curve of the likes-at-size result in `results`; None while there is none."""
    document = likes_at_size_document(results)
    return None if document is None else curve_points(document)


def likes_at_size_source(results: Path) -> str:
    """Which run the curve comes from: its commit and date."""
    document = likes_at_size_document(results) or {}
    commit = document.get("commit")
    date = (document.get("series") or {}).get(LIKES_AT_SIZE, {}).get("date") or document.get("date")
    return f" (`python -m loadgen.likes_at_size` at {commit}, {date})" if commit and date else ""


def baseline_points(path: Path = LIKES_AT_SIZE_BASELINE) -> list[tuple[float, float]]:
    """The committed baseline curve's points; none when it is not there."""
    return curve_points(orjson.loads(path.read_bytes()) if path.is_file() else None)


def plot_likes_at_size(
    points: Sequence[tuple[float, float]], path: Path, baseline: Sequence[tuple[float, float]] = ()
) -> None:
    """Likes/s against the likes already in the state, on a log scale of state size; `baseline` beside it."""
    figure = Figure(figsize=(8.0, 3.8), layout="constrained")
    ax = figure.subplots()
    ax.plot([n for n, _ in points], [r for _, r in points], "o-", markersize=4, label="this run")
    if baseline:
        ax.plot(
            [n for n, _ in baseline],
            [r for _, r in baseline],
            "s--",
            markersize=3,
            color="grey",
            label="baseline (460c6f9, shared_buffers=1GB)",
        )
        ax.legend(fontsize=7)
    ax.set_xscale("log")
    ax.set_title("likes pipeline: sustained likes/s as the state grows", fontsize=9)
    ax.set_xlabel("likes in the state")
    ax.set_ylabel("likes/s")
    ax.set_ylim(bottom=0)
    _thousands(ax)
    ax.grid(alpha=0.3, which="both")
    _save(figure, path)


def make_plots(samples: Mapping[str, Mapping[str, Any]], out: Path, results: Path) -> list[Plot]:
    """Every plot the run's samples allow (each benchmark's `series`), into `out`; pending ones say why."""
    drains: dict[str, Any] = {}
    freshness: dict[str, Any] = {}
    lag = None
    for series in samples.values():
        drains |= series.get("drains") or {}
        freshness |= series.get("freshness_ms") or {}
        lag = series.get("audit_lag") or lag
    plots = []

    def add(title: str, name: str, data: Any, draw: Any, note: str, missing: str) -> None:
        path = out / f"{name}.png"
        if data:
            draw(data, path)
            plots.append(Plot(title, path, note))
        else:
            path.unlink(missing_ok=True)
            plots.append(Plot(title, None, f"Pending: {missing}"))

    add(
        "Throughput during a drain",
        "drain_throughput",
        drains,
        plot_drains,
        "Records/s in short windows while each pipeline works off a backlog (offsets or counts polled every"
        " 50 ms); the dashed line is the first commit, where the headline figure's clock starts.",
        "no benchmark with a drain ran successfully in this run.",
    )
    add(
        "Freshness",
        "freshness",
        freshness,
        plot_freshness,
        "How long a marker event takes to become visible while the pipeline runs under a steady load"
        " (likes: half the measured throughput; CDC: rows at a fixed rate).",
        "neither the social nor the cdc benchmark's freshness phase ran in this run.",
    )
    add(
        "Audit lag over time",
        "audit_lag",
        lag,
        plot_audit_lag,
        "Each marker event from produce until a search finds it, at half the puller's peak rate, with the"
        " puller's own view of how far behind it is.",
        "the audit benchmark's lag phase did not run in this run.",
    )
    add(
        "Likes per second as the state grows",
        LIKES_AT_SIZE,
        load_likes_at_size(results),
        lambda points, path: plot_likes_at_size(points, path, baseline_points()),
        "Sustained likes/s of the likes pipeline against the number of likes already in its state"
        + likes_at_size_source(results)
        + ", beside the baseline curve measured before issue 14's changes (docs/bench/likes_at_size-baseline.json).",
        f"no {LIKES_AT_SIZE}.json in the results folder yet; `python -m loadgen.likes_at_size` writes it.",
    )
    return plots
