"""The one output protocol of the benchmarks: a `BenchResult`, printed as a table, written as one JSON line.

Every benchmark measures into `Results` (figures by key; a step that fails leaves a note, never hides
the others), returns a `BenchResult` (its figures, what each is compared with, the correctness
check, notes, samples for the plots), and `loadgen.common.cli.run` prints `result.text()` and, with
`--json PATH`, writes `result.json_line()`. `make bench` reads each line back (`BenchResult.from_json`)
and renders BENCHMARKS.md from the same objects (`loadgen.suite.markdown`).

A `Comparison` puts a figure beside a reference measured in the same run (the ratio), a fixed
published figure, or a limit. Only a comparison with a `target` or a `limit` is judged (PASS/MISS);
side-by-side ratios carry none.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from loadgen.common.postgres import postgres_facts
from pipelines.logs import get_logger
from pipelines.settings import PostgresSettings

log = get_logger("loadgen.common.report")

REPO_ROOT = Path(__file__).resolve().parents[2]


class Results:
    """Figures by key, with "failed: ..." where a step raised, so one failure never hides the rest."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}
        self.notes: dict[str, str] = {}

    def measure(self, key: str, fn: Callable[[], Any]) -> Any:
        """Run one measurement; record its figure, or why there is none. Logged as the suite shows steps."""
        started = time.monotonic()
        log.info("measuring", step=key)
        try:
            value = fn()
        except Exception as e:
            log.exception("measurement failed", step=key)
            self.notes[key] = f"failed: {str(e).splitlines()[0][:60] if str(e) else type(e).__name__}"
            return None
        log.info("measured", step=key, value=value, seconds=round(time.monotonic() - started, 1))
        if isinstance(value, int | float):
            self.values[key] = float(value)
        return value

    def same_note(self, keys: Sequence[str], step: str) -> None:
        """Figures that come out of `step` carry its note when it failed (or "(not run)")."""
        for key in keys:
            if key not in self.values:
                self.notes[key] = self.notes.get(step, "(not run)")


@dataclass(frozen=True)
class Figure:
    """One measured figure: its value, or a note saying why there is none; its own number format if any."""

    key: str
    label: str  # a label starting with "  same, ..." continues the figure above it
    value: float | None
    note: str | None = None
    format: str | None = None


