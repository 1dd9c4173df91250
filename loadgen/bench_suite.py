"""What `make bench` runs: every benchmark, its sizes (README's and `--quick`), and where its figures land.

Each benchmark is a command that prints figures; `--json PATH` makes it also write them as a figures
document (`loadgen.bench_report.figures_document`), which is what BENCHMARKS.md is built from.
`bench_friends` writes its own JSON under `--out DIR`, which `friends_document` turns into a figures
document; it is read, never changed, so its author can keep editing it.

The likes-at-size curve (`loadgen.bench_likes_at_size`, not written yet) runs when its module exists.
Its contract: it accepts `--json PATH` (and `--quick`), and its document carries, besides its figures,
`"points": [{"likes_in_state": N, "likes_per_second": R}, ...]`. The plot step reads
`<results>/likes_at_size.json` (or `likes_at_size.csv` with that header) whoever wrote it, and says the
curve is pending while there is none (see `loadgen.bench_plots.load_likes_at_size`).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson

from loadgen.bench_report import Comparison, Results


@dataclass(frozen=True)
class Benchmark:
    """One command of the suite: its sizes at default and `--quick`, and its expected minutes at default."""

    name: str  # file names under the results folder: <name>.json, <name>.log, <name>.txt
    title: str  # its section in BENCHMARKS.md
    module: str
    args: tuple[str, ...] = ()  # default sizes: the figures README quotes
    quick: tuple[str, ...] = ()  # small sizes: the machinery end to end in a few minutes
    minutes: float = 2.0  # expected duration at default sizes on the reference machine (2 cores)
    output: str = "json"  # "json": `--json <file>`; "dir": `--out <dir>` (bench_friends' own files)
    optional: bool = False  # skipped, and reported as pending, while its module does not exist

    def command(self, quick: bool) -> list[str]:
        """`python -m <module> <args>` as a user would type it, without where figures are written."""
        return ["python", "-m", self.module, *self.args, *(self.quick if quick else ())]

    def available(self) -> bool:
        """Whether the module exists in this checkout."""
        return importlib.util.find_spec(self.module) is not None

    def output_args(self, results: Path) -> list[str]:
        """The arguments telling the command where to write its figures."""
        if self.output == "dir":
            return ["--out", str(results / self.name)]
        return ["--json", str(results / f"{self.name}.json")]


SUITE = (
    Benchmark(
        "social",
        "Likes and follows: the pipeline beside the seed's approach and the ceilings",
        "loadgen.bench_social",
        quick=("--events", "150000", "--seconds", "3", "--followers", "1000"),  # > the runner's batches of 50,000
        minutes=5,
    ),
    Benchmark(
        "pageviews_basic",
        "Page views through one runner: count, sum, max per url",
        "loadgen.bench_pageviews",
        args=("--view", "basic"),
        quick=("--events", "100000", "--passes", "1"),
        minutes=2,
    ),
    Benchmark(
        "pageviews_issue13",
        "Page views: the PipelineDB users' view (exact distinct count, avg, p99)",
        "loadgen.bench_pageviews",
        args=("--view", "issue13"),
        quick=("--events", "60000", "--passes", "1"),
        minutes=3,
    ),
    Benchmark(
        "pageviews_issue13_hll",
        "Page views: the same view with a HyperLogLog distinct count",
        "loadgen.bench_pageviews",
        args=("--view", "issue13_hll"),
        quick=("--events", "60000", "--passes", "1"),
        minutes=2.5,
    ),
    Benchmark(
        "aggregates",
        "Each aggregate's own cost in the engine",
        "loadgen.bench_aggregates",
        quick=("--rows", "5000", "--batches", "1"),
        minutes=2,
    ),
    Benchmark(
        "audit",
        "Audit log: writer, ctid puller, lag and queries",
        "loadgen.bench_audit",
        quick=(
            "--rows",
            "100000",  # more than the writer's first batches, or its rate cannot be timed
            "--seconds",
            "5",
            "--query-rows",
            "20000",
            "--query-runs",
            "5",
            "--baseline-seconds",
            "2",
        ),
        minutes=5,
    ),
    Benchmark(
        "cdc",
        "Change data capture: rows of app.likes until counted",
        "loadgen.bench_cdc",
        quick=("--rows", "5000", "--seconds", "3"),
        minutes=1.5,
    ),
    Benchmark(
        "friends",
        "friends_who_like on the typical mix and the heavy tail",
        "loadgen.bench_friends",
        quick=(
            "--seconds",
            "1",
            "--rounds",
            "1",
            "--likes",
            "20000",
            "--followers",
            "200",
            "--heavy-objects",
            "20",
            "--heavy-users",
            "20",
        ),
        minutes=4,
        output="dir",
    ),
    Benchmark(
        "likes_at_size",
        "Likes per second as the state grows",
        "loadgen.bench_likes_at_size",
        quick=("--quick",),
        minutes=30,  # 20 M likes through one runner, then freshness and the seed's function at that size
        optional=True,
    ),
    Benchmark(
        "footprint",
        "The local stack: start-up times and memory",
        "loadgen.stack_footprint",
        quick=("--keep-maven-cache",),
        minutes=2.5,
    ),
)


def by_name(names: str) -> list[Benchmark]:
    """The benchmarks named in a comma-separated list, in suite order; ValueError names the unknown ones."""
    wanted = {n.strip() for n in names.split(",") if n.strip()}
    unknown = wanted - {b.name for b in SUITE}
    if unknown:
        raise ValueError(f"unknown benchmark {', '.join(sorted(unknown))}; known: {', '.join(b.name for b in SUITE)}")
    return [b for b in SUITE if b.name in wanted]


def collect_document(benchmark: Benchmark, results: Path) -> dict[str, Any] | None:
    """The figures document a benchmark left in `results`, or None when it wrote none."""
    if benchmark.output == "dir":
        written = sorted((results / benchmark.name).glob("friends_*.json"), key=lambda p: p.stat().st_mtime)
        if not written:
            return None
        document = friends_document(orjson.loads(written[-1].read_bytes()))
        (results / f"{benchmark.name}.json").write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2))
        return document
    path = results / f"{benchmark.name}.json"
    return orjson.loads(path.read_bytes()) if path.is_file() else None


def friends_targets() -> Mapping[str, tuple[str, str, float]]:
    """bench_friends' targets (mix -> numerator, denominator, minimum ratio), none if it cannot be imported."""
    try:
        from loadgen.bench_friends import TARGETS
    except Exception:  # being edited by someone else: the figures are still shown, only the targets are not
        return {}
    return TARGETS


