"""PipelineDB's query shapes, as written, equal PostgreSQL's own SELECT over the same rows, however batched.

Views without GROUP BY, GROUP BY expressions that are no output, SELECT DISTINCT, aliased and
schema-qualified streams with arrival_timestamp, joins written every way, `sw` and `ttl_column`.
The oracle is the view's own SELECT over the rows in a temporary table named like the stream (joined
with the same table); for the forms PostgreSQL reads otherwise (`public.<stream>`, arrival_timestamp,
the sw option) the oracle is written as PostgreSQL reads it. A subquery in FROM that only projects and
filters is PostgreSQL's own subquery in the oracle.
"""

from __future__ import annotations

import itertools
import math
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines.cv import catalog
from pipelines.cv.model import DefinitionError
from tests.integration.conftest import apply_rows, as_stream_table, throwaway_views, unique

COLUMNS = "url text, uid bigint, latency double precision, ts timestamptz"
KEYED_COLUMNS = "g bigint, id bigint, x bigint"
# name: (definition, PostgreSQL's reading of it over the rows); {s} the stream, {t} the table.
SHAPES = {
    "forever": ("SELECT count(*), avg(latency), min(uid), max(ts) FROM {s}", None),
    "hidden": ("SELECT count(*) AS n, sum(latency) AS total FROM {s} GROUP BY url, uid % 2", None),
    "distinct": ("SELECT DISTINCT url, uid % 3 AS m FROM {s}", None),
    "unnamed": (
        "SELECT uid::text, upper(url), coalesce(uid, 0) + 1 AS next, count(*) FROM {s} GROUP BY uid, url",
        None,
    ),
    "aliased": (
        "SELECT x.url, max(x.arrival_timestamp) AS last, count(*) AS n FROM public.{s} AS x GROUP BY x.url",
        "SELECT x.url, max(x.ts) AS last, count(*) AS n FROM {s} AS x GROUP BY x.url",
    ),
    "arrival": (
        "SELECT arrival_timestamp, {s}.url, count(*) FROM {s} GROUP BY 1, 2",
        "SELECT ts AS arrival_timestamp, url, count(*) FROM {s} GROUP BY 1, 2",
    ),
    "table_first": ("SELECT p.section, count(*) AS n FROM {t} p JOIN {s} c ON p.url = c.url GROUP BY p.section", None),
    "comma": (
        "SELECT p.section, sum(c.latency) AS total FROM {s} c, {t} p WHERE p.url = c.url AND c.uid > 1"
        " GROUP BY p.section",
        None,
    ),
    "using": (
        "SELECT url, coalesce(max(section), 'none') AS section, count(*) AS n FROM {s} LEFT JOIN {t} USING (url)"
        " GROUP BY url",
        None,
    ),
    "right": (
        "SELECT p.section, count(*) AS n, avg(c.latency) AS a FROM {t} p RIGHT JOIN {s} c ON p.url = c.url"
        " GROUP BY p.section",
        None,
    ),
    "anonymous": ("SELECT url, count(*) + sum(uid) FROM {s} GROUP BY url", None),
    "hypothetical": (  # hypothetical-set aggregates: the counts they are
        "SELECT url, rank(3) WITHIN GROUP (ORDER BY uid) AS r, percent_rank(2.5) WITHIN GROUP (ORDER BY latency DESC)"
        " AS p, cume_dist(3, 100) WITHIN GROUP (ORDER BY uid, latency NULLS FIRST) AS c FROM {s} GROUP BY url",
        None,
    ),
    "subselect": (  # a subquery that projects and filters the stream: merged into the view
        "SELECT a, sum(b) AS total, count(*) AS n FROM (SELECT upper(url) AS a, latency AS b FROM {s} WHERE uid > 1) q"
        " WHERE b < 400 GROUP BY a",
        None,
    ),
    "constant": ("SELECT 1, 'a' AS a, count(*) FROM {s}", None),
    "rows": ("SELECT url, uid, latency FROM {s}", None),
    "recent_rows": (
        "SELECT url, uid FROM {s} WHERE arrival_timestamp > clock_timestamp() - interval '1 hour'",
        "SELECT url, uid FROM {s} WHERE ts > now() - interval '1 hour'",
    ),
    "rows_ttl": (
        "SELECT arrival_timestamp AS at, url FROM {s}",
        "SELECT ts AS at, url FROM {s} WHERE ts >= now() - interval '1 hour'",
    ),
    "windowed": (
        "SELECT url, count(*) AS n FROM {s} GROUP BY url",
        "SELECT url, count(*) AS n FROM {s} WHERE ts > now() - interval '1 hour' GROUP BY url",
    ),
    "window_forever": (
        "SELECT count(*) AS n, avg(latency) AS a, max(uid) AS hi FROM {s}",
        "SELECT count(*) AS n, avg(latency) AS a, max(uid) AS hi FROM {s} WHERE ts > now() - interval '1 hour'",
    ),
    "expiring": (
        "SELECT ts, count(*) AS n FROM {s} GROUP BY ts",
        "SELECT ts, count(*) AS n FROM {s} WHERE ts >= now() - interval '1 hour' GROUP BY ts",
    ),
}
OPTIONS = {
    "windowed": "WITH (sw = '1 hour', step_factor = 10)",
    "window_forever": "WITH (sw = '1 hour')",
    "expiring": "WITH (ttl = '1 hour', ttl_column = 'ts')",
    "forever": "WITH (changes = true)",
    "rows_ttl": "WITH (ttl = '1 hour', ttl_column = 'at')",
    "hidden": "WITH (fillfactor = 42)",
}
KEYED_VIEW = (
    "SELECT count(*) AS n, sum(x) AS total, avg(x) AS mean, count(DISTINCT x) AS dx, min(x) AS lo, max(x) AS hi"
    " FROM {k}"
)


