"""Views over views (issue 25, item 3) against PostgreSQL: rollups, change-driven views, chains, refusals.

The oracle is PostgreSQL's own aggregate over the raw events: each level of a chain (minute -> hour
-> day), fed by the runner's feeds (pipelines.cv.feeds) after batches applied through the engine,
equals the same SELECTs nested over a table of the events (a keyed stream's: of its live rows),
whatever the batching, the feeds' page size and when the feeds ran. A view over output_of counts
exactly the threshold crossings a Python replay of the committed batches finds.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import psycopg
import pytest

from pipelines.cv import catalog
from pipelines.cv.feeds import ViewFeeds
from pipelines.cv.model import DefinitionError
from tests.integration.conftest import apply_rows, as_stream_table, throwaway_views, unique

T0 = datetime(2026, 11, 20, 22, 50, tzinfo=UTC)  # the events span two hours and two days

# Each view's SELECT over `{src}`: the stream or view it reads. The definitions and the oracle (the
# same SELECTs nested over the raw events) come from these texts.
PER_MINUTE = (
    "SELECT date_trunc('minute', ts) AS minute, url, count(*) AS n, sum(ms) AS total, max(ms) AS peak"
    " FROM {src} GROUP BY 1, 2"
)
HOURLY = (
    "SELECT date_trunc('hour', minute) AS hour, url, sum(n) AS n, sum(total) AS total, max(peak) AS peak,"
    " count(*) AS minutes, min(n) AS quietest FROM {src} GROUP BY 1, 2"
)
DAILY = (
    "SELECT date_trunc('day', hour) AS day, sum(n) AS n, max(peak) AS peak, sum(minutes) AS minutes,"
    " count(DISTINCT url) AS urls, avg(total) AS mean_total FROM {src} GROUP BY 1"
)
LIKES_MINUTE = (
    "SELECT date_trunc('minute', ts) AS minute, oid % 4 AS shard, count(*) AS n, count(DISTINCT uid) AS fans"
    " FROM {src} GROUP BY 1, 2"
)
LIKES_HOURLY = (
    "SELECT date_trunc('hour', minute) AS hour, sum(n) AS n, max(n) AS top, min(fans) AS low, count(*) AS minutes"
    " FROM {src} GROUP BY 1"
)
LIKES_DAILY = "SELECT date_trunc('day', hour) AS day, sum(n) AS n, max(top) AS top FROM {src} GROUP BY 1"
THRESHOLD = 3
CROSSINGS = (
    "SELECT (new).url AS url, count(*) AS crossings FROM output_of('{schema}.per_minute')"
    f" WHERE (new).n >= {THRESHOLD} AND ((old) IS NULL OR (old).n < {THRESHOLD}) GROUP BY 1"
)


@pytest.fixture
def chain(pg):
    """Two streams and the first level over each; the levels above are defined by the test."""
    name = unique("vov")
    keyed, append = f"{name}_likes", f"{name}_clicks"
    # A consumer group no runner runs: the supervised runner's feeds would race this test's own.
    group = f"it-{name}"
    definitions = f"""
        CREATE STREAM {keyed} (oid bigint, uid bigint, ts timestamptz)
            WITH (topic = '{keyed}', key = 'oid, uid', consumer_group = '{group}');
        CREATE STREAM {append} (url text, ms int, ts timestamptz) WITH (topic = '{append}', consumer_group = '{group}');
        CREATE CONTINUOUS VIEW {name}.per_minute AS {PER_MINUTE.format(src=append)};
        CREATE CONTINUOUS VIEW {name}.likes_minute AS {LIKES_MINUTE.format(src=keyed)};
    """
    with throwaway_views(pg, name, [keyed, append], definitions):
        yield {"schema": name, "keyed": keyed, "append": append}


def define_levels(pg, schema: str) -> None:
    with pg("sv_owner", autocommit=True) as conn:
        catalog.define(
            conn,
            f"""
            CREATE CONTINUOUS VIEW {schema}.hourly AS {HOURLY.format(src=f"{schema}.per_minute")};
            CREATE CONTINUOUS VIEW {schema}.daily AS {DAILY.format(src=f"{schema}.hourly")};
            CREATE CONTINUOUS VIEW {schema}.likes_hourly AS {LIKES_HOURLY.format(src=f"{schema}.likes_minute")};
            CREATE CONTINUOUS VIEW {schema}.likes_daily AS {LIKES_DAILY.format(src=f"{schema}.likes_hourly")};
            CREATE CONTINUOUS VIEW {schema}.crossings AS {CROSSINGS.format(schema=schema)};
            """,
        )


def feed_all(conn: psycopg.Connection, page: int = 10_000) -> None:
    """Run the feeds' passes until nothing is left to take."""
    feeds = ViewFeeds("", page=page)
    while feeds.step(conn):
        pass


