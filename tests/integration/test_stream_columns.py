"""ALTER STREAM ADD COLUMN while events flow, views kept; DROP COLUMN when no view reads it.

Each test runs its own stream runner (a real subprocess). Events carrying the new field are
produced right after the ALTER commits, before the runner has read the catalog again: none may be
dead-lettered, and none counted twice. The same holds for a stream dropped and declared again.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from confluent_kafka import Producer

from pipelines.cv import catalog
from pipelines.cv.model import DefinitionError
from tests.integration.conftest import start_runner, stop_runner, throwaway_views, unique, wait_for

pytestmark = pytest.mark.integration


def produce(kafka, topic: str, events: list[dict]) -> None:
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "enable.idempotence": True, "linger.ms": 5})
    for event in events:
        producer.produce(topic, value=json.dumps(event), key=str(event.get("id", "")).encode())
    assert producer.flush(30) == 0


def rows(pg, query: str) -> dict:
    with pg("sv_owner") as conn:
        return {k: int(v) if isinstance(v, int) else v for k, v in conn.execute(query).fetchall()}


def dead_letters(pg, group: str) -> dict[str, int]:
    with pg("sv_owner") as conn:
        return dict(conn.execute("SELECT reason, count FROM ops.dead_letters WHERE group_id = %s", (group,)))


def define(pg, text: str) -> list[str]:
    with pg("sv_owner", autocommit=True) as conn:
        return catalog.define(conn, text)


@contextmanager
def clicks(stack, pg, **env: str) -> Iterator[tuple[str, str, str]]:
    """An append-only stream of urls with a view counting them, and its runner: (group, schema, stream)."""
    group, schema = unique("it-addcol"), unique("addcol")
    stream = f"{schema}_clicks"
    definitions = f"""
        CREATE STREAM {stream} (url text NOT NULL) WITH (consumer_group = '{group}');
        CREATE CONTINUOUS VIEW {schema}.by_url AS SELECT url, count(*) AS n FROM {stream} GROUP BY url;
    """
    with throwaway_views(pg, schema, [stream], definitions):
        runner = start_runner(stack, group, **env)
        try:
            yield group, schema, stream
        finally:
            stop_runner(runner)


def test_a_column_added_to_an_append_only_stream_while_events_flow(stack, pg, kafka):
    with clicks(stack, pg) as (group, schema, stream):
        produce(kafka, stream, [{"url": "/a"}] * 30)
        wait_for(lambda: rows(pg, f"SELECT url, n FROM {schema}.by_url") == {"/a": 30}, what="before the change")

        assert define(pg, f"ALTER STREAM {stream} ADD COLUMN country text DEFAULT 'unknown';") == [
            f"stream {stream} altered: column country added"
        ]
        produce(kafka, stream, [{"url": "/a", "country": "fr"}] * 20 + [{"url": "/b"}] * 10)  # at once
        wait_for(
            lambda: rows(pg, f"SELECT url, n FROM {schema}.by_url") == {"/a": 50, "/b": 10},
            what="the view kept its state and counted every event after the change once",
        )
        # A view of the new column sees the history too (backfilled): older events with the default.
        define(
            pg,
            f"CREATE CONTINUOUS VIEW {schema}.by_country AS "
            f"SELECT country, count(*) AS n FROM {stream} GROUP BY country",
        )
        wait_for(
            lambda: rows(pg, f"SELECT country, n FROM {schema}.by_country") == {"unknown": 40, "fr": 20},
            what="the new view over every retained event",
        )
        assert dead_letters(pg, group) == {}


def test_events_with_the_new_field_are_decoded_anew_even_before_the_runner_reads_the_catalog(stack, pg, kafka):
    # The catalog is read at start only: the decoder can learn of the ALTER from a refused event alone.
    with clicks(stack, pg, PIPELINE_CATALOG_POLL_S="3600") as (group, schema, stream):
        produce(kafka, stream, [{"url": "/a"}] * 5)
        wait_for(lambda: rows(pg, f"SELECT url, n FROM {schema}.by_url") == {"/a": 5}, what="before the change")
        define(pg, f"ALTER STREAM {stream} ADD COLUMN country text DEFAULT 'unknown';")
        produce(kafka, stream, [{"url": "/a", "country": "fr"}] * 7 + [{"url": "/b"}] * 3)
        wait_for(lambda: rows(pg, f"SELECT url, n FROM {schema}.by_url") == {"/a": 12, "/b": 3}, what="after")
        assert dead_letters(pg, group) == {}


def test_a_stream_declared_again_decodes_its_events_anew_even_before_the_runner_reads_the_catalog(stack, pg, kafka):
    # Declared again with `url` now optional: the old decoder would dead-letter events without it.
    with clicks(stack, pg, PIPELINE_CATALOG_POLL_S="3600") as (group, schema, stream):
        produce(kafka, stream, [{"url": "/a"}] * 5)
        wait_for(lambda: rows(pg, f"SELECT url, n FROM {schema}.by_url") == {"/a": 5}, what="before the change")
        define(
            pg,
            f"""DROP CONTINUOUS VIEW {schema}.by_url; DROP STREAM {stream};
            CREATE STREAM {stream} (url text) WITH (consumer_group = '{group}');
            CREATE CONTINUOUS VIEW {schema}.by_url WITH (backfill = 'none') AS
                SELECT coalesce(url, '?') AS url, count(*) AS n FROM {stream} GROUP BY 1;""",
        )
        produce(kafka, stream, [{"url": "/a"}] * 2 + [{}] * 3)
        wait_for(lambda: rows(pg, f"SELECT url, n FROM {schema}.by_url") == {"/a": 2, "?": 3}, what="after")
        assert dead_letters(pg, group) == {}


def test_a_keyed_stream_gains_a_column_in_its_state_and_loses_it_once_no_view_reads_it(stack, pg, kafka):
    group, schema = unique("it-keycol"), unique("keycol")
    stream = topic = f"{schema}_pages"
    state = f"cv.state_{stream}"
    definitions = f"""
        CREATE STREAM {stream} (id bigint, url text NOT NULL) WITH (key = 'id', consumer_group = '{group}');
        CREATE CONTINUOUS VIEW {schema}.by_url AS SELECT url, count(*) AS n FROM {stream} GROUP BY url;
    """
    with throwaway_views(pg, schema, [stream], definitions):
        runner = start_runner(stack, group)
        try:
            produce(kafka, topic, [{"id": i, "url": "/a"} for i in range(20)])
            wait_for(lambda: rows(pg, f"SELECT url, n FROM {schema}.by_url") == {"/a": 20}, what="before")

            define(pg, f"ALTER STREAM {stream} ADD COLUMN country text DEFAULT 'unknown';")
            produce(kafka, topic, [{"id": i, "url": "/a", "country": "fr"} for i in range(20, 30)])
            wait_for(lambda: rows(pg, f"SELECT url, n FROM {schema}.by_url") == {"/a": 30}, what="after")
            countries = rows(pg, f"SELECT country, count(*) FROM {state} GROUP BY country")
            assert countries == {"unknown": 20, "fr": 10}  # the rows kept before the change took the default

            define(
                pg,
                f"CREATE CONTINUOUS VIEW {schema}.by_country AS "
                f"SELECT country, count(*) AS n FROM {stream} GROUP BY country",
            )
            assert rows(pg, f"SELECT country, n FROM {schema}.by_country") == {"unknown": 20, "fr": 10}
            with pytest.raises(DefinitionError, match=f"DROP COLUMN country: read by {schema}.by_country"):
                define(pg, f"ALTER STREAM {stream} DROP COLUMN country;")
            with pytest.raises(DefinitionError, match="DROP COLUMN id: it is part of the stream's key"):
                define(pg, f"ALTER STREAM {stream} DROP COLUMN id;")

            define(pg, f"DROP CONTINUOUS VIEW {schema}.by_country; ALTER STREAM {stream} DROP COLUMN country;")
            produce(kafka, topic, [{"id": i, "url": "/b"} for i in range(30, 35)])
            wait_for(lambda: rows(pg, f"SELECT url, n FROM {schema}.by_url") == {"/a": 30, "/b": 5}, what="dropped")
            with pg("sv_owner") as conn:
                columns = [c.name for c in conn.execute(f"SELECT * FROM {state} LIMIT 0").description]
            assert columns == ["id", "url"]
            assert dead_letters(pg, group) == {}
        finally:
            stop_runner(runner)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ("ADD COLUMN c text NOT NULL", "ADD COLUMN c NOT NULL needs a DEFAULT: the events before it have no value"),
        ("ADD COLUMN a text", "a column is declared twice"),
        ("ADD COLUMN c text DEFAULT nope()", "c"),
        ("DROP COLUMN zz", "DROP COLUMN zz: the stream has no such column"),
        ("ALTER COLUMN a TYPE bigint", "the type of column a cannot change"),
    ],
)
def test_a_column_change_that_cannot_be_made_is_refused_with_its_reason(pg, change, match):
    stream = unique("colchange")
    with pg("sv_owner", autocommit=True) as conn:
        catalog.define(conn, f"CREATE STREAM {stream} (a text) WITH (consumer_group = 'it-nobody');")
        try:
            with pytest.raises(DefinitionError, match=match):
                catalog.define(conn, f"ALTER STREAM {stream} {change};")
        finally:
            catalog.drop(conn, [stream], "stream")
