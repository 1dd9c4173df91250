"""DISTINCT aggregates over several expressions in one view equal PostgreSQL's over the same rows.

Each expression keeps reference counts of its own (`<storage>__refs`, `__refs2`, ...), so a keyed
stream's retraction takes a value back from exactly the expressions whose last row it was. The oracle
is PostgreSQL: the stream's current rows in a temporary table named like the stream, the view's own
SELECT over it, for any batching of the same events.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines.cv import catalog
from pipelines.cv.catalog.locks import mark_catalog_ddl
from pipelines.cv.engine import StreamMaintainer
from pipelines.cv.model import DefinitionError
from tests.integration.conftest import apply_rows, as_stream_table, throwaway_views, unique, wait_for

TWO = "SELECT g, count(DISTINCT uid) AS users, count(DISTINCT url) AS urls, count(*) AS n FROM {stream} GROUP BY g"
THREE = """
    SELECT g, count(DISTINCT uid) AS users, count(DISTINCT url) AS urls, sum(DISTINCT ms) AS sum_ms,
           avg(DISTINCT ms) AS avg_ms, array_agg(DISTINCT url) AS each_url, count(DISTINCT k) AS keys,
           json_agg(DISTINCT url) AS urls_json, string_agg(DISTINCT url, ',') AS urls_text,
           jsonb_agg(DISTINCT ms) AS ms_jsonb, count(*) AS n
    FROM {stream} GROUP BY g"""
KEYED_COLUMNS = "g bigint, k bigint, uid bigint, url text, ms int"
APPEND_COLUMNS = "g bigint, k bigint, uid bigint, url text, ms int"


@pytest.fixture(scope="module")
def streams(stack, pg):
    """Rows go through the engine directly; a consumer group no runner runs keeps the supervised one away."""
    name = unique("dx")
    keyed, append = f"{name}_keyed", f"{name}_events"
    definitions = f"""
        CREATE STREAM {keyed} ({KEYED_COLUMNS}) WITH (topic = '{keyed}', key = 'g, k', consumer_group = '{name}');
        CREATE STREAM {append} ({APPEND_COLUMNS}) WITH (topic = '{append}', consumer_group = '{name}');
        CREATE CONTINUOUS VIEW {name}.keyed_two AS {TWO.format(stream=keyed)};
        CREATE CONTINUOUS VIEW {name}.keyed_three AS {THREE.format(stream=keyed)};
        CREATE CONTINUOUS VIEW {name}.append_two AS {TWO.format(stream=append)};
        CREATE CONTINUOUS VIEW {name}.append_three AS {THREE.format(stream=append)};
    """
    with throwaway_views(pg, name, [keyed, append], definitions):
        yield {"schema": name, "keyed": keyed, "append": append}


def rows_of(conn, query, groups):
    result = conn.execute(f"SELECT * FROM ({query}) AS q WHERE g = ANY(%s) ORDER BY g", (groups,))
    return [dict(zip([d.name for d in result.description], r, strict=True)) for r in result]


def as_sets(rows):
    """array_agg(DISTINCT) compared as PostgreSQL lists it: the values in order, NULL last."""
    for row in rows:
        if row.get("each_url") is not None:
            values = row["each_url"]
            row["each_url"] = sorted(v for v in values if v is not None) + [None] * values.count(None)
    return rows


def recomputed(conn, stream, columns, rows, query, groups):
    """The view's own SELECT over `rows` in a temporary table named like the stream (rolled back)."""
    with conn.transaction(force_rollback=True):
        as_stream_table(conn, stream, columns, rows)
        return rows_of(conn, query, groups)


def in_batches(conn, stream, ops, rows, cuts):
    bounds = sorted({0, len(rows), *(c for c in cuts if c <= len(rows))})
    for start, end in itertools.pairwise(bounds):
        apply_rows(conn, stream, ops[start:end], rows[start:end])


