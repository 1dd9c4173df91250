"""A batch's columns travel as PostgreSQL array literals: what each kind of value looks like."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal
from uuid import UUID

import pytest

from pipelines.cv.sqltext.arrays import array_literal, ops_literal


@pytest.mark.parametrize(
    ("values", "kind", "literal"),
    [
        ([1, -2, 2**63 - 1], "bigint", "{1,-2,9223372036854775807}"),
        ([1, None], "integer", "{1,NULL}"),
        ([Decimal("1.50"), Decimal("1E+3"), 7], "numeric", "{1.50,1E+3,7}"),
        ([0.1, 1e-05, 12.5], "double", "{0.1,1e-05,12.5}"),
        ([True, False], "boolean", "{True,False}"),
        ([datetime(2026, 11, 23, 10, 0, 0, 123000, tzinfo=UTC)], "timestamptz", "{2026-11-23T10:00:00.123000+00:00}"),
        ([date(2026, 11, 23)], "date", "{2026-11-23}"),
        ([UUID("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0")], "uuid", "{0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0}"),
        (['{"a": [1, "x"]}', "0.1000000000000000055"], "jsonb", '{"{\\"a\\": [1, \\"x\\"]}","0.1000000000000000055"}'),
        ([], "text", "{}"),
    ],
)
def test_each_kind_prints_as_its_array_input_reads_it(values, kind, literal):
    assert array_literal(values, kind) == literal


def test_text_is_quoted_so_that_commas_braces_spaces_and_the_word_null_stay_text():
    assert array_literal(["a,b", "{c}", " d ", "NULL", ""], "text") == '{"a,b","{c}"," d ","NULL",""}'


def test_quotes_and_backslashes_in_text_are_escaped():
    assert array_literal(['say "hi"', "C:\\dir"], "varchar") == '{"say \\"hi\\"","C:\\\\dir"}'


def test_a_text_value_holding_the_joining_separator_is_escaped_on_its_own():
    assert array_literal(["a\x1fb", "c"], "text") == '{"a\x1fb","c"}'


def test_null_text_is_unquoted_null():
    assert array_literal(["a", None], "text") == '{"a",NULL}'


def test_ops_are_a_plain_integer_list():
    assert ops_literal([1, -1, 1]) == "{1,-1,1}"