def normalized(rows: list[tuple]) -> list[tuple]:
    """Rows comparable across the view and the oracle: numbers as floats rounded (avg's scale may differ)."""
    rounded = [tuple(round(float(v), 9) if isinstance(v, (Decimal, float)) else v for v in row) for row in rows]
    return sorted(rounded, key=repr)  # a group may be NULL: None and text do not compare


def oracle(conn: psycopg.Connection, chain: dict, clicks: list[tuple], likes: dict) -> dict[str, list[tuple]]:
    """PostgreSQL's aggregates of each level over the raw events (inside a transaction rolled back)."""
    append, keyed = chain["append"], chain["keyed"]
    as_stream_table(conn, append, "url text, ms int, ts timestamptz", clicks)
    as_stream_table(conn, keyed, "oid bigint, uid bigint, ts timestamptz", [(o, u, ts) for (o, u), ts in likes.items()])
    levels = {"per_minute": f"({PER_MINUTE.format(src=append)}) AS per_minute"}
    levels["hourly"] = f"({HOURLY.format(src=levels['per_minute'])}) AS hourly"
    levels["daily"] = f"({DAILY.format(src=levels['hourly'])}) AS daily"
    levels["likes_minute"] = f"({LIKES_MINUTE.format(src=keyed)}) AS likes_minute"
    levels["likes_hourly"] = f"({LIKES_HOURLY.format(src=levels['likes_minute'])}) AS likes_hourly"
    levels["likes_daily"] = f"({LIKES_DAILY.format(src=levels['likes_hourly'])}) AS likes_daily"
    return {name: normalized(conn.execute(f"SELECT * FROM {source}").fetchall()) for name, source in levels.items()}


def view(conn: psycopg.Connection, schema: str, name: str) -> list[tuple]:
    return normalized(conn.execute(f"SELECT * FROM {schema}.{name}").fetchall())