example = itertools.count(1)
value = {
    "uid": st.one_of(st.none(), st.integers(1, 4)),
    "url": st.one_of(st.none(), st.sampled_from(["/a", "/b", "/c"])),
    "ms": st.one_of(st.none(), st.integers(1, 5)),
}
keyed_event = st.tuples(
    st.sampled_from([1, 1, 1, -1]), st.integers(0, 1), st.integers(0, 5), value["uid"], value["url"], value["ms"]
)
append_event = st.tuples(st.integers(0, 1), st.integers(0, 5), value["uid"], value["url"], value["ms"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=st.lists(keyed_event, max_size=30), cuts=st.lists(st.integers(0, 30), max_size=3))
def test_several_distinct_expressions_over_a_keyed_stream_equal_postgresql_after_any_retractions(
    writer, streams, events, cuts
):
    base = next(example) * 10
    rows = [(base + g, k, uid, url, ms) for _, g, k, uid, url, ms in events]
    in_batches(writer, streams["keyed"], [e[0] for e in events], rows, cuts)
    state = {}
    for (op, *_), row in zip(events, rows, strict=True):
        if op == 1 and row[:2] not in state:
            state[row[:2]] = row
        elif op == -1:
            state.pop(row[:2], None)
    groups = [base, base + 1]
    for view, query in (("keyed_two", TWO), ("keyed_three", THREE)):
        expected = recomputed(
            writer, streams["keyed"], KEYED_COLUMNS, state.values(), query.format(stream=streams["keyed"]), groups
        )
        assert as_sets(rows_of(writer, f"SELECT * FROM {streams['schema']}.{view}", groups)) == expected, view


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=st.lists(append_event, max_size=40), cuts=st.lists(st.integers(0, 40), max_size=3))
def test_several_distinct_expressions_over_an_append_only_stream_equal_postgresql(writer, streams, events, cuts):
    base = 1_000_000 + next(example) * 10
    rows = [(base + g, k, uid, url, ms) for g, k, uid, url, ms in events]
    in_batches(writer, streams["append"], [1] * len(rows), rows, cuts)
    groups = [base, base + 1]
    for view, query in (("append_two", TWO), ("append_three", THREE)):
        expected = recomputed(
            writer, streams["append"], APPEND_COLUMNS, rows, query.format(stream=streams["append"]), groups
        )
        assert as_sets(rows_of(writer, f"SELECT * FROM {streams['schema']}.{view}", groups)) == expected, view


def refs_tables(conn, schema, view):
    found = conn.execute(
        "SELECT relname FROM pg_class WHERE relnamespace = 'cv'::regnamespace AND relkind = 'r' AND relname ~ %s"
        " ORDER BY relname",
        (f"^{schema}__{view}__refs",),
    )
    return [name for (name,) in found]


def test_each_expression_the_key_does_not_cover_keeps_its_own_reference_counts(pg, streams):
    schema = streams["schema"]
    with pg("sv_owner", autocommit=True) as conn:
        # uid, url, ms, k in order; k is part of the keyed stream's key: per group, each k is one row,
        # so its deltas are its transitions and it needs no counts.
        assert refs_tables(conn, schema, "keyed_three") == [f"{schema}__keyed_three__refs{s}" for s in ("", "2", "3")]
        assert refs_tables(conn, schema, "append_three") == [
            f"{schema}__append_three__refs{s}" for s in ("", "2", "3", "4")
        ]


def test_truncate_replace_and_drop_take_every_expressions_reference_counts(pg, writer, streams):
    schema, append = streams["schema"], streams["append"]
    with pg("sv_owner", autocommit=True) as conn:
        catalog.define(conn, f"CREATE CONTINUOUS VIEW {schema}.again AS {TWO.format(stream=append)}")
        apply_rows(writer, append, [1, 1], [(-1, 1, 7, "/a", 1), (-1, 2, 8, "/b", 1)])
        conn.execute("SELECT pipelinedb.truncate_continuous_view(%s)", (f"{schema}.again",))
        for table in refs_tables(conn, schema, "again"):
            assert conn.execute(f"SELECT count(*) FROM cv.{table}").fetchone() == (0,), table
        # The same values count again after the truncate, in each expression.
        apply_rows(writer, append, [1], [(-1, 1, 7, "/a", 1)])
        assert conn.execute(f"SELECT users, urls, n FROM {schema}.again").fetchall() == [(1, 1, 1)]
        catalog.define(
            conn,
            f"CREATE OR REPLACE CONTINUOUS VIEW {schema}.again AS SELECT g, count(DISTINCT uid) AS users,"
            f" count(DISTINCT url) AS urls, count(DISTINCT ms) AS each_ms FROM {append} GROUP BY g",
        )
        assert len(refs_tables(conn, schema, "again")) == 3
        catalog.define(conn, f"DROP CONTINUOUS VIEW {schema}.again")
        assert refs_tables(conn, schema, "again") == []


