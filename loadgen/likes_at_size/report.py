"""The report of the likes-at-size benchmark: its result and the printed lines.

The run's document (see the package's `__main__` docstring) becomes a `BenchResult`: the headline
figures, compared with the seed's function at the same size and the freshness limit, the curve's
points for make bench's plot, and the document itself in `extra`.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

import orjson

from loadgen.common.report import BenchResult, Comparison, Results

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


def load_summary(samples: Sequence[Sequence[float]]) -> dict[str, Any]:
    """The load average during the fill: min, median and max of the 1-minute figure, and every sample."""
    ones = [s[1] for s in samples]
    if not ones:
        return {"samples": []}
    return {
        "min1": min(ones),
        "median1": round(statistics.median(ones), 2),
        "max1": max(ones),
        "samples": [list(s) for s in samples],
    }


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
    doc = orjson.loads(orjson.dumps(doc, default=_json_value))
    points = [
        {"likes_in_state": p["likes_in_state"], "likes_per_second": p["likes_per_s"]} for p in doc.get("curve", [])
    ]
    figures = BenchResult.of("likes_at_size", figures_of(doc), FIGURES, comparisons=list(COMPARISONS))
    figures.header = lines(doc)
    figures.series = {"likes_at_size": {"points": points, "date": doc.get("date")}}
    figures.extra = doc
    return figures


def _json_value(value: object) -> object:
    """What orjson cannot write itself: PostgreSQL numerics, paths."""
    if isinstance(value, Decimal):
        return float(value)
    return str(value)


def _gib(n: float) -> str:
    return f"{n / 2**30:,.2f} GiB" if n >= 2**30 else f"{n / 2**20:,.0f} MiB"


def lines(doc: Mapping[str, Any]) -> list[str]:
    """The report's lines before the figures: settings, curve, phases, sizes, errors."""
    out: list[str] = []
    settings = doc.get("settings", {})
    workload = settings.get("workload", {})
    out.append(f"\nlikes at size ({doc.get('machine')})")
    out.append(
        f"  workload: users 1..{workload.get('users', 0):,}, objects random_gaussian(1, {workload.get('objects', 0):,},"
        f" {workload.get('gaussian')}), {workload.get('unlike_fraction', 0):.0%} unlikes,"
        f" {workload.get('duplicate_fraction', 0):.0%} repeated likes; target {settings.get('likes', 0):,} likes,"
        f" {settings.get('follows', 0):,} follows; {settings.get('workers', 1)} stream runner(s) on the likes;"
        f" wall {doc.get('wall_s', 0):,.0f}s"
    )
    producer, fill = doc.get("producer", {}), doc.get("fill", {})
    if producer:
        out.append(
            f"  producer: {producer['events']:,} events in {producer['seconds']:,.0f}s"
            f" ({producer['events_per_s']:,}/s), all before the runner started: it drained a backlog and never"
            " shared the cores with the producer"
        )
    curve = doc.get("curve") or []
    if curve:
        out.append("\n  likes in state   likes/s   state +/s   runner PSS   cores runner/postgres/machine   load1")
        for p in curve:
            cores = p.get("cores", {})
            runners = sum(v for k, v in cores.items() if k.startswith("pipeline"))  # pipeline, pipeline2, ...
            out.append(
                f"  {p['likes_in_state']:>14,} {p['likes_per_s']:>9,.0f} {p['state_growth_per_s']:>11,.0f}"
                f" {p['pss_mib']:>9,.0f} MiB   {runners:.2f} / {cores.get('postgres', 0):.2f}"
                f" / {cores.get('machine', 0):.2f}{'':>14}{p['load1']:>6.2f}"
            )
    if fill:
        out.append(
            f"\n  fill: {fill['events']:,} events in {fill['seconds']:,.0f}s after {fill['startup_s']:.1f}s start-up,"
            f" {fill['likes_per_s'] or 0:,.0f}/s overall; state {fill['likes_in_state']:,} likes, object_likes"
            f" {fill['likes_in_object_likes']:,}, the events leave {fill['expected_likes']:,};"
            f" runner PSS {fill['pss_mib_first']:,.0f} -> {fill['pss_mib_last']:,.0f} MiB;"
            f" WAL {fill['wal_bytes'] / 2**30:,.2f} GiB ({fill['wal_bytes_per_event']:,} bytes per event,"
            " whole cluster)"
        )
    if doc.get("backend_states"):
        states = ", ".join(f"{k} {v:.0%}" for k, v in list(doc["backend_states"].items())[:6])
        out.append(f"  runner's PostgreSQL session during the fill (sampled every 0.25 s): {states}")
    follows = doc.get("follows")
    if follows:
        out.append(
            f"  follows: {follows['follows_in_state']:,} in {follows['lists']:,} lists"
            f" (longest {follows['longest_list']:,}), {follows['follows_per_s'] or 0:,.0f}/s through their runner"
        )
    fresh = doc.get("freshness_ms")
    if fresh:
        out.append(
            f"  freshness at {fresh['rate']:,.0f} likes/s for {fresh['seconds']}s: p50 {fresh['p50']:,.0f} ms,"
            f" p99 {fresh['p99']:,.0f} ms, max {fresh['max']:,.0f} ms ({fresh['markers']:,} markers)"
        )
    sizes = doc.get("sizes")
    if sizes:
        out.append(
            "\n  table                                      total      indexes   live rows   HOT/updates   heap read"
        )
        for name, t in sizes["tables"].items():
            hot = f"{t['hot_updates'] / t['updates']:.0%}" if t["updates"] else "-"
            touched = (t["heap_reads"] or 0) + (t["heap_hits"] or 0)
            read = f"{(t['heap_reads'] or 0) / touched:.1%}" if touched else "-"
            out.append(
                f"  {name:<38} {_gib(t['total_bytes']):>10} {_gib(t['index_bytes']):>11} {t['live_rows']:>11,}"
                f" {hot:>13} {read:>11}"
            )
        out.append(f"  {'all':<38} {_gib(sizes['total_bytes']):>10} {_gib(sizes['index_bytes']):>11}")
    load = doc.get("load_average", {})
    if load.get("samples"):
        out.append(
            f"\n  load average (1 min) during the fill: min {load['min1']}, median {load['median1']},"
            f" max {load['max1']}"
        )
    for phase, error in doc.get("errors", {}).items():
        out.append(f"  FAILED {phase}: {error}")
    return out
