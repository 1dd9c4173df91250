"""Run PipelineDB's ported regression cases and write the pass/skip table (docs/pipelinedb-regress.md).

    python -m tests.pipelinedb_regress.report              # every case; the table and the baseline
    python -m tests.pipelinedb_regress.report cont_count   # some cases; prints their outcomes only

The baseline (tests/pipelinedb_regress/baseline.json) lists, per case, the statements that pass:
tests/integration/test_pipelinedb_regress.py fails when one of them stops passing.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.pipelinedb_regress.reasons import REASONS
from tests.pipelinedb_regress.runner import CaseResult, Outcome, run_case
from tests.pipelinedb_regress.translator import CASES

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "docs" / "pipelinedb-regress.md"
BASELINE = Path(__file__).parent / "baseline.json"
# Cases run at once: each has its own runner and relay processes.
PARALLEL = 4
SOURCE = "pipelinedb/pipelinedb@5cc6ef58ab5b1c84bb7b4e932f99bf5c347f46d8"
# The cases `make test` runs (test_pipelinedb_regress.py): every area (aggregates, sliding windows,
# transforms, joins, ttl, views over views) in about a minute on two idle cores; all 46 take about
# 100 s there, over 4 minutes on a loaded machine. The report command runs them all.
IN_MAKE_TEST = (
    "cont_activate", "cont_avg", "cont_bool_agg", "cont_count", "cont_dist_agg", "cont_freq_agg", "cont_min_max",
    "cont_regr", "cont_set_agg", "cont_stats", "cont_sum", "cont_sw_count", "cont_sw_stats", "cont_topk_agg",
    "cont_transform", "create_cont_view", "date_round", "delta_streams", "first_values", "keyed_min_max",
    "stream_table_join", "sw_expiration", "ttl_expiration",
)  # fmt: skip


def all_cases() -> list[str]:
    return sorted(p.stem for p in CASES.glob("*.out"))


def run_all(names: list[str], parallel: int = PARALLEL) -> list[CaseResult]:
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        return list(pool.map(_run_one, names))


def _run_one(name: str) -> CaseResult:
    """A case's result; a case that cannot run at all fails alone, saying why."""
    try:
        return run_case(name)
    except Exception as e:
        return CaseResult(name, [Outcome("(the whole case)", "failed", f"the case could not run: {e!r}"[:500])])


def passed_indexes(result: CaseResult) -> list[int]:
    """The statements that did what PipelineDB did (an error where PipelineDB gave one is not held to)."""
    return [i for i, o in enumerate(result.outcomes) if o.status == "passed" and "as PipelineDB" not in o.detail]


def _cell(text: str) -> str:
    """A reason as the table shows it: the run's names back to the case's, one line."""
    text = re.sub(r"\bpdb_[0-9a-f]{8}\.", "", text)
    text = re.sub(r"\b(\w+)_[0-9a-f]{8}\b", r"\1", text)
    return text.replace("|", "\\|").replace("\n", " ")


def _why(result: CaseResult) -> str:
    parts = []
    if result.count("refused") or result.count("failed"):
        reason = REASONS.get(result.name)
        parts.append(f"**why**: {reason}" if reason else "**why**: not yet explained")
    for status, label in (("refused", "refused"), ("failed", "differs"), ("skipped", "skipped")):
        reasons = result.reasons(status)
        if reasons:
            shown = "; ".join(_cell(r)[:160] for r in reasons[:3])
            more = f" (+{len(reasons) - 3} more)" if len(reasons) > 3 else ""
            parts.append(f"**{label}** ({result.count(status)}): {shown}{more}")
    return "<br>".join(parts)


def _frequent(results: list[CaseResult]) -> list[str]:
    """The refusals and differences that block most, each with the statements it blocks."""
    counts: dict[str, int] = {}
    for r in results:
        for o in r.outcomes:
            if o.status in ("refused", "failed"):
                reason = re.sub(r"^(continuous view|CREATE STREAM) [\w.]+: ", "", _cell(o.detail))
                reason = re.sub(r"\bCAST\([\w.]+ AS \w+\)", "CAST(x AS t)", reason)
                reason = re.sub(r"rows differ: .*", "rows differ", reason)
                counts[reason[:140]] = counts.get(reason[:140], 0) + 1
    top = sorted(counts.items(), key=lambda item: -item[1])[:12]
    return [
        "The refusals and differences met most often (statements):",
        "",
        *(f"- {n}: {reason}" for reason, n in top),
        "",
    ]