def test_combine_of_a_distinct_count_beside_other_expressions_is_refused_in_one_line(pg, streams):
    """Its sets are not captured with the view's changes: the line says so and what to keep instead."""
    with pg("sv_owner", autocommit=True) as conn, pytest.raises(DefinitionError, match="other expressions too"):
        catalog.define(
            conn,
            f"CREATE CONTINUOUS VIEW {streams['schema']}.combined AS"
            f" SELECT combine(users) AS users FROM {streams['schema']}.append_two",
        )


def test_a_replays_shadow_is_dropped_with_every_expressions_reference_counts(pg, streams):
    """cv.drop_replay_shadow (and swap_replay) find a view's tables by name: __refs<n> among them (0039)."""
    schema, append = streams["schema"], streams["append"]
    with pg("sv_owner", autocommit=True) as conn:
        catalog.define(conn, f"CREATE CONTINUOUS VIEW {schema}.shadowed AS {TWO.format(stream=append)}")
        assert len(refs_tables(conn, schema, "shadowed")) == 2
        with conn.transaction():  # the catalog's own DDL, as a replay's cancel or swap marks it (sql/guards.sql)
            mark_catalog_ddl(conn)
            conn.execute("SELECT cv.drop_replay_shadow(%s)", (f"{schema}.shadowed",))
        assert refs_tables(conn, schema, "shadowed") == []


def test_a_view_defined_over_a_keyed_streams_state_is_backfilled_into_every_expressions_counts(pg, writer, streams):
    """Filled from the stream's current rows, it equals the view that saw each event and retraction."""
    schema, keyed = streams["schema"], streams["keyed"]
    rows = [(-5, 1, 1, "/a", 1), (-5, 2, 1, "/b", 2), (-5, 3, 2, "/b", 2), (-6, 1, 3, None, None)]
    apply_rows(writer, keyed, [1] * len(rows), rows)
    apply_rows(writer, keyed, [-1], [rows[1]])
    with pg("sv_owner", autocommit=True) as conn:
        catalog.define(conn, f"CREATE CONTINUOUS VIEW {schema}.late AS {THREE.format(stream=keyed)}")
        late = rows_of(conn, f"SELECT * FROM {schema}.late", [-6, -5])
        assert late == rows_of(conn, f"SELECT * FROM {schema}.keyed_three", [-6, -5])
        assert [(r["users"], r["urls"], r["sum_ms"]) for r in late] == [(1, 0, None), (2, 2, 3)]
        catalog.define(conn, f"DROP CONTINUOUS VIEW {schema}.late")


def test_retention_deletes_expired_buckets_values_from_every_expressions_counts(pg, writer, streams):
    schema = streams["schema"]
    timed = f"{schema}_timed"
    with pg("sv_owner", autocommit=True) as conn:
        catalog.define(
            conn,
            f"CREATE STREAM {timed} (ts timestamptz, uid bigint, url text) WITH (topic = '{timed}',"
            f" consumer_group = '{schema}');"
            f"CREATE CONTINUOUS VIEW {schema}.per_second WITH (ttl = '1 second') AS"
            f" SELECT date_trunc('second', ts) AS second, count(DISTINCT uid) AS users, count(DISTINCT url) AS urls"
            f" FROM {timed} GROUP BY second",
        )
        try:
            now = conn.execute("SELECT now()").fetchone()[0]
            apply_rows(writer, timed, [1, 1], [(now, 1, "/a"), (now, 2, "/b")])
            counted = [
                conn.execute(f"SELECT count(*) FROM cv.{t}").fetchone()[0]
                for t in refs_tables(conn, schema, "per_second")
            ]
            assert counted == [2, 2]
            maintainer = StreamMaintainer(timed)

            def expired() -> bool:
                with writer.transaction():
                    maintainer.expire(writer)
                tables = refs_tables(conn, schema, "per_second")
                return all(conn.execute(f"SELECT count(*) FROM cv.{t}").fetchone()[0] == 0 for t in tables)

            wait_for(expired, timeout=30, what="the expired second's values gone from __refs and __refs2")
        finally:
            catalog.define(conn, f"DROP CONTINUOUS VIEW {schema}.per_second")
            catalog.drop(conn, [timed], "stream")