class Events:
    """Random clicks (some without a url: a NULL group) and likes/unlikes over a few groups, and what they leave."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.clicks: list[tuple] = []
        self.likes: dict[tuple[int, int], datetime] = {}  # the keyed stream's live rows
        self.counts: dict[tuple[datetime, str], int] = {}  # per_minute's n, after each committed batch
        self.crossings: dict[str, int] = {}

    def when(self) -> datetime:
        return T0 + timedelta(minutes=self.rng.choice([0, 1, 2, 9, 10, 70, 75, 1500]), seconds=self.rng.randint(0, 59))

    def clicks_batch(self, writer: psycopg.Connection, stream: str, counting: bool) -> None:
        batch = [
            (self.rng.choice(["/1", "/2", "/3", "/4", None]), self.rng.randint(1, 900), self.when())
            for _ in range(self.rng.choice([1, 4, 30]))
        ]
        apply_rows(writer, stream, [1] * len(batch), batch)
        self.clicks += batch
        before = dict(self.counts)
        for url, _, ts in batch:
            group = (ts.replace(second=0), url)
            self.counts[group] = self.counts.get(group, 0) + 1
        for group, n in self.counts.items():  # one change per group per committed batch: its crossing
            if counting and n != before.get(group, 0) and n >= THRESHOLD > before.get(group, 0):
                self.crossings[group[1]] = self.crossings.get(group[1], 0) + 1

    def likes_batch(self, writer: psycopg.Connection, stream: str) -> None:
        size = self.rng.choice([1, 5, 40])
        ops = [1 if self.rng.random() < 0.6 else -1 for _ in range(size)]
        rows = [(self.rng.randint(1, 12), self.rng.randint(1, 6), self.when()) for _ in range(size)]
        apply_rows(writer, stream, ops, rows)
        for op, (oid, uid, ts) in zip(ops, rows, strict=True):
            if op == 1:
                self.likes.setdefault((oid, uid), ts)  # a like of a pair already liked changes nothing
            else:
                self.likes.pop((oid, uid), None)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_level_of_a_chain_equals_postgresqls_aggregate_over_the_raw_events(pg, writer, chain, seed):
    schema = chain["schema"]
    rng = random.Random(seed)
    events = Events(rng)
    for _ in range(4):  # rows before the levels exist: their creation starts from them
        events.clicks_batch(writer, chain["append"], counting=False)
        events.likes_batch(writer, chain["keyed"])
    define_levels(pg, schema)
    page = rng.choice([2, 7, 10_000])
    for _ in range(25):
        if rng.random() < 0.5:
            events.clicks_batch(writer, chain["append"], counting=True)
        else:
            events.likes_batch(writer, chain["keyed"])
        if rng.random() < 0.3:  # the feeds run now and then, a page at a time
            feed_all(writer, page)
    feed_all(writer, page)
    with writer.transaction(force_rollback=True):
        expected = oracle(writer, chain, events.clicks, events.likes)
    for name, rows in expected.items():
        assert view(writer, schema, name) == rows, name
    crossings = writer.execute(f"SELECT url, crossings FROM {schema}.crossings").fetchall()
    assert dict(crossings) == events.crossings


@pytest.fixture
def writer(pg):
    with pg("sv_writer", autocommit=True) as conn:
        yield conn


@pytest.mark.parametrize("seed", [1, 2])
def test_a_level_stays_exact_while_its_upstream_switches_between_keys_and_rows(pg, writer, chain, seed):
    """The hour level reads the minute view's keys; an output_of() reader makes it record rows for a while.

    A page may then hold changes of both kinds: the level takes each group's key from either.
    """
    schema = chain["schema"]
    rng = random.Random(seed)
    events = Events(rng)
    hourly = HOURLY.format(src=f"{schema}.per_minute")
    crossings = CROSSINGS.format(schema=schema)
    with pg("sv_owner", autocommit=True) as owner:
        catalog.define(owner, f"CREATE CONTINUOUS VIEW {schema}.hourly AS {hourly}")
        assert images_recorded(owner, f"{schema}.per_minute") is False
        for step in range(14):
            events.clicks_batch(writer, chain["append"], counting=False)
            if step == 4:
                catalog.define(owner, f"CREATE CONTINUOUS VIEW {schema}.crossings AS {crossings}")
                assert images_recorded(owner, f"{schema}.per_minute") is True
            if step == 9:
                catalog.define(owner, f"DROP CONTINUOUS VIEW {schema}.crossings")
                assert images_recorded(owner, f"{schema}.per_minute") is False
            if rng.random() < 0.3:
                feed_all(writer, rng.choice([2, 10_000]))
    feed_all(writer, rng.choice([3, 10_000]))
    with writer.transaction(force_rollback=True):
        expected = oracle(writer, chain, events.clicks, events.likes)
    assert view(writer, schema, "hourly") == expected["hourly"]


def test_groups_named_like_the_feeds_own_columns_roll_up_exactly(pg, writer):
    """A group column may be named `key` or `current`: the feed's page keeps its own names apart."""
    name = unique("vovk")
    stream = f"{name}_kv"
    definitions = f"""
        CREATE STREAM {stream} (key text, current int, v double precision)
            WITH (topic = '{stream}', consumer_group = 'it-{name}');
        CREATE CONTINUOUS VIEW {name}.per_key AS SELECT key, current, count(*) AS n, avg(v) AS mean
            FROM {stream} GROUP BY key, current;
        CREATE CONTINUOUS VIEW {name}.per_current AS SELECT current, sum(n) AS n, max(n) AS top
            FROM {name}.per_key GROUP BY current;
        CREATE CONTINUOUS VIEW {name}.combined AS SELECT current, combine(mean) AS mean
            FROM {name}.per_key GROUP BY current;
    """
    rows = [("a", 1, 1.0), ("b", 1, 3.0), (None, 2, 5.0), ("a", 1, 7.0), ("c", None, 2.0)]
    with throwaway_views(pg, name, [stream], definitions):
        apply_rows(writer, stream, [1, 1, 1], rows[:3])
        feed_all(writer)
        apply_rows(writer, stream, [1, 1], rows[3:])
        feed_all(writer)
        per_current = writer.execute(f"SELECT current, n, top FROM {name}.per_current").fetchall()
        assert sorted(per_current, key=repr) == sorted([(1, 3, 2), (2, 1, 1), (None, 1, 1)], key=repr)
        combined = writer.execute(f"SELECT current, round(mean::numeric, 9) FROM {name}.combined").fetchall()
        assert sorted(combined, key=repr) == sorted([(1, Decimal("3.666666667")), (2, 5), (None, 2)], key=repr)


