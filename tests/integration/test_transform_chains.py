"""Continuous transforms over transforms, and transforms writing into streams (PipelineDB's insert_into_stream).

A transform reads another transform's output (`FROM output_of('t')`, `FROM t`) as a view over a
transform does: the runner's feeds apply the rows the upstream recorded, exactly once. PipelineDB's
`outputfunc = pipelinedb.insert_into_stream('s')` writes each output row into stream s through its
writable relation, in the batch's own transaction: the rows wait in cv.stream_inbox for the relay,
and a batch rolled back leaves none. The oracle is each SELECT run over the events in PostgreSQL.
"""

from __future__ import annotations

import psycopg
import pytest

from pipelines.cv import catalog
from pipelines.cv.engine import StreamMaintainer
from pipelines.cv.feeds import ViewFeeds
from pipelines.cv.model import DefinitionError
from tests.integration.conftest import apply_rows, throwaway_views, unique


@pytest.fixture
def fanout(stack, pg):
    """PipelineDB's fanout case: each level doubles the rows of the level above, and a count reads the last."""
    name = unique("tch")
    events = f"{name}_events"
    levels = [f"{name}.fan0", f"{name}.fan1", f"{name}.fan2"]
    definitions = f"""
        CREATE STREAM {events} (x int) WITH (topic = '{events}', consumer_group = 'it-{name}');  -- this test feeds
        CREATE VIEW {levels[0]} WITH (action = transform) AS SELECT generate_series(1, 2) AS g, x FROM {events};
        CREATE VIEW {levels[1]} WITH (action = transform) AS
            SELECT generate_series(1, 2) AS g, x + g AS x FROM output_of('{levels[0]}');
        CREATE CONTINUOUS TRANSFORM {levels[2]} AS SELECT g, x * 10 AS x FROM {levels[1]} WHERE g = 1;
        CREATE CONTINUOUS VIEW {name}.total AS SELECT count(*) AS n, sum(x) AS s FROM output_of('{levels[2]}');
    """
    with throwaway_views(pg, name, [events], definitions):
        try:
            yield {"schema": name, "events": events, "levels": levels}
        finally:
            with pg("sv_owner", autocommit=True) as conn:  # downstream first: a transform read is not dropped
                catalog.define(conn, f"DROP CONTINUOUS VIEW IF EXISTS {name}.total")
                for level in reversed(levels):
                    catalog.define(conn, f"DROP CONTINUOUS TRANSFORM IF EXISTS {level}")


def feed_all(conn: psycopg.Connection) -> None:
    feeds = ViewFeeds("", page=3)  # small pages: one upstream batch spans several
    while feeds.step(conn):
        pass


def test_a_chain_of_transforms_equals_the_chain_of_selects_over_the_events(pg, fanout):
    schema, events = fanout["schema"], fanout["events"]
    with pg("sv_writer", autocommit=True) as writer:
        for xs in ([0], [5, 7], [1, 2, 3]):
            apply_rows(writer, events, [1] * len(xs), [(x,) for x in xs])
            feed_all(writer)
        total = writer.execute(f"SELECT n, s FROM {schema}.total").fetchone()
    with pg("sv_owner") as conn:
        want = conn.execute(
            "WITH e(x) AS (VALUES (0), (5), (7), (1), (2), (3)),"
            " l0 AS (SELECT generate_series(1, 2) AS g, x FROM e),"
            " l1 AS (SELECT generate_series(1, 2) AS g, x + g AS x FROM l0)"
            " SELECT count(*), sum(x * 10) FROM l1 WHERE g = 1"
        ).fetchone()
    assert total == want
    assert total[0] == 6 * 2  # two rows per event at level 0, two per row at level 1, one of those kept


