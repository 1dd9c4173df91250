"""A change a feed's reader fails on is dead-lettered and the feed goes on; a broken reader holds its feed.

Views over views and chains of transforms read their upstream's recorded changes through the
runner's feeds (pipelines.cv.feeds). When some upstream rows make the downstream statement raise
(a division by zero), isolation (pipelines.cv.feed_isolation) finds them: the oracle is the
downstream's own SELECT run by PostgreSQL over the good rows only, each bad row is one dead letter
in cv.feed_dead_letters with its reason (counted in ops.dead_letters and the metric), and the
upstream and the readers of its other feeds are unaffected, whatever the batching and page size.
A reader that cannot run at all (the table its transform joins dropped) holds its feed instead:
nothing skipped, and everything applied once it is fixed.
"""

from __future__ import annotations

import json
import random
import signal
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from confluent_kafka import Producer
from prometheus_client import REGISTRY

from pipelines.cv import catalog
from pipelines.cv.feeds import ViewFeeds, feed_states
from tests.integration.conftest import (
    apply_rows,
    as_stream_table,
    start_runner,
    stop_runner,
    throwaway_views,
    unique,
    wait_for,
)
from tests.integration.processes import stop_process
from tests.integration.test_pipeline_recovery import PARTITIONS, committed, high_watermarks

THRESHOLD = 2  # ratio's (new).total / ((new).n - 2) divides by zero when a url's count reaches 2


def chain_definitions(name: str, events: str, topic: str, group: str) -> str:
    """A stream, a transform over it, a transform over that which divides by `d`, and views over each."""
    return f"""
        CREATE STREAM {events} (x int, d int) WITH (topic = '{topic}', consumer_group = '{group}');
        CREATE CONTINUOUS TRANSFORM {name}.t0 AS SELECT x, d FROM {events};
        CREATE CONTINUOUS TRANSFORM {name}.t1 AS SELECT x, 100 / d AS q FROM {name}.t0;
        CREATE CONTINUOUS VIEW {name}.total AS SELECT count(*) AS n, sum(q) AS q, sum(x) AS x FROM {name}.t1;
        CREATE CONTINUOUS VIEW {name}.raw AS SELECT count(*) AS n, sum(x) AS x FROM {events};
    """


@pytest.fixture
def chain(stack, pg):
    name = unique("fdl")
    events = f"{name}_events"
    group = f"it-{name}"  # no runner runs it: this test feeds
    with cleaned(pg, name, group, [events], chain_definitions(name, events, events, group)):
        yield {"schema": name, "events": events, "group": group, "root": events}


@pytest.fixture
def views(stack, pg):
    """A view over a stream, a view over its changes that divides by zero on some, and one over its rows."""
    name = unique("fdv")
    clicks = f"{name}_clicks"
    group = f"it-{name}"
    definitions = f"""
        CREATE STREAM {clicks} (url text, ms int) WITH (topic = '{clicks}', consumer_group = '{group}');
        CREATE CONTINUOUS VIEW {name}.per_url AS
            SELECT url, count(*) AS n, sum(ms) AS total FROM {clicks} GROUP BY url;
        CREATE CONTINUOUS VIEW {name}.ratio AS
            SELECT (new).url AS url, count(*) AS changes, sum((new).total / ((new).n - {THRESHOLD})) AS r
            FROM output_of('{name}.per_url') GROUP BY 1;
        CREATE CONTINUOUS VIEW {name}.by_length AS
            SELECT length(url) AS len, sum(n) AS n, max(total) AS top FROM {name}.per_url GROUP BY 1;
    """
    with cleaned(pg, name, group, [clicks], definitions):
        yield {"schema": name, "clicks": clicks, "group": group, "root": clicks}


