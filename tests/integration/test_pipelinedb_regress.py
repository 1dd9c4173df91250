"""PipelineDB 1.0's own regression cases, run as written against the real stack.

Each ported case (tests/pipelinedb_regress/cases/<name>.out: PipelineDB's statements and the rows it
printed) runs in a schema, streams and runner group of its own, its INSERTs going through the inbox
relay and Kafka like any client's (tests/pipelinedb_regress/runner.py). `make test` runs 23 of the
46 cases, one of each area (report.IN_MAKE_TEST), four at a time in a module fixture; each case is
then one test:

- a statement that passed when the baseline was written (tests/pipelinedb_regress/baseline.json)
  must still pass: its rows equal PipelineDB's;
- a case where every statement passes (or has no meaning here) passes; one with statements refused or
  answered differently is an expected failure naming them (docs/pipelinedb-regress.md lists why).

A case that reads the wall clock (sliding windows and ttls of seconds, pg_sleep) can see rows expire
before its SELECT when three other cases load the two cores: if one of its passing statements
regresses, it runs once more alone, and only that run counts.

`python -m tests.pipelinedb_regress.report` reruns every case and rewrites the table and the baseline.
"""

from __future__ import annotations

import json

import pytest

from tests.pipelinedb_regress.report import BASELINE, IN_MAKE_TEST, run_all
from tests.pipelinedb_regress.runner import CaseResult, run_case
from tests.pipelinedb_regress.translator import CASES as CASE_FILES

CASES = list(IN_MAKE_TEST)  # a case of each area; the report command runs all 46
# What makes a case's rows depend on when its SELECT runs.
WALL_CLOCK = ("pg_sleep", "clock_timestamp", "sw =", "ttl =")


@pytest.fixture(scope="module")
def results(stack) -> dict[str, CaseResult]:
    return {r.name: r for r in run_all(CASES)}


@pytest.mark.parametrize("case", CASES)
def test_pipelinedb_regression_case(results, case):
    result = results[case]
    baseline = set(json.loads(BASELINE.read_text()).get(case, []))
    regressed = _regressed(result, baseline)
    if regressed and _reads_wall_clock(case):
        result = run_case(case)
        regressed = _regressed(result, baseline)
    assert not regressed, "statements that passed no longer do:\n" + "\n".join(regressed)
    open_ = result.reasons("refused", "failed")
    if open_:
        pytest.xfail(f"{result.count('refused')} refused, {result.count('failed')} differ: " + "; ".join(open_[:3]))


def _regressed(result: CaseResult, baseline: set[int]) -> list[str]:
    return [
        f"{o.statement[:120]!r}: {o.status} {o.detail[:300]}"
        for i, o in enumerate(result.outcomes)
        if i in baseline and o.status != "passed"
    ]


def _reads_wall_clock(case: str) -> bool:
    text = (CASE_FILES / f"{case}.out").read_text().lower()
    return any(marker in text for marker in WALL_CLOCK)