@dataclass(frozen=True)
class Comparison:
    """One figure beside what it is compared with: a figure of the same run, a fixed figure, or a limit.

    `reference` names a figure measured in the same run (the ratio is figure / reference; `target`,
    when there is one, its minimum); `fixed` is a figure not measured here (`fixed_label` says whose);
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


FigureRow = tuple[str, str] | tuple[str, str, str]  # (label, key) or (label, key, format spec)


def source_commit() -> str:
    """The checked-out commit, with `+ uncommitted changes` when the work tree differs; `unknown` outside git."""
    git = ["git", "-C", str(REPO_ROOT)]
    try:
        head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        status = subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + (" + uncommitted changes" if status.stdout.strip() else "")


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass
class BenchResult:
    """What a benchmark returns: its figures, their comparisons, its correctness check, notes and samples.

    `check` is a sentence saying what was compared when the benchmark's output is right, or the list
    of problems when it is not (a wrong result fails the command; a figure below a target does not).
    `series` holds samples for the plots (`drains`, `freshness_ms`, `audit_lag`, `likes_at_size`);
    `extra`, anything else the run keeps in its JSON line.
    """

    benchmark: str
    figures: list[Figure]
    comparisons: list[Comparison] = field(default_factory=list)
    check: str | list[str] | None = None
    header: list[str] = field(default_factory=list)  # the printed report's first lines: workload, machine
    notes: list[str] = field(default_factory=list)
    series: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    command: str = ""
    commit: str = field(default_factory=source_commit)
    finished: str = field(default_factory=_now)

    @classmethod
    def of(cls, benchmark: str, results: Results, rows: Sequence[FigureRow], **kwargs: Any) -> BenchResult:
        """The result holding `rows` of `results`, each with its value or the note saying why there is none."""
        figures = [
            Figure(
                key,
                label,
                results.values.get(key),
                None if key in results.values else results.notes.get(key, "(not run)"),
                spec[0] if spec else None,
            )
            for label, key, *spec in rows
        ]
        return cls(benchmark, figures, **kwargs)

    @property
    def failures(self) -> list[str]:
        """Why the run failed: figures that could not be measured, problems found by the check."""
        failed = [f"{f.key}: {f.note}" for f in self.figures if str(f.note).startswith("failed")]
        return failed + (list(self.check) if isinstance(self.check, list) else [])

    def value(self, key: str | None) -> float | None:
        """The value of figure `key`, None when it was not measured."""
        return next((f.value for f in self.figures if f.key == key), None)

    def text(self) -> str:
        """The printed report: header, the figures, each comparison with its ratio and verdict, check, notes."""
        labels = full_labels(self.figures)
        shown = {f.key: shown_value(f) for f in self.figures}
        lines = [*self.header, ""]
        lines += [f"  {f.label:<60}{shown[f.key]:>16}" for f in self.figures]
        if self.comparisons:
            lines += ["", "  comparisons"]
            for c in self.comparisons:
                ratio = shown.get(c.figure, "—") if c.limit is not None else self.reference(c, labels, shown)[0]
                judged = verdict(c, self.value(c.figure), self.reference_value(c))
                lines.append(f"  {c.label:<60}{ratio:>16}    {judged}".rstrip())
        if isinstance(self.check, list):
            lines += ["", "  check FAILED: " + "; ".join(self.check)]
        elif self.check:
            lines += ["", f"  check: {self.check}"]
        if self.notes:
            lines += ["", "  notes", *(f"  - {note}" for note in self.notes)]
        return "\n".join(lines).rstrip() + "\n"

    def reference_value(self, c: Comparison) -> float | None:
        """What `c` divides by: the reference figure's value, or the fixed figure."""
        return self.value(c.reference) if c.reference else c.fixed

    def reference(self, c: Comparison, labels: Mapping[str, str], shown: Mapping[str, str]) -> tuple[str, str]:
        """The ratio of `c` as shown, and what it is compared with, in words."""
        if c.reference:
            against = f"{labels.get(c.reference, c.reference)}: {shown.get(c.reference, '(not measured)')}"
        elif c.fixed is not None:
            against = f"{format_value(c.fixed)} (fixed, not measured here: {c.fixed_label or '?'})"
        else:
            return "—", "—"
        return format_ratio(self.value(c.figure), self.reference_value(c)), against

    def json_line(self) -> bytes:
        """The result as one line of JSON (what `--json PATH` writes)."""
        return orjson.dumps(asdict(self), default=json_value) + b"\n"

    @classmethod
    def from_json(cls, line: bytes | str) -> BenchResult:
        """A result read back from its JSON line."""
        data = orjson.loads(line)
        data["figures"] = [Figure(**f) for f in data.get("figures") or []]
        data["comparisons"] = [Comparison(**c) for c in data.get("comparisons") or []]
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def write(self, path: Path) -> None:
        """Write the JSON line to `path`, creating its folder."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.json_line())
        log.info("result written", path=str(path))


def json_value(value: object) -> object:
    """What orjson cannot write itself (PostgreSQL numerics, paths) as a float or a string."""
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return str(value)


def shown_value(figure: Figure) -> str:
    """A figure as shown: its value, or the note saying why there is none."""
    if figure.value is None:
        return str(figure.note or "(not run)")
    return format_value(figure.value, figure.format)


def format_value(value: float | None, spec: str | None = None) -> str:
    """A figure as shown: its own format when it has one, else thousands separated or 2-3 significant digits."""
    if value is None or not math.isfinite(value):
        return "—"
    if spec:
        return format(value, spec)
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def format_ratio(numerator: float | None, denominator: float | None) -> str:
    """`numerator / denominator` as `3.80x` (one decimal from 10x, three below 0.1x); "—" when undefined."""
    if numerator is None or not denominator:
        return "—"
    ratio = numerator / denominator
    if not math.isfinite(ratio):
        return "—"
    if abs(ratio) >= 10:
        return f"{ratio:.1f}x"
    if abs(ratio) >= 0.1:
        return f"{ratio:.2f}x"
    return f"{ratio:.3f}x"


def verdict(comparison: Comparison, value: float | None, reference: float | None) -> str:
    """The target and whether this run met it: `>= 3x: PASS`, `< 1,000 ms: MISS`; "" when there is none."""
    if comparison.limit is not None:
        bound = f"< {format_value(comparison.limit)} {comparison.unit}".rstrip()
        return bound if value is None else f"{bound}: {'PASS' if value < comparison.limit else 'MISS'}"
    if comparison.target is None:
        return ""
    bound = f">= {comparison.target:g}x"
    if value is None or not reference:
        return bound
    return f"{bound}: {'PASS' if value / reference >= comparison.target else 'MISS'}"


_UNIT = re.compile(r"\s*\([^)]*\)$")


def full_labels(figures: Sequence[Figure]) -> dict[str, str]:
    """Each figure's label; a "  same, ..." label is prefixed with the label it continues."""
    labels, parent = {}, ""
    for figure in figures:
        raw = figure.label or figure.key
        label = " ".join(raw.split())
        if raw.startswith(" ") and label.startswith("same") and parent:
            labels[figure.key] = f"{_UNIT.sub('', parent)} — {label}"
        else:
            labels[figure.key] = label
            parent = label if not raw.startswith(" ") else parent
    return labels


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
    facts = postgres_facts(postgres)
    ram = memory_gib()
    return (
        f"{os.cpu_count()} cores{f', {ram:.0f} GiB RAM' if ram else ''}; PostgreSQL {facts.get('server_version')},"
        f" synchronous_commit={facts.get('synchronous_commit')}, shared_buffers={facts.get('shared_buffers')};"
        f" commit {source_commit()}"
    )


def drain_series(samples: Sequence[tuple[float, int]], *, label: str, total: int, first_commit: float) -> dict:
    """A drain's progress for the throughput plot: points since process start, the backlog, the timed start."""
    return {
        "label": label,
        "total": total,
        "first_commit": round(first_commit, 3),
        "points": [[round(t, 3), n] for t, n in samples],
    }


def command_line(module: str, argv: Sequence[str] | None = None) -> str:
    """`python -m <module> <args>` as typed, without where the result goes (`--json`, `--progress`)."""
    args, out = list(sys.argv[1:] if argv is None else argv), []
    while args:
        arg = args.pop(0)
        if arg in ("--json", "--progress"):
            args = args[1:]
        elif not arg.startswith(("--json=", "--progress=")):
            out.append(arg)
    return " ".join(["python", "-m", module, *out])
