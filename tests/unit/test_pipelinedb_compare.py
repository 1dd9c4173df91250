"""How the PipelineDB regression harness compares a SELECT's rows with the rows PipelineDB printed."""

from __future__ import annotations

import pytest

from tests.pipelinedb_regress.compare import compare, sort_keys

PRINTED = [("0", "0", "0"), ("0", "0", "1"), ("0", "0", "0"), ("0", "0", "1"), ("1", "1", "2")]


def test_rows_an_order_by_ties_on_may_come_in_any_order():
    query = "SELECT * FROM v ORDER BY id"
    keys = sort_keys(query, ["id", "tid", "data"])
    assert keys == [0]
    ours = [("0", "0", "0"), ("0", "0", "0"), ("0", "0", "1"), ("0", "0", "1"), ("1", "1", "2")]
    assert compare(query, PRINTED, ours, keys).status == "passed"


@pytest.mark.parametrize(
    "ours",
    [
        [("1", "1", "2"), ("0", "0", "0"), ("0", "0", "1"), ("0", "0", "0"), ("0", "0", "1")],  # out of order
        [("0", "0", "0"), ("0", "0", "1"), ("0", "0", "1"), ("0", "0", "1"), ("1", "1", "2")],  # another multiset
    ],
)
def test_rows_out_of_the_order_by_or_different_differ(ours):
    query = "SELECT * FROM v ORDER BY 1"
    assert compare(query, PRINTED, ours, sort_keys(query, ["id", "tid", "data"])).status == "failed"


def test_an_order_by_of_expressions_compares_in_order_and_no_order_by_as_sets():
    assert sort_keys("SELECT * FROM v ORDER BY id + 1", ["id"]) is None
    swapped = [PRINTED[1], PRINTED[0], *PRINTED[2:]]
    assert compare("SELECT * FROM v ORDER BY id + 1", PRINTED, swapped, None).status == "failed"
    assert compare("SELECT * FROM v", PRINTED, list(reversed(PRINTED))).status == "passed"
