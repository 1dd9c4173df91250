"""Sliding windows and stream-table joins as the view parser reads them (no database)."""

from __future__ import annotations

import pytest

from pipelines.cv.frontend.statements import parse
from pipelines.cv.frontend.windows import STEP_COLUMN
from pipelines.cv.model import DefinitionError, Join, JoinedTable, Scope, Window

CLICKS = (
    "CREATE STREAM clicks (url text, uid bigint, ms int, ts timestamptz) WITH (topic = 'c', timestamp_column = 'ts')"
)
LIKES = "CREATE STREAM likes (oid bigint, uid bigint, ts timestamptz) WITH (topic = 'l', key = 'oid, uid')"


@pytest.fixture
def view():
    streams = {}
    for statement in (CLICKS, LIKES):
        stream = parse(statement, Scope(streams, frozenset()))
        streams[stream.name] = stream

    def define(select: str):
        return parse(f"CREATE CONTINUOUS VIEW web.v AS {select}", Scope(streams, frozenset()))

    return define


@pytest.mark.parametrize(
    "condition",
    [
        "ts > now() - interval '5 minutes'",
        "ts >= clock_timestamp() - '5 minutes'::interval",
        "arrival_timestamp > clock_timestamp() - interval '5 minutes'",
        "ts > current_timestamp - interval '5 minutes'",
    ],
)
def test_a_condition_on_now_minus_an_interval_is_a_sliding_window(view, condition):
    parsed = view(f"SELECT url, count(*) AS n FROM clicks WHERE {condition} AND ms > 10 GROUP BY url")
    assert parsed.window == Window("ts", "5 minutes")
    assert parsed.where_sql == "ms > 10"  # the rest of the WHERE clause stays a filter
    assert [g.name for g in parsed.groups] == ["url", STEP_COLUMN]
    assert [o.name for o in parsed.outputs] == ["url", "n"]  # the step is storage, not output


def test_a_window_needs_no_group_by_and_keeps_distinct_counts_as_sketches(view):
    parsed = view("SELECT count(DISTINCT uid) AS users FROM clicks WHERE ts > now() - interval '1 hour'")
    assert [g.name for g in parsed.groups] == [STEP_COLUMN]
    assert [(a.kind, a.arg_sql) for a in parsed.aggregates] == [("hll", "hll_hash_any(uid)")]


@pytest.mark.parametrize(
    ("select", "match"),
    [
        ("SELECT url, count(*) AS n FROM clicks WHERE ms > now() - interval '1 hour' GROUP BY url", "timestamptz"),
        (
            "SELECT oid, count(*) AS n FROM likes WHERE arrival_timestamp > now() - interval '1 hour' GROUP BY oid",
            "timestamp_column",
        ),
        (
            "SELECT url, array_agg(DISTINCT uid) AS u FROM clicks WHERE ts > now() - interval '1 hour' GROUP BY url",
            "sliding-window",
        ),
        (
            "SELECT url, count(*) AS n FROM clicks WHERE ts > now() - interval '1 hour' GROUP BY url",
            None,
        ),
    ],
)
def test_what_a_window_cannot_be_is_refused(view, select, match):
    if match is None:
        assert view(select).window is not None
        return
    with pytest.raises(DefinitionError, match=match):
        view(select)


def test_a_join_enriches_an_append_only_stream_from_a_table(view):
    parsed = view(
        "SELECT p.section, count(*) AS n, avg(c.ms) AS ms FROM clicks AS c LEFT JOIN web.pages p ON p.url = c.url"
        " GROUP BY p.section"
    )
    assert parsed.join == Join("c", (JoinedTable("web.pages", "p", True, "p.url = c.url"),))
    assert [o.name for o in parsed.outputs] == ["section", "n", "ms"]


@pytest.mark.parametrize(
    ("select", "match"),
    [
        ("SELECT p.s, count(*) AS n FROM likes l JOIN pages p ON p.oid = l.oid GROUP BY p.s", "has a key"),
        ("SELECT p.s, count(*) AS n FROM clicks c NATURAL JOIN pages p GROUP BY p.s", "USING"),
        ("SELECT p.s, count(*) AS n FROM clicks c FULL JOIN pages p ON p.url = c.url GROUP BY p.s", "LEFT JOIN"),
        ("SELECT p.s, count(*) AS n FROM clicks c RIGHT JOIN pages p ON p.url = c.url GROUP BY p.s", "LEFT JOIN"),
        ("SELECT x.s, count(*) AS n FROM clicks c JOIN pages p ON p.url = c.url GROUP BY x.s", "neither"),
        ("SELECT c.nope, count(*) AS n FROM clicks c JOIN pages p ON p.url = c.url GROUP BY c.nope", "not a column"),
        ("SELECT p.s, count(*) AS n FROM pages p LEFT JOIN clicks c ON p.url = c.url GROUP BY p.s", "LEFT JOIN"),
    ],
)
def test_a_join_that_cannot_be_kept_is_refused(view, select, match):
    with pytest.raises(DefinitionError, match=match):
        view(select)
