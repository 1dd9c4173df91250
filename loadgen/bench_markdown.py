"""BENCHMARKS.md from the figures documents of one `make bench` run: pure functions, no services.

The page opens with what the figures were measured on (machine, commit, date, sizes), a summary of
every benchmark (ok or "failed: reason", its time, the command to reproduce it) and the plots; then
one section per benchmark: each figure beside the reference measured in the same run, the ratio and
the target. A figure judged against nothing is listed after those, so no figure of a run is lost.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadgen.bench_progress import Outcome, mmss


@dataclass(frozen=True)
class RunInfo:
    """What the whole run was measured on, and how it was started."""

    machine: str  # cores, RAM, PostgreSQL settings (bench_report.machine_line without the commit)
    commit: str
    date: str  # when the run started, UTC
    quick: bool
    seconds: float
    command: str


@dataclass(frozen=True)
class Section:
    """One benchmark of the run: how it ended and the figures it wrote (None if it wrote none)."""

    name: str
    title: str
    command: str
    outcome: Outcome
    document: Mapping[str, Any] | None


@dataclass(frozen=True)
class Plot:
    """A plot of the run: its file (None while pending) and a sentence on what it shows or why it is missing."""

    title: str
    path: Path | None
    note: str


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


def verdict(comparison: Mapping[str, Any], value: float | None, reference: float | None) -> str:
    """The target and whether this run met it: `>= 10x: PASS`, `< 1,000 ms: MISS`; "" when there is none."""
    target, limit = comparison.get("target"), comparison.get("limit")
    if limit is not None:
        bound = f"< {format_value(limit)} {comparison.get('unit') or ''}".rstrip()
        return bound if value is None else f"{bound}: {'PASS' if value < limit else 'MISS'}"
    if target is None:
        return ""
    bound = f">= {target:g}x"
    if value is None or not reference:
        return bound
    return f"{bound}: {'PASS' if value / reference >= target else 'MISS'}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


_UNIT = re.compile(r"\s*\([^)]*\)$")


def full_labels(figures: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Each figure's label; a "  same, ..." line of a printed table is prefixed with the label it continues."""
    labels, parent = {}, ""
    for figure in figures:
        raw = str(figure.get("label") or figure["key"])
        label = " ".join(raw.split())
        if raw.startswith(" ") and label.startswith("same") and parent:
            labels[figure["key"]] = f"{_UNIT.sub('', parent)} — {label}"
        else:
            labels[figure["key"]] = label
            parent = label if not raw.startswith(" ") else parent
    return labels


def figures_table(document: Mapping[str, Any]) -> list[str]:
    """The figure / reference / ratio / target table of one benchmark's document, as Markdown lines."""
    figures = {f["key"]: f for f in document.get("figures") or [] if isinstance(f, dict) and f.get("key")}
    labels = full_labels(list(figures.values()))

    def shown(key: str) -> str:
        figure = figures.get(key)
        if figure is None:
            return "(not measured)"
        if figure.get("value") is None:
            return str(figure.get("note") or "(not run)")
        return format_value(figure["value"], figure.get("format"))

    def value(key: str | None) -> float | None:
        return figures[key].get("value") if key in figures else None

    lines = [
        "| figure | this run | reference measured in the same run | ratio | target |",
        "| --- | ---: | --- | ---: | --- |",
    ]
    judged: set[str] = set()
    for comparison in document.get("comparisons") or []:
        key, reference = comparison.get("figure"), comparison.get("reference")
        judged |= {key, reference} if reference else {key}
        if reference:
            against = f"{labels.get(reference, reference)}: {shown(reference)}"
            ref_value = value(reference)
        elif comparison.get("fixed") is not None:
            ref_value = comparison["fixed"]
            against = f"{format_value(ref_value)} (fixed, not measured here: {comparison.get('fixed_label') or '?'})"
        else:
            against, ref_value = "—", None
        ratio = format_ratio(value(key), ref_value) if ref_value is not None else "—"
        row = [labels.get(key, key), shown(key), against, ratio, verdict(comparison, value(key), ref_value)]
        lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
    for key in figures:
        if key not in judged:
            lines.append(f"| {_cell(labels[key])} | {_cell(shown(key))} | — | — | |")
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
    if entry.document is not None:
        lines += [*figures_table(entry.document), ""]
        if entry.document.get("view_check"):
            lines += [f"View check: {_cell(str(entry.document['view_check']))}.", ""]
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
        f"Written by `make bench` (`{run.command}`; see README, Benchmarks): regenerate it rather than edit",
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