@contextmanager
def cleaned(pg, name: str, group: str, streams: list[str], definitions: str) -> Iterator[None]:
    """throwaway_views, the chain's readers dropped first (a transform read by another is dropped after it)."""
    with throwaway_views(pg, name, streams, definitions):
        try:
            yield
        finally:
            with pg("sv_owner", autocommit=True) as conn:
                for kind, reader in (
                    ("VIEW", "total"),
                    ("VIEW", "labels"),
                    ("TRANSFORM", "labelled"),
                    ("TRANSFORM", "t1"),
                ):
                    catalog.define(conn, f"DROP CONTINUOUS {kind} IF EXISTS {name}.{reader}")
                conn.execute(
                    "DELETE FROM ops.dead_letters WHERE group_id = %s OR topic LIKE %s", (group, f"view:%{name}.%")
                )


@pytest.fixture
def writer(pg):
    with pg("sv_writer", autocommit=True) as conn:
        yield conn


def feeds_of(scenario: dict, **settings: object) -> ViewFeeds:
    """Feeds of the scenario's chains only (as a runner of its group would be), counting under its group."""
    return ViewFeeds("", group_id=scenario["group"], roots=lambda stream: stream == scenario["root"], **settings)


def feed_all(conn: psycopg.Connection, scenario: dict, page: int) -> ViewFeeds:
    """The feeds' passes until nothing is left to take (or what is left is held)."""
    feeds = feeds_of(scenario, page=page)
    while feeds.step(conn):
        pass
    return feeds


def dead_letters(conn: psycopg.Connection, feed: str) -> list[tuple]:
    return conn.execute(
        "SELECT position, upstream, reader, reason, detail, change FROM cv.feed_dead_letters"
        " WHERE feed = %s ORDER BY position",
        (feed,),
    ).fetchall()


def counted(conn: psycopg.Connection, feed: str) -> list[tuple]:
    """The feed's dead letters as counted (by any group: a test's feeds may have taken some of its pages)."""
    return conn.execute(
        "SELECT reason, sum(count)::int FROM ops.dead_letters WHERE topic = %s GROUP BY 1 ORDER BY 1", (f"view:{feed}",)
    ).fetchall()


def lag(conn: psycopg.Connection, feed: str) -> int:
    return next(f.lag for f in feed_states(conn) if f.stream == feed)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_transform_chain_dead_letters_the_rows_it_divides_by_zero_and_equals_its_select_over_the_others(
    pg, writer, chain, seed
):
    schema, events, group = chain["schema"], chain["events"], chain["group"]
    rng = random.Random(seed)
    page = rng.choice([1, 3, 37, 10_000])
    rows: list[tuple[int, int]] = []
    for _ in range(12):
        batch = [(rng.randint(-50, 50), rng.choice([-3, -1, 0, 1, 2, 5, 7])) for _ in range(rng.choice([1, 4, 25]))]
        apply_rows(writer, events, [1] * len(batch), batch)
        rows += batch
        if rng.random() < 0.4:  # the feeds run now and then, a page at a time
            feed_all(writer, chain, page)
    feed_all(writer, chain, page)

    bad = sum(1 for _, d in rows if d == 0)
    assert bad, "the seed makes some rows divide by zero"
    with writer.transaction(force_rollback=True):
        as_stream_table(writer, events, "x int, d int", rows)
        want_t1 = sorted(writer.execute(f"SELECT x, 100 / d FROM {events} WHERE d <> 0").fetchall())
        want_total = writer.execute(f"SELECT count(*), sum(100 / d), sum(x) FROM {events} WHERE d <> 0").fetchone()
        want_raw = writer.execute(f"SELECT count(*), sum(x) FROM {events}").fetchone()
    assert sorted(writer.execute(f"SELECT x, q FROM {schema}.t1").fetchall()) == want_t1
    assert writer.execute(f"SELECT n, q, x FROM {schema}.total").fetchone() == want_total
    # The upstream and the stream's other readers are unaffected: every row in t0, every event in raw.
    assert sorted(writer.execute(f"SELECT x, d FROM {schema}.t0").fetchall()) == sorted(rows)
    assert writer.execute(f"SELECT n, x FROM {schema}.raw").fetchone() == want_raw

    letters = dead_letters(writer, f"{schema}.t0")
    assert len(letters) == bad  # each bad row once, whatever the pages and how often the feeds ran
    for _, upstream, reader, reason, detail, change in letters:
        assert (upstream, reader, reason) == (f"{schema}.t0", f"{schema}.t1", "apply_error")
        assert detail.startswith(f"transform {schema}.t1: SQLSTATE 22012: division by zero")
        assert change["after"]["d"] == 0
        assert change["before"] is None
    assert counted(writer, f"{schema}.t0") == [("apply_error", bad)]
    metric = {"pipeline": "streams", "topic": f"view:{schema}.t0", "reason": "apply_error"}
    mine = f"SELECT count(*) FROM cv.feed_dead_letters WHERE feed = '{schema}.t0' AND pipeline = '{group}'"
    assert REGISTRY.get_sample_value("streamviews_dead_letters_total", metric) == writer.execute(mine).fetchone()[0]
    assert lag(writer, f"{schema}.t0") == 0  # no feed held
    assert lag(writer, f"{schema}.t1") == 0
    state = next(f for f in feed_states(writer) if f.stream == f"{schema}.t0")
    assert state.as_json()["dead_letters"] == bad