def table(results: list[CaseResult], seconds: float) -> str:
    total = {s: sum(r.count(s) for r in results) for s in ("passed", "accepted", "refused", "failed", "skipped")}
    statements = sum(len(r.outcomes) for r in results)
    matched = sum(o.rows and o.status == "passed" for r in results for o in r.outcomes)
    lines = [
        "# PipelineDB's regression suite, run against streamviews",
        "",
        f"PipelineDB 1.0's own regression cases ({SOURCE}, `src/test/regress/expected/*.out`), run",
        "statement by statement against the real stack by `tests/integration/test_pipelinedb_regress.py`",
        "(the harness: `tests/pipelinedb_regress/`). Written by `python -m tests.pipelinedb_regress.report`.",
        "",
        "How a case runs: `CREATE FOREIGN TABLE ... SERVER pipelinedb` becomes `CREATE STREAM` (its own topic",
        "and runner group), `CREATE VIEW ... FROM <stream>` becomes `CREATE CONTINUOUS VIEW` (or a",
        "transform), and every other statement runs as written, INSERTs into streams through the inbox",
        "relay and Kafka. Each SELECT's rows are compared with the rows PipelineDB printed, as psql prints",
        "them (TimeZone PST8PDT, DateStyle Postgres, 15 float digits, as pg_regress ran), in order when the",
        "query has ORDER BY.",
        "",
        "- **passed**: the same rows, or an error where PipelineDB gave one;",
        "- **accepted**: this system runs what PipelineDB refused (not a failure);",
        "- **refused**: this system refuses a definition PipelineDB accepted (its reason, one line); what",
        "  reads the refused view is skipped;",
        "- **differs**: other rows, or an error where PipelineDB gave rows;",
        "- **skipped**: no meaning here: PipelineDB's internals (matrels, its settings, catalog and",
        "  functions `pipelinedb.*`, PostgreSQL 11 catalogs, EXPLAIN, triggers on matrels, psql's `\\d`),",
        "  or it reads something refused or skipped before.",
        "",
        f"Totals: {len(results)} cases, {statements} statements: {total['passed']} passed, "
        f"{total['accepted']} accepted, {total['refused']} refused, {total['failed']} differ, "
        f"{total['skipped']} skipped; {matched} SELECTs gave PipelineDB's rows. One run took {seconds:.0f} s "
        f"({PARALLEL} cases at a time).",
        "",
        f"`make test` runs {len(IN_MAKE_TEST)} of the cases, one of each area, in about a minute: "
        + ", ".join(IN_MAKE_TEST)
        + "; `python -m tests.pipelinedb_regress.report` runs them all.",
        "",
        "| case | statements | passed (SELECTs) | accepted | refused | differ | skipped | why not all |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    lines[-2:-2] = _frequent(results)
    for r in results:
        selects = sum(o.rows and o.status == "passed" for o in r.outcomes)
        lines.append(
            f"| {r.name} | {len(r.outcomes)} | {r.count('passed')} ({selects}) | {r.count('accepted')} "
            f"| {r.count('refused')} | {r.count('failed')} | {r.count('skipped')} | {_why(r)} |"
        )
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", help="case names (default: all, and write the table and baseline)")
    parser.add_argument("--parallel", type=int, default=PARALLEL)
    parser.add_argument("--runs", type=int, default=2, help="runs whose common passes make the baseline")
    args = parser.parse_args(argv)
    names = args.cases or all_cases()
    started = time.monotonic()
    results = run_all(names, args.parallel)
    seconds = time.monotonic() - started
    if args.cases:
        for r in results:
            for o in r.outcomes:
                print(f"{r.name}\t{o.status}\t{o.statement[:90]!r}\t{o.detail[:300]}")
            print(f"{r.name}\t{r.seconds:.1f} s\t{r.timeouts} waits gave up")
        return 0
    TABLE.write_text(table(results, seconds))
    # The baseline keeps what passed in every run: a statement whose answer depends on timing (a short
    # sliding window) is not held against later runs.
    steady = {r.name: set(passed_indexes(r)) for r in results}
    for _ in range(args.runs - 1):
        for r in run_all(names, args.parallel):
            steady[r.name] &= set(passed_indexes(r))
    BASELINE.write_text(json.dumps({name: sorted(steady[name]) for name in names}, indent=1) + "\n")
    print(f"wrote {TABLE.relative_to(ROOT)} and {BASELINE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
