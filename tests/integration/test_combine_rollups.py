"""combine() in rollups of views (issue 25, item 3) against PostgreSQL's own aggregates over the raw events.

A per-minute view keeps avg, stddev, an approximate distinct count (HyperLogLog), an exact one, a
percentile (t-digest) and a top-k; an hourly and a daily view combine() them, FROM the view (its current rows,
retracted and added as they change) and FROM output_of (its changes, append-only). The oracle is
PostgreSQL's aggregate per hour and per day over the raw events: exact ones equal it (avg, stddev,
counts, the exact distinct count); the HyperLogLog estimate equals the sketch of the raw events (a
union of sketches is the sketch of the union); the percentile is within the t-digest's bound on
rank; whatever the batching, the feeds' page size, and when the feeds ran.
"""

from __future__ import annotations

import random
import signal
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from confluent_kafka.admin import NewTopic

from pipelines.cv import catalog
from pipelines.cv.model import DefinitionError
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
from tests.integration.test_isolation import produce
from tests.integration.test_views_over_views import feed_all

T0 = datetime(2026, 11, 20, 22, 50, tzinfo=UTC)  # the events span two hours and two days
COLUMNS = "url text, uid int, ms int, ts timestamptz"
# The raw aggregates, once per level: the minute keeps them, the levels above combine() them.
MINUTE = (
    "SELECT date_trunc('minute', ts) AS minute, url, count(*) AS n, avg(ms) AS mean, stddev_samp(ms) AS spread,"
    " approx_count_distinct(uid) AS users, percentile_cont(0.9) WITHIN GROUP (ORDER BY ms) AS p90,"
    " max(ms) AS peak, topk_agg(url, 3) AS top, count(DISTINCT uid) AS exact_users"
    " FROM {src} GROUP BY 1, 2"
)
HOUR = (
    "SELECT date_trunc('hour', minute) AS hour, url, combine(n) AS n, combine(mean) AS mean,"
    " combine(spread) AS spread, combine(users) AS users, combine(p90) AS p90, combine(peak) AS peak,"
    " combine(exact_users) AS exact_users FROM {src} GROUP BY 1, 2"
)
DAY = (
    "SELECT date_trunc('day', hour) AS day, combine(n) AS n, combine(mean) AS mean, combine(spread) AS spread,"
    " combine(users) AS users, combine(p90) AS p90, combine(exact_users) AS exact_users FROM {src} GROUP BY 1"
)
DAY_OF_CHANGES = (
    "SELECT date_trunc('day', (delta).minute) AS day, combine((delta).n) AS n, combine((delta).mean) AS mean,"
    " combine((delta).spread) AS spread, combine((delta).users) AS users FROM output_of('{src}') GROUP BY 1"
)
# PostgreSQL's own, over the raw events `e` (hll_add_agg: the sketch approx_count_distinct keeps).
ORACLE = {
    "hourly": "SELECT date_trunc('hour', ts), url, count(*), avg(ms), stddev_samp(ms),"
    " round(hll_cardinality(hll_add_agg(hll_hash_any(uid))))::bigint, NULL, max(ms), count(DISTINCT uid)"
    " FROM e GROUP BY 1, 2",
    "daily": "SELECT date_trunc('day', ts), count(*), avg(ms), stddev_samp(ms),"
    " round(hll_cardinality(hll_add_agg(hll_hash_any(uid))))::bigint, NULL, count(DISTINCT uid) FROM e GROUP BY 1",
    "daily_changes": "SELECT date_trunc('day', ts), count(*), avg(ms), stddev_samp(ms),"
    " round(hll_cardinality(hll_add_agg(hll_hash_any(uid))))::bigint FROM e GROUP BY 1",
}


@pytest.fixture
def rollup(pg):
    """A stream and its per-minute view; the levels above are defined by the test (or fixture below)."""
    name = unique("comb")
    stream = f"{name}_clicks"
    group = f"it-{name}"  # no runner runs it: the supervised runner's feeds would race this test's own
    definitions = f"""
        CREATE STREAM {stream} ({COLUMNS}) WITH (topic = '{stream}', consumer_group = '{group}');
        CREATE CONTINUOUS VIEW {name}.per_minute AS {MINUTE.format(src=stream)};
    """
    with throwaway_views(pg, name, [stream], definitions):
        yield {"schema": name, "stream": stream}


@pytest.fixture
def writer(pg):
    with pg("sv_writer", autocommit=True) as conn:
        yield conn


def define(pg, text: str) -> None:
    with pg("sv_owner", autocommit=True) as conn:
        catalog.define(conn, text)


def define_levels(pg, schema: str) -> None:
    """The levels over the current rows: they start from the rows already there (their states)."""
    define(
        pg,
        f"""
        CREATE CONTINUOUS VIEW {schema}.hourly AS {HOUR.format(src=f"{schema}.per_minute")};
        CREATE CONTINUOUS VIEW {schema}.daily AS {DAY.format(src=f"{schema}.hourly")};
        """,
    )