def test_a_row_divided_by_zero_is_one_dead_letter_and_the_rows_around_it_are_applied(pg, writer, chain):
    schema, events = chain["schema"], chain["events"]
    apply_rows(writer, events, [1] * 5, [(1, 0), (2, 1), (3, 0), (4, 2), (5, 0)])
    feed_all(writer, chain, 10_000)
    assert writer.execute(f"SELECT n, q, x FROM {schema}.total").fetchone() == (2, 150, 6)
    assert [change["after"]["x"] for *_, change in dead_letters(writer, f"{schema}.t0")] == [1, 3, 5]


def test_dead_letters_older_than_the_retention_are_pruned_and_the_others_kept(pg, chain):
    schema, events, feed = chain["schema"], chain["events"], f"{chain['schema']}.t0"
    with pg("sv_writer") as conn:  # one transaction, rolled back
        apply_rows(conn, events, [1] * 3, [(1, 0), (2, 0), (3, 1)])
        feed_all(conn, chain, 10_000)
        fresh = [position for position, *_ in dead_letters(conn, feed)]
        conn.execute(
            "INSERT INTO cv.feed_dead_letters (feed, position, upstream, reader, reason, detail, pipeline, change,"
            " rejected_at) VALUES (%s, -1, %s, %s, 'apply_error', 'old', 'test', '{}', now() - interval '8 days')",
            (feed, feed, f"{schema}.t1"),
        )
        assert conn.execute("SELECT cv.prune_feed_dead_letters('7 days')").fetchone() == (1,)
        assert [position for position, *_ in dead_letters(conn, feed)] == fresh
        assert len(fresh) == 2
        conn.rollback()


