"""What `make bench` runs: every benchmark, its sizes (the quoted ones and `--quick`'s), its expected time.

Each benchmark is `python -m <module>`; the suite adds `--json <results>/<name>.json --progress 1`,
and reads the `BenchResult` it wrote back (`load_result`), which is what BENCHMARKS.md is built from.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from loadgen.common.report import BenchResult


@dataclass(frozen=True)
class Benchmark:
    """One command of the suite: its sizes at default and `--quick`, and its expected minutes at default."""

    name: str  # file names under the results folder: <name>.json, <name>.log, <name>.txt
    title: str  # its section in BENCHMARKS.md
    module: str
    args: str = ""  # default sizes: the figures BENCHMARKS.md quotes
    quick: str = ""  # small sizes: the machinery end to end in a few minutes
    minutes: float = 2.0  # expected duration at default sizes on the reference machine (2 cores)

    def command(self, quick: bool) -> list[str]:
        """`python -m <module> <args>` as a user would type it, without where the result is written."""
        return ["python", "-m", self.module, *self.args.split(), *(self.quick.split() if quick else ())]

    def output_args(self, results: Path) -> list[str]:
        """The arguments telling the command where to write its result, and to show its drains' progress."""
        return ["--json", str(results / f"{self.name}.json"), "--progress", "1"]


SUITE = (
    Benchmark(
        "social",
        "Likes and follows: the pipeline beside the seed's approach and the ceilings",
        "loadgen.social",
        quick="--events 150000 --seconds 3 --followers 1000",  # more events than the runner's batches of 50,000
        minutes=5,
    ),
    Benchmark(
        "pageviews_basic",
        "Page views through one runner: count, sum, max per url",
        "loadgen.pageviews",
        args="--view basic",
        quick="--events 100000 --passes 1",
        minutes=2,
    ),
    Benchmark(
        "pageviews_issue13",
        "Page views: the PipelineDB users' view (exact distinct count, avg, p99)",
        "loadgen.pageviews",
        args="--view issue13",
        quick="--events 60000 --passes 1",
        minutes=3,
    ),
    Benchmark(
        "pageviews_issue13_hll",
        "Page views: the same view with a HyperLogLog distinct count",
        "loadgen.pageviews",
        args="--view issue13_hll",
        quick="--events 60000 --passes 1",
        minutes=3,
    ),
    Benchmark(
        "sink",
        "Page views with an upsert sink on the view: ingest beside no sink, event -> record latency",
        "loadgen.sink",
        quick="--events 100000 --seconds 3",
        minutes=3,
    ),
    Benchmark(
        "change_capture",
        "What recording a view's changes costs per changed group, beside its floor",
        "loadgen.change_capture",
        quick="--batches 2 --rounds 1",
        minutes=1,
    ),
    Benchmark(
        "backfill",
        "A new view backfilled from 2M retained page views, beside the live runner; freshness meanwhile",
        "loadgen.backfill",
        quick="--events 200000 --baseline-s 2",
        minutes=3,
    ),
    Benchmark(
        "aggregates",
        "Each aggregate's own cost in the engine",
        "loadgen.aggregates",
        quick="--rows 5000 --batches 1",
        minutes=2,
    ),
    Benchmark(
        "audit",
        "Audit log: writer, ctid puller, lag and queries",
        "loadgen.audit",
        # --rows: more than the writer's first batches, or its rate cannot be timed
        quick="--rows 100000 --seconds 5 --query-rows 20000 --query-runs 5 --baseline-seconds 2",
        minutes=5,
    ),
    Benchmark(
        "cdc",
        "Change data capture: rows of app.likes until counted",
        "loadgen.cdc",
        quick="--rows 5000 --seconds 3",
        minutes=1.5,
    ),
    Benchmark(
        "friends",
        "friends_who_like on the typical mix and the heavy tail",
        "loadgen.friends",
        quick="--seconds 1 --rounds 1 --likes 20000 --followers 200 --heavy-objects 20 --heavy-users 20",
        minutes=4,
    ),
    Benchmark(
        "rollup",
        "A minute -> hour -> day chain of views over views: its ingest cost and event -> day latency",
        "loadgen.rollup",
        quick="--events 50000 --probes 5",
        minutes=4,
    ),
    Benchmark(
        "rollup_floor",
        "The same chain in PostgreSQL alone: as feeds today, applied in the batch, fed typed deltas",
        "loadgen.rollup.floor",
        quick="--events 5000 --batches 3 --rounds 1",
        minutes=3,
    ),
    Benchmark(
        "likes_at_size",
        "Likes per second as the state grows",
        "loadgen.likes_at_size",
        quick="--quick",
        minutes=30,  # 20 M likes through one runner, then freshness and the seed's function at that size
    ),
    Benchmark(
        "footprint",
        "The local stack: start-up times and memory",
        "loadgen.footprint",
        quick="--keep-maven-cache",
        minutes=3,
    ),
)


def by_name(names: str) -> list[Benchmark]:
    """The benchmarks named in a comma-separated list, in suite order; ValueError names the unknown ones."""
    wanted = {n.strip() for n in names.split(",") if n.strip()}
    unknown = wanted - {b.name for b in SUITE}
    if unknown:
        raise ValueError(f"unknown benchmark {', '.join(sorted(unknown))}; known: {', '.join(b.name for b in SUITE)}")
    return [b for b in SUITE if b.name in wanted]


def load_result(results: Path, name: str) -> BenchResult | None:
    """The result a benchmark left in `results`, or None when it wrote none."""
    path = results / f"{name}.json"
    return BenchResult.from_json(path.read_bytes()) if path.is_file() else None