def images_recorded(conn: psycopg.Connection, view: str) -> bool:
    """Whether `view` records its changes' rows (True) or only their keys (False)."""
    return conn.execute("SELECT images FROM cv.view_change_positions WHERE view = %s", (view,)).fetchone()[0]


def test_a_view_that_would_read_itself_is_refused(pg, chain):
    schema = chain["schema"]
    define_levels(pg, schema)
    with pg("sv_owner", autocommit=True) as conn, pytest.raises(DefinitionError, match="a cycle"):
        catalog.define(
            conn,
            f"CREATE OR REPLACE CONTINUOUS VIEW {schema}.per_minute AS "
            f"SELECT hour AS minute, url, count(*) AS n, sum(n) AS total, max(peak) AS peak FROM {schema}.hourly"
            " GROUP BY 1, 2",
        )


def test_a_view_read_by_another_is_dropped_after_it(pg, chain):
    schema = chain["schema"]
    define_levels(pg, schema)
    with pg("sv_owner", autocommit=True) as conn:
        with pytest.raises(DefinitionError, match=rf"{schema}\.hourly read it; drop them first"):
            catalog.drop(conn, [f"{schema}.per_minute"], "view")
        lines = catalog.drop(conn, [f"{schema}.daily", f"{schema}.hourly"], "view")
        assert f"and {schema}.per_minute, which only it read" in lines[1]
        readers = conn.execute("SELECT reader FROM cv.change_readers WHERE view = %s", (f"{schema}.per_minute",))
        assert [r for (r,) in readers] == [f"stream output_of({schema}.per_minute)"]
        catalog.drop(conn, [f"{schema}.crossings"], "view")
        recording = conn.execute(
            "SELECT recording FROM cv.view_change_positions WHERE view = %s", (f"{schema}.per_minute",)
        )
        assert recording.fetchone() == (False,)  # nobody reads its changes any more


def test_an_upstream_keeps_the_columns_its_readers_were_made_for(pg, chain):
    schema, keyed = chain["schema"], chain["keyed"]
    define_levels(pg, schema)
    with pg("sv_owner", autocommit=True) as conn, pytest.raises(DefinitionError, match="keep its output columns"):
        catalog.define(
            conn,
            f"CREATE OR REPLACE CONTINUOUS VIEW {schema}.likes_minute AS "
            f"SELECT date_trunc('minute', ts) AS minute, oid % 4 AS shard, count(*) AS n FROM {keyed} GROUP BY 1, 2",
        )


def test_a_failing_view_over_a_view_is_quarantined_and_the_others_go_on(pg, writer, chain):
    schema, append = chain["schema"], chain["append"]
    define_levels(pg, schema)
    with pg("sv_owner", autocommit=True) as conn:  # 10 / (n - 2) fails once a minute has two clicks
        catalog.define(
            conn,
            f"CREATE CONTINUOUS VIEW {schema}.fragile AS SELECT url, sum(10 / (n - 2)) AS x"
            f" FROM {schema}.per_minute GROUP BY url",
        )
    clicks = [("/a", 5, T0), ("/a", 6, T0), ("/b", 7, T0 + timedelta(hours=1))]
    apply_rows(writer, append, [1] * 3, clicks)
    feed_all(writer)
    failed = writer.execute("SELECT view FROM cv.view_failures WHERE view LIKE %s", (f"{schema}.%",)).fetchall()
    assert failed == [(f"{schema}.fragile",)]
    with writer.transaction(force_rollback=True):
        expected = oracle(writer, chain, clicks, {})
    for name in ("per_minute", "hourly", "daily"):
        assert view(writer, schema, name) == expected[name], name