def test_a_transform_read_by_another_is_dropped_after_it_and_its_feed_with_the_last(pg, fanout):
    schema, levels = fanout["schema"], fanout["levels"]
    with pg("sv_owner", autocommit=True) as conn:
        with pytest.raises(DefinitionError, match="read its changes; drop them first"):
            catalog.define(conn, f"DROP CONTINUOUS TRANSFORM {levels[1]}")
        catalog.define(conn, f"DROP CONTINUOUS VIEW {schema}.total")
        catalog.define(conn, f"DROP CONTINUOUS TRANSFORM {levels[2]}")
        feeds = conn.execute("SELECT name FROM cv.streams WHERE name = %s", (levels[1],)).fetchall()
        assert feeds == []  # nothing reads fan1 any more: its feed is gone with its last reader
        catalog.define(conn, f"DROP CONTINUOUS TRANSFORM {levels[1]}")


@pytest.fixture
def copying(stack, pg):
    """A transform writing each slow click into a second stream, as PipelineDB's insert_into_stream did."""
    name = unique("tins")
    clicks, slow = f"{name}_clicks", f"{name}_slow"
    definitions = f"""
        CREATE STREAM {clicks} (url text, ms int) WITH (topic = '{clicks}', consumer_group = 'it-{name}');
        CREATE STREAM {slow} (path text, seconds numeric, arrival_timestamp timestamptz DEFAULT now())
            WITH (topic = '{slow}', consumer_group = 'it-{name}');
        CREATE VIEW {name}.to_slow WITH (action = transform, outputfunc = pipelinedb.insert_into_stream('{slow}'))
            AS SELECT lower(url) AS p, ms / 1000.0 AS s FROM {clicks} WHERE ms > 100;
    """
    with throwaway_views(pg, name, [clicks, slow], definitions):
        try:
            yield {"schema": name, "clicks": clicks, "slow": slow}
        finally:
            with pg("sv_owner", autocommit=True) as conn:
                catalog.define(conn, f"DROP CONTINUOUS TRANSFORM IF EXISTS {name}.to_slow")


def inbox(conn: psycopg.Connection, stream: str) -> list[dict]:
    rows = conn.execute("SELECT payload FROM cv.stream_inbox WHERE stream = %s ORDER BY id", (stream,)).fetchall()
    return [{k: v for k, v in payload.items() if k != "arrival_timestamp"} for (payload,) in rows]


def test_insert_into_stream_writes_the_rows_that_pass_into_the_stream_in_the_batchs_transaction(pg, copying):
    clicks, slow = copying["clicks"], copying["slow"]
    with pg("sv_writer", autocommit=True) as writer:
        apply_rows(writer, clicks, [1, 1, 1], [("/A", 250), ("/b", 50), ("/C", 1500)])
        assert inbox(writer, slow) == [{"path": "/a", "seconds": 0.25}, {"path": "/c", "seconds": 1.5}]
        writer.autocommit = False
        StreamMaintainer(clicks).apply(writer, [1], [["/D"], [900]])
        assert len(inbox(writer, slow)) == 3  # written in the batch's transaction...
        writer.rollback()
        writer.autocommit = True
        assert len(inbox(writer, slow)) == 2  # ...and gone with it


def test_insert_into_stream_refuses_other_columns_and_keeps_its_stream_from_being_dropped(pg, copying):
    schema, clicks, slow = copying["schema"], copying["clicks"], copying["slow"]
    with pg("sv_owner", autocommit=True) as conn:
        with pytest.raises(DefinitionError, match=rf"{slow} must have the same columns as the transform"):
            catalog.define(
                conn,
                f"CREATE VIEW {schema}.bad WITH (action = transform, outputfunc = pipelinedb.insert_into_stream("
                f"'{slow}')) AS SELECT ms, url FROM {clicks}",
            )
        with pytest.raises(DefinitionError, match=rf"{schema}.to_slow"):
            catalog.drop(conn, [slow], "stream")
        with pytest.raises(DefinitionError, match=rf"{schema}.to_slow write into it by position"):
            catalog.define(conn, f"ALTER STREAM {slow} ADD COLUMN note text")
