"""BENCHMARKS.md from the results of one `make bench` run: pure functions, no services.

The page opens with what the figures were measured on (machine, commit, date, sizes), a summary of
every benchmark (ok or "failed: reason", its time, the command to reproduce it) and the plots; then
one section per benchmark: each figure beside the reference measured in the same run and the ratio,
with a verdict only against a live target. A figure compared with nothing is listed after those, so
no figure of a run is lost.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from loadgen.common.report import BenchResult, full_labels, shown_value, verdict
from loadgen.suite.progress import Outcome, mmss


@dataclass(frozen=True)
class RunInfo:
    """What the whole run was measured on, and how it was started."""

    machine: str  # cores, RAM, PostgreSQL settings (`machine_line` without the commit)
    commit: str
    date: str  # when the run started, UTC
    quick: bool
    seconds: float
    command: str


@dataclass(frozen=True)
class Section:
    """One benchmark of the run: how it ended and the result it wrote (None if it wrote none)."""

    name: str
    title: str
    command: str
    outcome: Outcome
    result: BenchResult | None


@dataclass(frozen=True)
class Plot:
    """A plot of the run: its file (None while pending) and a sentence on what it shows or why it is missing."""

    title: str
    path: Path | None
    note: str


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def figures_table(result: BenchResult) -> list[str]:
    """The figure / reference / ratio / target table of one benchmark's result, as Markdown lines.

    Each comparison is a row (its target's verdict only when it has a target or a limit); the figures
    compared with nothing follow, so no figure of a run is lost.
    """
    labels = full_labels(result.figures)
    shown = {f.key: shown_value(f) for f in result.figures}
    lines = [
        "| figure | this run | reference measured in the same run | ratio | target |",
        "| --- | ---: | --- | ---: | --- |",
    ]
    judged: set[str | None] = set()
    for c in result.comparisons:
        judged |= {c.figure, c.reference}
        ratio, against = result.reference(c, labels, shown)
        judgement = verdict(c, result.value(c.figure), result.reference_value(c))
        row = [labels.get(c.figure, c.figure), shown.get(c.figure, "(not measured)"), against, ratio, judgement]
        lines.append("| " + " | ".join(_cell(cell) for cell in row) + " |")
    for f in result.figures:
        if f.key not in judged:
            lines.append(f"| {_cell(labels[f.key])} | {_cell(shown[f.key])} | — | — | |")
    return lines


def section(entry: Section) -> list[str]:
    """One benchmark: its heading, how to reproduce it, how it ended, its table."""
    outcome = entry.outcome
    lines = [f"## {entry.title}", "", f"`{entry.command}`", ""]
    if outcome.status == "ok":
        lines.append(f"Ran in {mmss(outcome.seconds)}.")
    elif outcome.status == "skipped":
        lines.append(f"Not run: {outcome.reason}.")
    else:
        lines.append(f"**failed: {_cell(outcome.reason or 'unknown')}** (after {mmss(outcome.seconds)}; its log:")
        lines[-1] += f" `{entry.name}.log` in the results folder)."
    lines.append("")
    if entry.result is not None:
        lines += [*figures_table(entry.result), ""]
        if entry.result.check:
            check = entry.result.check
            lines += [f"Check: {_cell(str(check) if isinstance(check, str) else 'FAILED: ' + '; '.join(check))}.", ""]
    return lines


def result_cell(outcome: Outcome) -> str:
    """The summary's result: "ok", "failed: reason" or "pending: reason"."""
    if outcome.status == "ok":
        return "ok"
    word = "pending" if outcome.status == "skipped" else "failed"
    return f"{word}: {_cell(outcome.reason or 'unknown')}"


def render(run: RunInfo, sections: Sequence[Section], plots: Sequence[Plot], report_path: Path) -> str:
    """The whole page. Plot paths are written relative to `report_path`'s folder, so links work on GitHub."""
    sizes = (
        "**quick** (`--quick`: small sizes that check the machinery; not figures to quote)"
        if run.quick
        else "default (the sizes README's figures are quoted at)"
    )
    lines = [
        "# Benchmarks",
        "",
        f"Written by `make bench` (`{run.command}`; see docs/performance.md): regenerate it rather than edit",
        "it. Every figure below was measured in this one run, beside its reference.",
        "",
        "| | |",
        "| --- | --- |",
        f"| machine | {_cell(run.machine)} |",
        f"| commit | {_cell(run.commit)} |",
        f"| date | {run.date} |",
        f"| sizes | {sizes} |",
        f"| duration | {mmss(run.seconds)} |",
        "",
        "## Summary",
        "",
        "| benchmark | result | time | reproduce |",
        "| --- | --- | ---: | --- |",
    ]
    for entry in sections:
        time_cell = mmss(entry.outcome.seconds) if entry.outcome.status != "skipped" else "—"
        lines.append(f"| {_cell(entry.title)} | {result_cell(entry.outcome)} | {time_cell} | `{entry.command}` |")
    lines += ["", "## Plots", ""]
    for plot in plots:
        lines += [f"### {plot.title}", ""]
        if plot.path is not None:
            link = Path(os.path.relpath(plot.path, report_path.parent)).as_posix()
            lines += [f"![{plot.title}]({link})", ""]
        lines += [plot.note, ""]
    for entry in sections:
        lines += section(entry)
    return "\n".join(lines).rstrip() + "\n"