def clicks(rng: random.Random) -> list[tuple]:
    """A batch of random clicks over a few urls, minutes, hours and days."""
    minutes = [0, 1, 2, 9, 10, 70, 75, 1500]
    return [
        (
            rng.choice(["/a", "/b", "/c", None]),  # a NULL url: a group like any other
            rng.randint(1, 40),
            rng.randint(1, 1000),
            T0 + timedelta(minutes=rng.choice(minutes), seconds=rng.randint(0, 59)),
        )
        for _ in range(rng.choice([1, 5, 60]))
    ]


def rows(conn: psycopg.Connection, query: str) -> list[tuple]:
    return sorted(conn.execute(query).fetchall(), key=repr)


def assert_equal_to_oracle(conn: psycopg.Connection, schema: str, stream: str, events: list[tuple]) -> None:
    """Each level against PostgreSQL over the raw events: exact columns equal, the percentile within its bound."""
    with conn.transaction(force_rollback=True):
        as_stream_table(conn, "e", COLUMNS, events)
        for level, query in ORACLE.items():
            expected = rows(conn, query)
            got = rows(conn, f"SELECT * FROM {schema}.{level}")
            assert len(got) == len(expected), level
            for have, want in zip(got, expected, strict=True):
                for i, (a, b) in enumerate(zip(have, want, strict=True)):
                    if b is None:  # the percentile: checked below against the ranks
                        continue
                    if isinstance(b, (int, str, datetime)):
                        assert a == b, (level, i, have, want)
                    else:
                        assert float(a) == pytest.approx(float(b), rel=1e-9, abs=1e-9), (level, i, have, want)
        # The t-digest's bound: the combined p90's rank among the raw values is within 2% of 0.9.
        hourly = "date_trunc('hour', ts) = v.hour AND url IS NOT DISTINCT FROM v.url"
        daily = "date_trunc('day', ts) = v.day"
        for level, groups in (("hourly", hourly), ("daily", daily)):
            ranks = conn.execute(
                f"SELECT v.p90, (SELECT count(*) FILTER (WHERE ms <= v.p90)::float8 / count(*) FROM e WHERE {groups}),"
                f" (SELECT count(*) FROM e WHERE {groups}) FROM {schema}.{level} AS v"
            ).fetchall()
            for p90, rank, n in ranks:
                assert abs(rank - 0.9) <= 0.02 + 1.0 / n, (level, p90, rank, n)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_combine_over_a_chain_equals_postgresqls_aggregate_over_the_raw_events(pg, writer, rollup, seed):
    schema, stream = rollup["schema"], rollup["stream"]
    rng = random.Random(seed)
    # output_of starts from now (PipelineDB's too): defined before the first event, it sees them all.
    define(pg, f"CREATE CONTINUOUS VIEW {schema}.daily_changes AS {DAY_OF_CHANGES.format(src=f'{schema}.per_minute')}")
    events: list[tuple] = []
    for _ in range(3):  # rows before the levels exist: the hourly view starts from them, from the states
        batch = clicks(rng)
        apply_rows(writer, stream, [1] * len(batch), batch)
        events += batch
    define_levels(pg, schema)
    page = rng.choice([1, 7, 10_000])
    for _ in range(15):
        batch = clicks(rng)
        apply_rows(writer, stream, [1] * len(batch), batch)
        events += batch
        if rng.random() < 0.4:  # the feeds run now and then, a page at a time
            feed_all(writer, page)
    feed_all(writer, page)
    assert_equal_to_oracle(writer, schema, stream, events)


def test_combine_over_a_chain_after_a_runner_is_killed_equals_the_raw_aggregates(pg, kafka, admin, stack, rollup):
    """A runner of the stream's group, killed (SIGKILL) while the levels are fed, then restarted: exact again."""
    schema, stream = rollup["schema"], rollup["stream"]
    define(pg, f"CREATE CONTINUOUS VIEW {schema}.daily_changes AS {DAY_OF_CHANGES.format(src=f'{schema}.per_minute')}")
    define_levels(pg, schema)
    rng = random.Random(9)
    events = [e for _ in range(300) for e in clicks(rng)]
    admin.create_topics([NewTopic(stream, num_partitions=3, replication_factor=1)])[stream].result(30)
    produce(kafka, stream, [{"url": u, "uid": i, "ms": ms, "ts": ts.isoformat()} for u, i, ms, ts in events])
    group = f"it-{schema}"

    def daily_n(conn: psycopg.Connection) -> int:
        return int(conn.execute(f"SELECT coalesce(sum(n), 0) FROM {schema}.daily").fetchone()[0])

    with pg("sv_writer", autocommit=True) as conn:
        first = start_runner(stack, group, PIPELINE_BATCH_MAX="50")  # small batches: killed well before the end
        try:
            wait_for(lambda: daily_n(conn) > 0, timeout=120, interval=0.05, what="the chain to move")
        finally:
            stop_process(first, signal.SIGKILL, timeout=30)
        second = start_runner(stack, group)
        try:
            levels = ("hourly", "daily", "daily_changes")
            total = f"SELECT {' + '.join(f'(SELECT coalesce(sum(n), 0) FROM {schema}.{v})' for v in levels)}"
            caught_up = lambda: conn.execute(total).fetchone()[0] == 3 * len(events)  # noqa: E731
            wait_for(caught_up, timeout=180, what="every level to catch up")
        finally:
            stop_runner(second)
        assert_equal_to_oracle(conn, schema, stream, events)