@pytest.mark.parametrize("seed", [1, 2])
def test_a_view_over_a_views_changes_dead_letters_the_changes_it_fails_on(pg, writer, views, seed):
    schema, clicks = views["schema"], views["clicks"]
    rng = random.Random(seed)
    page = rng.choice([2, 5, 10_000])
    rows: list[tuple[str, int]] = []
    for _ in range(10):
        batch = [(rng.choice(["/a", "/bb", "/ccc", "/d"]), rng.randint(1, 99)) for _ in range(rng.choice([1, 3]))]
        apply_rows(writer, clicks, [1] * len(batch), batch)
        rows += batch
        if rng.random() < 0.5:
            feed_all(writer, views, page)
    feed_all(writer, views, page)

    upstream = f"{schema}.per_url"
    changes = f"""(SELECT c.position, jsonb_populate_record(NULL::{upstream}, c.after) AS new
                  FROM cv.view_changes AS c WHERE c.view = '{upstream}') AS changes"""
    with writer.transaction(force_rollback=True):
        as_stream_table(writer, clicks, "url text, ms int", rows)
        want_per_url = sorted(writer.execute(f"SELECT url, count(*), sum(ms) FROM {clicks} GROUP BY 1").fetchall())
        want_by_length = sorted(
            writer.execute(
                f"SELECT length(url), sum(n), max(total) FROM"
                f" (SELECT url, count(*) AS n, sum(ms) AS total FROM {clicks} GROUP BY 1) AS p GROUP BY 1"
            ).fetchall()
        )
    # ratio's own SELECT over the upstream's changes but those it divides by zero on, in PostgreSQL
    want_ratio = sorted(
        writer.execute(
            f"SELECT (new).url, count(*), sum((new).total / ((new).n - {THRESHOLD})) FROM {changes}"
            f" WHERE (new).n <> {THRESHOLD} GROUP BY 1"
        ).fetchall()
    )
    bad = [p for (p,) in writer.execute(f"SELECT position FROM {changes} WHERE (new).n = {THRESHOLD} ORDER BY 1")]
    assert bad, "some url reaches the threshold"
    assert sorted(writer.execute(f"SELECT url, changes, r FROM {schema}.ratio").fetchall()) == want_ratio
    assert sorted(writer.execute(f"SELECT url, n, total FROM {upstream}").fetchall()) == want_per_url
    assert sorted(writer.execute(f"SELECT len, n, top FROM {schema}.by_length").fetchall()) == want_by_length

    letters = dead_letters(writer, f"output_of({upstream})")
    assert [position for position, *_ in letters] == bad
    for _, up, reader, reason, detail, change in letters:
        assert (up, reader, reason) == (upstream, f"{schema}.ratio", "view_error")
        assert detail.startswith(f"{schema}.ratio: SQLSTATE 22012")
        assert change["after"]["n"] == THRESHOLD
    assert counted(writer, f"output_of({upstream})") == [("view_error", len(bad))]
    assert writer.execute("SELECT count(*) FROM cv.view_failures WHERE view LIKE %s", (f"{schema}.%",)).fetchone() == (
        0,
    )


def test_a_view_that_fails_on_more_changes_of_a_page_than_its_poison_limit_is_quarantined(pg, writer, views):
    schema, clicks = views["schema"], views["clicks"]
    urls = [f"/{i}" for i in range(4)]
    apply_rows(writer, clicks, [1] * 4, [(u, 1) for u in urls])
    apply_rows(writer, clicks, [1] * 4, [(u, 2) for u in urls])  # four changes reach n = 2
    feeds = feeds_of(views, page=10_000, poison_limit=3)
    while feeds.step(writer):
        pass
    failed = writer.execute("SELECT view, reason FROM cv.view_failures WHERE view LIKE %s", (f"{schema}.%",)).fetchall()
    assert [view for view, _ in failed] == [f"{schema}.ratio"]
    assert "rejected over 3 changes of one page" in failed[0][1]
    assert dead_letters(writer, f"output_of({schema}.per_url)") == []  # its changes were not the fault
    assert lag(writer, f"output_of({schema}.per_url)") == 0