@pytest.fixture(scope="module")
def streams(stack, pg):
    name = unique("shapes")
    stream, keyed, quiet, table = f"{name}_ev", f"{name}_kv", f"{name}_quiet", f"{name}.pages"
    with pg("sv_owner", autocommit=True) as owner:
        owner.execute(f"CREATE SCHEMA {name}")
        owner.execute(f"CREATE TABLE {table} (url text PRIMARY KEY, section text NOT NULL)")
        owner.execute(f"INSERT INTO {table} SELECT '/p' || i, 's' || (i % 3) FROM generate_series(0, 5) i")
    views = "\n".join(
        f"CREATE CONTINUOUS VIEW {name}.{view} {OPTIONS.get(view, '')} AS {text.format(s=stream, t=table)};"
        for view, (text, _) in SHAPES.items()
    )
    definitions = f"""
        CREATE STREAM {stream} ({COLUMNS}) WITH (topic = '{stream}', timestamp_column = 'ts');
        CREATE STREAM {keyed} ({KEYED_COLUMNS}) WITH (topic = '{keyed}', key = 'g, id');
        CREATE STREAM {quiet} ({COLUMNS}) WITH (topic = '{quiet}');
        {views}
        CREATE CONTINUOUS VIEW {name}.keyed_forever AS {KEYED_VIEW.format(k=keyed)};
        CREATE CONTINUOUS VIEW {name}.keyed_rows AS SELECT g, x FROM {keyed};
        CREATE CONTINUOUS VIEW {name}.quiet AS SELECT count(*) AS n, count(DISTINCT uid) AS u, sum(latency) AS total
            FROM {quiet};
    """
    with throwaway_views(pg, name, [stream, keyed, quiet], definitions, schema_exists=True):
        yield {"schema": name, "stream": stream, "keyed": keyed, "table": table}


def rows_of(result):
    return sorted(([round(v, 9) if isinstance(v, float) else v for v in r] for r in result), key=repr)


def oracle(conn, stream, columns, rows, query):
    with conn.transaction(force_rollback=True):
        as_stream_table(conn, stream, columns, rows)
        return rows_of(conn.execute(query).fetchall())


def close_rows(got, expected):
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        for a, b in zip(g, e, strict=True):
            same = a == b or (isinstance(a, float) and b is not None and math.isclose(a, b, rel_tol=1e-12))
            assert same, (got, expected)


