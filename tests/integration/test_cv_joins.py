"""Stream-table joins: each event is enriched at ingest from the table's rows of that moment.

The oracle is the view's own SELECT over the events in a temporary table named like the stream,
joined with the same table; a later change to the table applies to later events only.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines.cv import catalog
from pipelines.cv.model import DefinitionError
from tests.integration.conftest import apply_rows, as_stream_table, throwaway_views, unique

INNER = """SELECT p.section, count(*) AS n, count(DISTINCT c.uid) AS users, avg(c.ms) AS avg_ms
           FROM {stream} AS c JOIN {table} AS p ON p.url = c.url GROUP BY p.section"""
LEFT = """SELECT c.url, coalesce(max(p.section), 'none') AS section, count(*) AS n
          FROM {stream} c LEFT JOIN {table} p ON p.url = c.url GROUP BY c.url"""
# Two tables: each event's page, then its page's section title (s2 has none: LEFT JOIN keeps it, NULL).
TWO = """SELECT t.title, count(*) AS n, sum(c.ms) AS ms
         FROM {stream} c JOIN {table} p ON p.url = c.url LEFT JOIN {titles} t ON t.section = p.section
         GROUP BY t.title"""


@pytest.fixture(scope="module")
def streams(stack, pg):
    name = unique("join")
    stream, table, titles = f"{name}_clicks", f"{name}.pages", f"{name}.titles"
    with pg("sv_owner", autocommit=True) as owner:
        owner.execute(f"CREATE SCHEMA {name}")
        owner.execute(f"CREATE TABLE {table} (url text PRIMARY KEY, section text NOT NULL)")
        owner.execute(f"INSERT INTO {table} SELECT '/p' || i, 's' || (i % 3) FROM generate_series(0, 8) i")
        owner.execute(f"CREATE TABLE {titles} (section text PRIMARY KEY, title text NOT NULL)")
        owner.execute(f"INSERT INTO {titles} VALUES ('s0', 'zero'), ('s1', 'one')")
    definitions = f"""
        CREATE STREAM {stream} (url text, uid bigint, ms int) WITH (topic = '{stream}');
        CREATE CONTINUOUS VIEW {name}.by_section AS {INNER.format(stream=stream, table=table)};
        CREATE CONTINUOUS VIEW {name}.by_url AS {LEFT.format(stream=stream, table=table)};
        CREATE CONTINUOUS VIEW {name}.by_title AS {TWO.format(stream=stream, table=table, titles=titles)};
    """
    with throwaway_views(pg, name, [stream], definitions, schema_exists=True):
        yield {"schema": name, "stream": stream, "table": table, "titles": titles}


def recomputed(conn, streams, rows, query, key, keys):
    with conn.transaction(force_rollback=True):
        as_stream_table(conn, streams["stream"], "url text, uid bigint, ms int", rows)
        query = query.format(stream=streams["stream"], table=streams["table"], titles=streams["titles"])
        if keys is None:
            return conn.execute(f"SELECT * FROM ({query}) q ORDER BY 1").fetchall()
        return conn.execute(f"SELECT * FROM ({query}) q WHERE {key} = ANY(%s) ORDER BY 1", (keys,)).fetchall()


example = itertools.count(1)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    events=st.lists(st.tuples(st.integers(0, 11), st.integers(0, 4), st.integers(0, 500)), max_size=30),
    cuts=st.lists(st.integers(0, 30), max_size=3),
)
def test_a_joined_view_equals_the_join_recomputed_from_the_events(writer, streams, events, cuts):
    k = next(example)
    # urls /p0../p8 are in the table, /p9../p11 are not (dropped by JOIN, 'none' with LEFT JOIN); users
    # and urls of other examples never meet these: each example has its own uid range and url suffix.
    rows = [(f"/p{u}" if u < 9 else f"/x{k}_{u}", k * 100 + uid, ms) for u, uid, ms in events]
    bounds = sorted({0, len(rows), *(c for c in cuts if c <= len(rows))})
    with writer.transaction():  # each example starts from empty views: the table's urls are shared
        writer.execute(f"DELETE FROM cv.{streams['schema']}__by_section")
        writer.execute(f"DELETE FROM cv.{streams['schema']}__by_section__refs")
        writer.execute(f"DELETE FROM cv.{streams['schema']}__by_url WHERE url LIKE '/p%%'")
        writer.execute(f"DELETE FROM cv.{streams['schema']}__by_title")
    for start, end in itertools.pairwise(bounds):
        apply_rows(writer, streams["stream"], [1] * (end - start), rows[start:end])

    sections = ["s0", "s1", "s2"]
    got = writer.execute(f"SELECT * FROM {streams['schema']}.by_section ORDER BY 1").fetchall()
    assert got == recomputed(writer, streams, rows, INNER, "section", sections)
    urls = sorted({r[0] for r in rows})
    got = writer.execute(f"SELECT * FROM {streams['schema']}.by_url WHERE url = ANY(%s) ORDER BY 1", (urls,))
    assert got.fetchall() == recomputed(writer, streams, rows, LEFT, "url", urls)
    got = writer.execute(f"SELECT * FROM {streams['schema']}.by_title ORDER BY 1").fetchall()
    assert got == recomputed(writer, streams, rows, TWO, "title", None)


def test_a_later_change_to_the_table_does_not_rewrite_what_was_counted(pg, writer, streams):
    with pg("sv_owner", autocommit=True) as owner:
        owner.execute(f"INSERT INTO {streams['table']} VALUES ('/moved', 'before')")
        apply_rows(writer, streams["stream"], [1, 1], [("/moved", 1, 10), ("/moved", 2, 10)])
        owner.execute(f"UPDATE {streams['table']} SET section = 'after' WHERE url = '/moved'")
        apply_rows(writer, streams["stream"], [1], [("/moved", 3, 10)])

    got = writer.execute(
        f"SELECT section, n FROM {streams['schema']}.by_section WHERE section IN ('before', 'after') ORDER BY 1"
    )
    assert got.fetchall() == [("after", 1), ("before", 2)]


@pytest.mark.parametrize(
    ("query", "match"),
    [
        ("SELECT p.section, count(*) AS n FROM {keyed} k JOIN {table} p ON p.url = k.url GROUP BY p.section", "key"),
        ("SELECT p.section, count(*) AS n FROM {stream} c NATURAL JOIN {table} p GROUP BY p.section", "USING"),
        ("SELECT p.nope, count(*) AS n FROM {stream} c JOIN {table} p ON p.url = c.url GROUP BY p.nope", "nope"),
        ("SELECT q.section, count(*) AS n FROM {stream} c JOIN {table} p ON p.url = c.url GROUP BY q.section", "q"),
        ("SELECT c.nope, count(*) AS n FROM {stream} c JOIN {table} p ON p.url = c.url GROUP BY c.nope", "nope"),
    ],
)
def test_a_join_that_cannot_be_kept_is_refused_naming_why(pg, streams, query, match):
    keyed = unique("keyed")
    with pg("sv_owner", autocommit=True) as owner:
        keyed_stream = f"CREATE STREAM {keyed} (url text, uid bigint) WITH (topic = '{keyed}', key = 'url, uid')"
        catalog.define(owner, keyed_stream)
        try:
            statement = f"CREATE CONTINUOUS VIEW {streams['schema']}.bad AS " + query.format(
                keyed=keyed, stream=streams["stream"], table=streams["table"]
            )
            with pytest.raises(DefinitionError, match=match):
                catalog.define(owner, statement)
        finally:
            catalog.drop(owner, [keyed], "stream")