def test_a_transform_whose_table_is_dropped_holds_its_feed_until_it_is_back(pg, writer, chain):
    schema, events = chain["schema"], chain["events"]
    dims = f"""
        CREATE TABLE {schema}.dims (d int PRIMARY KEY, label text);
        INSERT INTO {schema}.dims VALUES (1, 'one'), (2, 'two');
        GRANT SELECT ON {schema}.dims TO sv_writer;
    """
    with pg("sv_owner", autocommit=True) as owner:  # labelled reads the table dims through label(d)
        owner.execute(dims)
        owner.execute(
            f"CREATE FUNCTION {schema}.label(int) RETURNS text LANGUAGE sql STABLE"
            f" AS $$ SELECT label FROM {schema}.dims WHERE d = $1 $$"
        )
        catalog.define(
            owner,
            f"CREATE CONTINUOUS TRANSFORM {schema}.labelled AS SELECT x, {schema}.label(d) AS label FROM {schema}.t0;"
            f" CREATE CONTINUOUS VIEW {schema}.labels AS SELECT label, count(*) AS n FROM {schema}.labelled GROUP BY 1",
        )
    apply_rows(writer, events, [1] * 3, [(1, 1), (2, 2), (3, 2)])
    feed_all(writer, chain, 10_000)
    with pg("sv_owner", autocommit=True) as owner:
        owner.execute(f"DROP TABLE {schema}.dims")
    apply_rows(writer, events, [1] * 2, [(4, 1), (5, 2)])
    feeds = feed_all(writer, chain, 10_000)

    assert lag(writer, f"{schema}.t0") == 2  # held: nothing skipped, nothing dead-lettered
    assert f"{schema}.t0" in feeds.backoff
    assert dead_letters(writer, f"{schema}.t0") == []
    assert writer.execute(f"SELECT n FROM {schema}.raw").fetchone() == (5,)  # the stream goes on
    with pg("sv_owner", autocommit=True) as owner:
        owner.execute(dims)
    feed_all(writer, chain, 10_000)
    assert lag(writer, f"{schema}.t0") == 0
    assert sorted(writer.execute(f"SELECT label, n FROM {schema}.labels").fetchall()) == [("one", 2), ("two", 3)]
    assert writer.execute(f"SELECT n, x FROM {schema}.total").fetchone() == (5, 15)


def test_through_a_runner_killed_mid_stream_each_bad_row_is_one_dead_letter_and_the_chain_exact(
    pg, kafka, stack, topic_factory
):
    topic = topic_factory("it-fdl", partitions=PARTITIONS)
    name, group = topic.replace("-", "_"), unique("it-group")
    rng = random.Random(11)
    # One row in 200 divides by zero: the runner logs each dead letter to a pipe this test reads at the end only.
    rows = [(rng.randint(-50, 50), 0 if i % 200 == 7 else rng.choice([-3, -1, 1, 2, 5, 7])) for i in range(6_000)]
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "linger.ms": 20, "enable.idempotence": True})
    for x, d in rows:
        producer.produce(topic, value=json.dumps({"x": x, "d": d}))
        producer.poll(0)
    assert producer.flush(60) == 0
    scenario = {"topic": topic, "group": group}
    with cleaned(pg, name, group, [name], chain_definitions(name, name, topic, group)), pg("sv_owner") as conn:
        conn.autocommit = True
        settings = {"PIPELINE_BATCH_MAX": "200", "PIPELINE_FEED_PAGE": "50", "LOG_LEVEL": "WARNING"}  # a short log
        runner = start_runner(stack, group, **settings)
        letters = f"SELECT count(*) FROM cv.feed_dead_letters WHERE feed = '{name}.t0'"
        wait_for(lambda: conn.execute(letters).fetchone()[0] > 5, what="some rows dead-lettered")
        stop_process(runner, signal.SIGKILL, timeout=30)
        runner = start_runner(stack, group, **settings)
        try:
            marks = {p: end for p, end in high_watermarks(kafka, topic).items() if end}  # partitions with events
            wait_for(lambda: committed(pg, scenario) == marks, timeout=180, what="every event applied")
            wait_for(lambda: lag(conn, f"{name}.t0") == lag(conn, f"{name}.t1") == 0, timeout=120, what="fed")
        finally:
            stop_runner(runner)
        with conn.transaction(force_rollback=True):
            as_stream_table(conn, "raw_events", "x int, d int", rows)
            want = conn.execute("SELECT count(*), sum(100 / d), sum(x) FROM raw_events WHERE d <> 0").fetchone()
        assert conn.execute(f"SELECT n, q, x FROM {name}.total").fetchone() == want
        bad = sum(1 for _, d in rows if d == 0)
        assert conn.execute(letters).fetchone() == (bad,)  # each once, across the kill
        assert counted(conn, f"{name}.t0") == [("apply_error", bad)]
