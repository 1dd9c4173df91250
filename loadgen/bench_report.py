"""What the benchmarks' printed reports share: figures that survive a failed step, and the machine line.

- `Results`: figures by key, with a note ("failed: ...", "(pending)") where a step has none, and the
  ratios and PASS/MISS verdicts between them, so one failure never hides the other figures;
- `machine_line`: what a report's figures were measured on (cores, RAM, PostgreSQL settings, commit);
- `Comparison`, `figures_document`, `write_figures`: the same figures as JSON (`--json PATH` of each
  benchmark), which `loadgen.bench_all` gathers into BENCHMARKS.md and its plots.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from loadgen import seed_baselines as seed
from pipelines.logs import get_logger
from pipelines.settings import PostgresSettings

log = get_logger("loadgen.bench_report")

REPO_ROOT = Path(__file__).resolve().parents[1]


class Results:
    """Figures by key, with "(pending)" for hooks and "failed" for errors, so one failure never hides the rest."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}
        self.notes: dict[str, str] = {}

    def measure(self, key: str, fn: Callable[[], Any]) -> Any:
        """Run one measurement; record its figure, or why there is none."""
        started = time.monotonic()
        log.info("measuring", step=key)
        try:
            value = fn()
        except NotImplementedError:
            self.notes[key] = "(pending)"
            return None
        except Exception as e:
            log.exception("measurement failed", step=key)
            self.notes[key] = f"failed: {str(e).splitlines()[0][:60] if str(e) else type(e).__name__}"
            return None
        log.info("measured", step=key, value=value, seconds=round(time.monotonic() - started, 1))
        if isinstance(value, int | float):
            self.values[key] = float(value)
        return value

    def show(self, key: str) -> str:
        """A figure as printed: thousands separated, or its note."""
        if key in self.values:
            return f"{self.values[key]:,.0f}"
        return self.notes.get(key, "(not run)")

    def ratio(self, numerator: str, denominator: str) -> str:
        """`a / b` as `12.3x`, or "(pending)" when either side is missing."""
        if numerator in self.values and self.values.get(denominator):
            return f"{self.values[numerator] / self.values[denominator]:.2f}x"
        return "(pending)"

    def verdict(self, numerator: str, denominator: str, target: float) -> str:
        """The target of `a / b` and PASS/MISS, or "(pending)" when either side is missing."""
        if numerator in self.values and self.values.get(denominator):
            met = self.values[numerator] / self.values[denominator] >= target
            return f">= {target:g}x  {'PASS' if met else 'MISS'}"
        return f">= {target:g}x  (pending)"


def source_commit() -> str:
    """The checked-out commit, with `+ uncommitted changes` when the work tree differs; `unknown` outside git."""
    git = ["git", "-C", str(REPO_ROOT)]
    try:
        head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        status = subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + (" + uncommitted changes" if status.stdout.strip() else "")


def memory_gib() -> float | None:
    """The machine's RAM in GiB (MemTotal of /proc/meminfo), None where it cannot be read."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    except (OSError, ValueError, IndexError):
        return None
    return None


def machine_line(postgres: PostgresSettings | None = None) -> str:
    """What a report's figures were measured on: cores, RAM, the PostgreSQL settings that shape writes, the commit."""
    facts = seed.postgres_facts(postgres)
    ram = memory_gib()
    return (
        f"{os.cpu_count()} cores{f', {ram:.0f} GiB RAM' if ram else ''}; PostgreSQL {facts.get('server_version')},"
        f" synchronous_commit={facts.get('synchronous_commit')}, shared_buffers={facts.get('shared_buffers')};"
        f" commit {source_commit()}"
    )


@dataclass(frozen=True)
class Comparison:
    """One figure beside what it is judged against: another figure of the same run, a fixed figure, or a limit.

    `reference` names a figure measured in the same run (the ratio is figure / reference, `target` its
    minimum); `fixed` is a figure not measured here (a published one, `fixed_label` says whose);
    `limit` is a bound the figure must stay under (latencies), in `unit`.
    """

    label: str
    figure: str
    reference: str | None = None
    target: float | None = None
    fixed: float | None = None
    fixed_label: str | None = None
    limit: float | None = None
    unit: str = ""


FigureRow = tuple[str, str] | tuple[str, str, str]  # (label, key) or (label, key, format spec), as printed


def figures_document(
    benchmark: str,
    results: Results,
    figures: Sequence[FigureRow],
    comparisons: Sequence[Comparison] = (),
    *,
    series: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A run's figures as `loadgen.bench_all` reads them: each figure's value or note, what it is judged against.

    `figures` are the rows of the printed table; `series` holds samples for plots (drains as
    `[seconds since start, records done]` points, latencies); `extra`, anything else worth keeping.
    """
    rows = []
    for label, key, *spec in figures:
        value = results.values.get(key)
        rows.append(
            {
                "key": key,
                "label": label,
                "value": value,
                "note": None if value is not None else results.notes.get(key, "(not run)"),
                "format": spec[0] if spec else None,
            }
        )
    module = Path(sys.argv[0]).stem if sys.argv and sys.argv[0] else benchmark
    return {
        "benchmark": benchmark,
        "command": " ".join(["python", "-m", f"loadgen.{module}", *sys.argv[1:]]),
        "finished": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": source_commit(),
        "figures": rows,
        "comparisons": [asdict(c) for c in comparisons],
        "series": dict(series or {}),
        **dict(extra or {}),
    }


def write_figures(path: Path, document: Mapping[str, Any]) -> None:
    """Write a figures document as JSON (`--json PATH`), creating the folder; logged, never raises on a bad path."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2))
    except OSError:
        log.exception("could not write the figures", path=str(path))
        return
    log.info("figures written", path=str(path))


def drain_series(samples: Sequence[tuple[float, int]], *, label: str, total: int, first_commit: float) -> dict:
    """A drain's progress for the throughput plot: points since process start, the backlog, the timed start."""
    return {
        "label": label,
        "total": total,
        "first_commit": round(first_commit, 3),
        "points": [[round(t, 3), n] for t, n in samples],
    }