def test_a_stream_its_view_and_two_levels_of_combine_defined_in_one_script(pg, writer):
    """One definitions text: each combine() level finds its upstream made by an earlier statement of the same text."""
    name = unique("comb1")
    stream = f"{name}_clicks"
    definitions = f"""
        CREATE STREAM {stream} ({COLUMNS}) WITH (topic = '{stream}', consumer_group = 'it-{name}');
        CREATE CONTINUOUS VIEW {name}.per_minute AS {MINUTE.format(src=stream)};
        CREATE CONTINUOUS VIEW {name}.totals AS SELECT combine((delta).n) AS n, combine((delta).mean) AS mean
            FROM output_of('{name}.per_minute');
        CREATE CONTINUOUS VIEW {name}.hourly AS {HOUR.format(src=f"{name}.per_minute")};
        CREATE CONTINUOUS VIEW {name}.daily AS {DAY.format(src=f"{name}.hourly")};
    """
    with throwaway_views(pg, name, [stream], definitions):
        batch = clicks(random.Random(4)) + clicks(random.Random(5))
        apply_rows(writer, stream, [1] * len(batch), batch)
        feed_all(writer)
        with writer.transaction(force_rollback=True):
            as_stream_table(writer, "e", COLUMNS, batch)
            expected = writer.execute("SELECT count(*), avg(ms) FROM e").fetchone()
            assert writer.execute(f"SELECT n, mean FROM {name}.totals").fetchone() == expected
            assert writer.execute(f"SELECT sum(n) FROM {name}.daily").fetchone()[0] == len(batch)


def test_an_upstream_keeps_the_aggregates_its_combine_readers_merge(pg, rollup):
    schema, stream = rollup["schema"], rollup["stream"]
    define_levels(pg, schema)
    replaced = MINUTE.replace("avg(ms)", "avg(uid)").format(src=stream)
    with pytest.raises(DefinitionError, match=r"hourly combine\(\) its stored aggregates; keep its aggregate calls"):
        define(pg, f"CREATE OR REPLACE CONTINUOUS VIEW {schema}.per_minute AS {replaced}")
    filtered = MINUTE.replace(" GROUP BY", " WHERE ms > 0 GROUP BY").format(src=stream)
    define(pg, f"CREATE OR REPLACE CONTINUOUS VIEW {schema}.per_minute AS {filtered}")  # the same calls: kept


def test_a_row_the_upstream_deletes_leaves_a_combined_sketch_as_it_leaves_a_count(pg, writer):
    """An upstream row deleted (as its ttl's retention deletes it) leaves the hour's HyperLogLog, not only its count."""
    name = unique("combk")
    stream = f"{name}_likes"
    definitions = f"""
        CREATE STREAM {stream} (oid bigint, uid bigint, ts timestamptz)
            WITH (topic = '{stream}', key = 'oid, uid', consumer_group = 'it-{name}');
        CREATE CONTINUOUS VIEW {name}.per_minute AS SELECT date_trunc('minute', ts) AS minute, count(*) AS n,
            hll_add_agg(hll_hash_any(uid)) AS fans FROM {stream} GROUP BY 1;
        CREATE CONTINUOUS VIEW {name}.hourly AS SELECT date_trunc('hour', minute) AS hour, combine(n) AS n,
            combine(fans) AS fans FROM {name}.per_minute GROUP BY 1;
    """
    with throwaway_views(pg, name, [stream], definitions):
        kept = [(1, uid, T0) for uid in range(1, 21)]
        gone = [(1, uid, T0 + timedelta(minutes=1)) for uid in range(21, 41)]
        apply_rows(writer, stream, [1] * 40, kept + gone)
        feed_all(writer)
        estimate = f"SELECT n, round(hll_cardinality(fans))::bigint FROM {name}.hourly"
        assert writer.execute(estimate).fetchone() == (40, 40)
        with writer.transaction():  # the second minute deleted, as retention deletes a bucket past its ttl
            writer.execute(f"DELETE FROM cv.{name}__per_minute WHERE minute = %s", (T0 + timedelta(minutes=1),))
        feed_all(writer)
        assert writer.execute(estimate).fetchone() == (20, 20)
