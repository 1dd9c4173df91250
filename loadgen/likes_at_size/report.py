"""The report of the likes-at-size benchmark: its result and the printed lines.

The run's document (see the package's `__main__` docstring) becomes a `BenchResult`: the headline
figures, compared with the seed's function at the same size and the freshness limit, the curve's
points for make bench's plot, and the document itself in `extra`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from loadgen.common.report import BenchResult, Comparison, Results, json_value

SEED_TARGET = 6.0  # the target: sustained likes/s at size >= 6x the seed's durable function at that size
FRESHNESS_LIMIT_MS = 1000.0

FIGURES = (
    ("likes/s, first point of the curve", "likes_per_s_first", ",.0f"),
    ("likes/s sustained at full size (the fill's last tenth)", "likes_per_s_at_size", ",.0f"),
    ("likes/s over the whole fill", "likes_per_s_fill", ",.0f"),
    ("freshness p50 at half the last rate (ms)", "freshness_p50", ",.0f"),
    ("freshness p99 at half the last rate (ms)", "freshness_p99", ",.0f"),
    ("seed per-event f_obj at the same size (events/s)", "seed_per_event", ",.0f"),
    ("peak PSS of the runner (MiB)", "peak_pss_mib", ",.0f"),
    ("state and views, tables + indexes (GiB)", "storage_gib", ",.2f"),
    ("follows through their runner (follows/s)", "follows_per_s", ",.0f"),
    ("producer, backlog before the runner starts (events/s)", "producer_events_per_s", ",.0f"),
)
# The phase whose failure leaves a figure missing (the others come from the fill, "run").
PHASE_OF = {"freshness_p50": "freshness", "freshness_p99": "freshness", "seed_per_event": "seed_per_event"}
COMPARISONS = (
    Comparison(
        "sustained likes/s at full size / seed per-event at that size",
        "likes_per_s_at_size",
        reference="seed_per_event",
        target=SEED_TARGET,
    ),
    Comparison("freshness p99 at half the sustained rate", "freshness_p99", limit=FRESHNESS_LIMIT_MS, unit="ms"),
)


def figures_of(doc: Mapping[str, Any]) -> Results:
    """The headline figures of a run's document, with why each missing one is missing."""
    results = Results()
    curve = doc.get("curve") or []
    values = {
        "likes_per_s_first": curve[0]["likes_per_s"] if curve else None,
        "likes_per_s_at_size": doc.get("fill", {}).get("sustained_likes_per_s"),
        "likes_per_s_fill": doc.get("fill", {}).get("likes_per_s"),
        "freshness_p50": doc.get("freshness_ms", {}).get("p50"),
        "freshness_p99": doc.get("freshness_ms", {}).get("p99"),
        "seed_per_event": doc.get("seed_per_event"),
        "peak_pss_mib": doc.get("peak_pss_mib"),
        "storage_gib": doc["sizes"]["total_bytes"] / 2**30 if "sizes" in doc else None,
        "follows_per_s": doc.get("follows", {}).get("follows_per_s"),
        "producer_events_per_s": doc.get("producer", {}).get("events_per_s"),
    }
    errors = doc.get("errors", {})
    for key, value in values.items():
        if value is not None:
            results.values[key] = float(value)
        else:
            phase = PHASE_OF.get(key, "run")
            results.notes[key] = f"failed: {errors[phase][:50]}" if phase in errors else "(not run)"
    return results


def result(doc: Mapping[str, Any]) -> BenchResult:
    """The run as a `BenchResult`: its headline figures, the curve for the plot, the whole document kept."""
    doc = orjson.loads(orjson.dumps(doc, default=json_value))
    points = [
        {"likes_in_state": p["likes_in_state"], "likes_per_second": p["likes_per_s"]} for p in doc.get("curve", [])
    ]
    figures = BenchResult.of("likes_at_size", figures_of(doc), FIGURES, comparisons=list(COMPARISONS))
    figures.header = lines(doc)
    figures.series = {"likes_at_size": {"points": points, "date": doc.get("date")}}
    figures.extra = doc
    return figures


def _gib(n: float) -> str:
    return f"{n / 2**30:,.2f} GiB" if n >= 2**30 else f"{n / 2**20:,.0f} MiB"


def lines(doc: Mapping[str, Any]) -> list[str]:
    """The report's lines before the figures: the workload, the curve, the fill, the sizes, the errors."""
    settings = doc.get("settings", {})
    w = settings.get("workload", {})
    out = [
        f"\nlikes at size ({doc.get('machine')})",
        f"  workload: users 1..{w.get('users', 0):,}, objects random_gaussian(1, {w.get('objects', 0):,},"
        f" {w.get('gaussian')}), {w.get('unlike_fraction', 0):.0%} unlikes, {w.get('duplicate_fraction', 0):.0%}"
        f" repeated likes; target {settings.get('likes', 0):,} likes, {settings.get('follows', 0):,} follows;"
        f" {settings.get('workers', 1)} stream runner(s) on the likes, started once the whole backlog was"
        f" produced; wall {doc.get('wall_s', 0):,.0f}s",
    ]
    if curve := doc.get("curve"):
        out.append("\n  likes in state   likes/s   state +/s   runner PSS   cores runner/postgres/machine   load1")
        for p in curve:
            cores = p.get("cores", {})
            runners = sum(v for k, v in cores.items() if k.startswith("pipeline"))  # pipeline, pipeline2, ...
            out.append(
                f"  {p['likes_in_state']:>14,} {p['likes_per_s']:>9,.0f} {p['state_growth_per_s']:>11,.0f}"
                f" {p['pss_mib']:>9,.0f} MiB   {runners:.2f} / {cores.get('postgres', 0):.2f}"
                f" / {cores.get('machine', 0):.2f}{'':>14}{p['load1']:>6.2f}"
            )
    if fill := doc.get("fill"):
        out.append(
            f"\n  fill: {fill['events']:,} events in {fill['seconds']:,.0f}s after {fill['startup_s']:.1f}s start-up;"
            f" state {fill['likes_in_state']:,} likes, object_likes {fill['likes_in_object_likes']:,}, the events"
            f" leave {fill['expected_likes']:,}; runner PSS {fill['pss_mib_first']:,.0f}"
            f" -> {fill['pss_mib_last']:,.0f} MiB"
        )
    if fresh := doc.get("freshness_ms"):
        out.append(
            f"  freshness at {fresh['rate']:,.0f} likes/s for {fresh['seconds']}s: p50 {fresh['p50']:,.0f} ms,"
            f" p99 {fresh['p99']:,.0f} ms, max {fresh['max']:,.0f} ms ({fresh['markers']:,} markers)"
        )
    if sizes := doc.get("sizes"):
        out.append("\n  table                                      total      indexes   live rows")
        for name, t in [*sizes["tables"].items(), ("all", {**sizes, "live_rows": None})]:
            live = f"{t['live_rows']:>11,}" if t["live_rows"] is not None else ""
            out.append(f"  {name:<38} {_gib(t['total_bytes']):>10} {_gib(t['index_bytes']):>11} {live}".rstrip())
    out += [f"  FAILED {phase}: {error}" for phase, error in doc.get("errors", {}).items()]
    return out
