"""combine() in a plain query over a view's rows (migration 0041), in rolled-back transactions.

PipelineDB's `SELECT hll_cardinality(combine(hll_agg)) FROM v` and `SELECT topk(combine(topk_agg))
FROM v`: the view's HyperLogLogs unioned, its top-k lists merged.
"""

from __future__ import annotations

import psycopg
import pytest
from psycopg.types.json import Jsonb


@pytest.fixture
def reader(pg):
    with pg("sv_reader") as conn:
        yield conn  # nothing is committed


def test_combine_of_hyperloglogs_is_their_union(reader):
    row = reader.execute(
        "SELECT hll_cardinality(combine(s)), hll_cardinality(hll_union_agg(s)) FROM ("
        " SELECT hll_add_agg(hll_hash_integer(i)) AS s FROM generate_series(1, 100) AS i"
        " UNION ALL SELECT hll_add_agg(hll_hash_integer(i)) FROM generate_series(51, 150) AS i"
        " UNION ALL SELECT NULL::hll) AS v"
    ).fetchone()
    assert row[0] == row[1]
    assert abs(row[0] - 150) <= 150 * 0.05


def test_combine_of_top_k_lists_sums_each_values_counts_and_keeps_the_longest_lists_k(reader):
    lists = [
        [{"value": 3, "count": 2}, {"value": 1, "count": 2}],
        [{"value": 4, "count": 3}, {"value": 3, "count": 2}],
        None,
    ]
    merged = reader.execute(
        "SELECT combine(t) FROM unnest(%s::jsonb[]) AS t", ([Jsonb(x) if x else None for x in lists],)
    ).fetchone()[0]
    assert merged == [{"value": 3, "count": 4}, {"value": 4, "count": 3}]  # k = 2; 1 (2) falls out
    rows = reader.execute("SELECT * FROM topk(%s)", (Jsonb(merged),)).fetchall()
    assert rows == [("3", 4), ("4", 3)]


def test_combine_of_another_jsonb_says_what_it_merges(reader):
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="merges topk_agg outputs"):
        reader.execute("SELECT combine(x) FROM (SELECT '{\"a\": 1}'::jsonb AS x) AS v")