example = itertools.count(1)
NOW = datetime.now(UTC)
# Minutes ago: inside the hour, or well out of it (a window's edge is exact to one step, a minute here).
AGO = st.one_of(st.integers(0, 50), st.integers(70, 180))
event = st.tuples(st.integers(0, 7), st.integers(0, 5), st.one_of(st.none(), st.floats(0, 1e3)), AGO)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=st.lists(event, max_size=30), cuts=st.lists(st.integers(0, 30), max_size=3))
def test_each_shape_equals_postgresqls_select_over_the_same_rows(writer, streams, events, cuts):
    schema, stream = streams["schema"], streams["stream"]
    k = next(example)
    rows = [
        (f"/p{u}" if u < 6 else f"/x{u}", uid, ms, NOW - timedelta(minutes=ago, seconds=k))
        for u, uid, ms, ago in events
    ]
    with writer.transaction():  # each example from empty views
        for (table,) in writer.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'cv' AND tablename LIKE %s", (f"{schema}\\_\\_%",)
        ).fetchall():
            writer.execute(f'DELETE FROM cv."{table}"')
    bounds = sorted({0, len(rows), *(c for c in cuts if c <= len(rows))})
    for start, end in itertools.pairwise(bounds):
        apply_rows(writer, stream, [1] * (end - start), rows[start:end])
    for view, (text, reading) in SHAPES.items():
        query = (reading or text).format(s=stream, t=streams["table"])
        expected = oracle(writer, stream, COLUMNS, rows, query)
        got = rows_of(writer.execute(f"SELECT * FROM {schema}.{view}").fetchall())
        close_rows(got, expected)


keyed_event = st.tuples(st.sampled_from([1, 1, -1]), st.integers(0, 2), st.integers(0, 4), st.integers(-50, 50))
KEYED_STATE: dict[tuple[int, int], tuple[int, int, int]] = {}  # the keyed stream's rows across examples


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=st.lists(keyed_event, max_size=25), cuts=st.lists(st.integers(0, 25), max_size=3))
def test_a_view_without_group_by_over_a_keyed_stream_follows_its_retractions(writer, streams, events, cuts):
    bounds = sorted({0, len(events), *(c for c in cuts if c <= len(events))})
    for start, end in itertools.pairwise(bounds):
        batch = events[start:end]
        apply_rows(writer, streams["keyed"], [e[0] for e in batch], [(g, i, x) for _, g, i, x in batch])
    for op, g, i, x in events:
        if op == 1 and (g, i) not in KEYED_STATE:
            KEYED_STATE[(g, i)] = (g, i, x)
        elif op == -1:
            KEYED_STATE.pop((g, i), None)
    query = KEYED_VIEW.format(k=streams["keyed"])
    expected = oracle(writer, streams["keyed"], KEYED_COLUMNS, KEYED_STATE.values(), query)
    close_rows(rows_of(writer.execute(f"SELECT * FROM {streams['schema']}.keyed_forever").fetchall()), expected)
    expected = oracle(
        writer, streams["keyed"], KEYED_COLUMNS, KEYED_STATE.values(), f"SELECT g, x FROM {streams['keyed']}"
    )
    assert rows_of(writer.execute(f"SELECT * FROM {streams['schema']}.keyed_rows").fetchall()) == expected


def test_a_view_without_group_by_is_one_row_before_any_event_as_postgresql_answers(writer, streams):
    got = writer.execute(f"SELECT * FROM {streams['schema']}.quiet").fetchall()
    assert got == [(0, 0, None)]


def test_the_change_stream_of_a_view_without_group_by_has_the_empty_key(writer, streams):
    apply_rows(writer, streams["stream"], [1], [("/p1", 1, 2.0, NOW)])
    keys = writer.execute(
        "SELECT DISTINCT key FROM cv.view_changes WHERE view = %s", (f"{streams['schema']}.forever",)
    ).fetchall()
    assert keys == [({},)]


@pytest.mark.parametrize("upstream", ["forever", "hidden"])
def test_a_view_over_a_view_that_hides_its_groups_is_refused_naming_output_of(pg, streams, upstream):
    schema = streams["schema"]
    with pg("sv_owner", autocommit=True) as conn, pytest.raises(DefinitionError, match=r"output_of\("):
        catalog.define(conn, f"CREATE CONTINUOUS VIEW {schema}.over AS SELECT count(*) AS n FROM {schema}.{upstream}")


def test_a_set_returning_function_is_refused_in_one_line(pg, streams):
    schema, stream = streams["schema"], streams["stream"]
    with pg("sv_owner", autocommit=True) as conn, pytest.raises(DefinitionError, match="set-returning function"):
        catalog.define(conn, f"CREATE CONTINUOUS VIEW {schema}.srf AS SELECT unnest(ARRAY[uid]) AS u FROM {stream}")