def friends_document(raw: Mapping[str, Any]) -> dict[str, Any]:
    """bench_friends' own JSON (meta, summary per mix and query, timings) as a figures document."""
    results, figures, comparisons = Results(), [], []
    targets = friends_targets()
    for mix, queries in raw.get("summary", {}).items():
        for query, f in queries.items():
            key = f"{mix}_{query}"
            results.values[key] = f["calls_per_second"]
            results.values[f"{key}_p99"] = f["p99_ms"]
            figures.append((f"{mix}: {query} (calls/s)", key))
            figures.append((f"{mix}: {query} p99 (ms)", f"{key}_p99", ".3f"))
        target = targets.get(mix)
        for numerator, denominator in (("now", "seed"), ("now", "pk_read"), ("before", "seed")):
            if numerator in queries and denominator in queries:
                minimum = target[2] if target and target[:2] == (numerator, denominator) else None
                comparisons.append(
                    Comparison(
                        f"{mix}: {numerator} / {denominator}", f"{mix}_{numerator}", f"{mix}_{denominator}", minimum
                    )
                )
    meta = raw.get("meta", {})
    return {
        "benchmark": "friends",
        "command": meta.get("command"),
        "commit": meta.get("commit"),
        "figures": [
            {
                "key": key,
                "label": label,
                "value": results.values[key],
                "note": None,
                "format": spec[0] if spec else None,
            }
            for label, key, *spec in figures
        ],
        "comparisons": [asdict(c) for c in comparisons],
        "series": {},
        "sizes": meta.get("sizes"),
    }