def test_a_view_over_a_view_names_what_it_cannot_do(pg, chain):
    schema = chain["schema"]
    with pg("sv_owner", autocommit=True) as conn:
        with pytest.raises(DefinitionError, match=r"combine.*minute is not an aggregate output"):
            catalog.define(
                conn,
                f"CREATE CONTINUOUS VIEW {schema}.c AS"
                f" SELECT url, combine(minute) AS t FROM {schema}.per_minute GROUP BY url",
            )
        with pytest.raises(DefinitionError, match="no continuous view or transform named"):
            catalog.define(
                conn,
                f"CREATE CONTINUOUS VIEW {schema}.c AS"
                f" SELECT count(*) AS n, 1 AS g FROM output_of('{schema}.nope') GROUP BY g",
            )


def test_a_quarantined_view_over_a_view_is_rebuilt_from_its_feed_once_it_runs_again(pg, writer, chain):
    schema, append = chain["schema"], chain["append"]
    define_levels(pg, schema)
    with pg("sv_owner", autocommit=True) as conn:  # guarded(n) fails while the table `broken` has a row
        conn.execute(f"CREATE TABLE {schema}.broken (yes boolean)")
        conn.execute(f"GRANT SELECT ON {schema}.broken TO sv_writer")
        conn.execute(
            f"CREATE FUNCTION {schema}.guarded(n bigint) RETURNS bigint LANGUAGE plpgsql STABLE AS $$ BEGIN"
            f" IF EXISTS (SELECT FROM {schema}.broken) THEN RAISE EXCEPTION 'broken'; END IF; RETURN n; END $$"
        )
        catalog.define(
            conn,
            f"CREATE CONTINUOUS VIEW {schema}.guarded_hourly AS SELECT url, sum({schema}.guarded(n)) AS n"
            f" FROM {schema}.per_minute GROUP BY url",
        )
        conn.execute(f"INSERT INTO {schema}.broken VALUES (true)")
    clicks = [("/a", 5, T0), ("/a", 6, T0 + timedelta(minutes=1)), ("/b", 7, T0)]
    apply_rows(writer, append, [1] * 3, clicks)
    feeds = ViewFeeds("", view_retry_s=0.01)
    while feeds.step(writer):
        pass
    quarantined = writer.execute("SELECT view FROM cv.view_failures WHERE view = %s", (f"{schema}.guarded_hourly",))
    assert quarantined.fetchall() == [(f"{schema}.guarded_hourly",)]
    with pg("sv_owner", autocommit=True) as conn:
        conn.execute(f"DELETE FROM {schema}.broken")
    feeds.housekeeping(writer)  # the retry: probed, rebuilt from the feed's state, resumed
    assert writer.execute("SELECT count(*) FROM cv.view_failures WHERE view LIKE %s", (f"{schema}.%",)).fetchone() == (
        0,
    )
    rows = writer.execute(f"SELECT url, n FROM {schema}.guarded_hourly ORDER BY url").fetchall()
    assert rows == [("/a", 2), ("/b", 1)]


def test_an_upstream_replaced_with_the_same_columns_keeps_feeding_its_readers(pg, writer, chain):
    schema, keyed = chain["schema"], chain["keyed"]
    define_levels(pg, schema)
    events = Events(random.Random(5))
    feeds = ViewFeeds("", page=3)  # small pages: the feed's statements are prepared by the server
    for _ in range(4):
        events.likes_batch(writer, keyed)
        while feeds.step(writer):
            pass
    with pg("sv_owner", autocommit=True) as conn:  # rebuilt (another filter), same columns: its rows leave and enter
        catalog.define(
            conn,
            f"CREATE OR REPLACE CONTINUOUS VIEW {schema}.likes_minute AS"
            f" {LIKES_MINUTE.format(src=keyed).replace(' GROUP BY', ' WHERE uid > 0 GROUP BY')}",
        )
    for _ in range(3):
        events.likes_batch(writer, keyed)
        while feeds.step(writer):
            pass
    with writer.transaction(force_rollback=True):
        expected = oracle(writer, chain, [], events.likes)
    for name in ("likes_minute", "likes_hourly", "likes_daily"):
        assert view(writer, schema, name) == expected[name], name
