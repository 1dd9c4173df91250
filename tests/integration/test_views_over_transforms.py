"""Views over continuous transforms: `FROM <transform>` and `FROM output_of('<transform>')` read its output rows.

A transform's output is a change stream of appended rows (migration 0026); a view reading it is fed
from those rows by the runner's feeds, exactly once, as a view over a view is. The oracle: the
view's own SELECT over the transform's SELECT over the events, in PostgreSQL.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime

import psycopg
import pytest

from pipelines.cv import catalog, cli
from pipelines.cv.feeds import ViewFeeds
from pipelines.cv.model import DefinitionError
from tests.integration.conftest import apply_rows, throwaway_views, unique

NOW = datetime.now(UTC)


@pytest.fixture
def streams(stack, pg):
    name = unique("vot")
    clicks = f"{name}_clicks"
    definitions = f"""
        CREATE STREAM {clicks} (url text, ms int, ts timestamptz)
            WITH (topic = '{clicks}', consumer_group = 'it-{name}');  -- no runner of it: this test feeds
        CREATE CONTINUOUS TRANSFORM {name}.slow AS
            SELECT url, ms / 10 AS tens, lower(url) AS path FROM {clicks} WHERE ms > 100;
        CREATE CONTINUOUS VIEW {name}.slow_by_path AS
            SELECT path, count(*) AS n, sum(tens) AS tens, max(tens) AS worst FROM {name}.slow GROUP BY path;
        CREATE CONTINUOUS VIEW {name}.slow_total AS
            SELECT count(*) AS n, count(DISTINCT path) AS paths FROM output_of('{name}.slow');
    """
    with throwaway_views(pg, name, [clicks], definitions):
        yield {"schema": name, "clicks": clicks}


@pytest.fixture
def writer(pg, streams):
    with pg("sv_writer", autocommit=True) as conn:
        yield conn


def feed_all(conn: psycopg.Connection) -> None:
    feeds = ViewFeeds("", page=37)  # small pages: a batch of the stream spans several
    while feeds.step(conn):
        pass


@pytest.mark.parametrize("seed", [1, 2])
def test_views_over_a_transform_equal_their_select_over_the_transforms_select(pg, writer, streams, seed):
    schema, clicks = streams["schema"], streams["clicks"]
    rng = random.Random(seed)
    sent: list[tuple] = []
    for _ in range(8):
        batch = [(rng.choice(["/A", "/a", "/B", "/c"]), rng.randint(0, 300), NOW) for _ in range(rng.randint(1, 60))]
        apply_rows(writer, clicks, [1] * len(batch), batch)
        sent.extend(batch)
        if rng.random() < 0.5:
            feed_all(writer)
    feed_all(writer)
    with pg("sv_owner") as conn:
        conn.execute("CREATE TEMP TABLE events (url text, ms int, ts timestamptz)")
        with conn.cursor().copy("COPY events FROM STDIN") as copy:
            for row in sent:
                copy.write_row(row)
        conn.execute(
            "CREATE TEMP VIEW slow AS SELECT url, ms / 10 AS tens, lower(url) AS path FROM events WHERE ms > 100"
        )
        got = conn.execute(f"SELECT path, n, tens, worst FROM {schema}.slow_by_path ORDER BY path").fetchall()
        want = conn.execute("SELECT path, count(*), sum(tens), max(tens) FROM slow GROUP BY path ORDER BY path")
        assert got == want.fetchall()
        total = conn.execute(f"SELECT n, paths FROM {schema}.slow_total").fetchone()
        assert total == conn.execute("SELECT count(*), count(DISTINCT path) FROM slow").fetchone()


def test_a_transform_read_by_a_view_is_not_dropped_under_it(pg, streams):
    schema = streams["schema"]
    with pg("sv_owner") as conn, pytest.raises(DefinitionError, match="read"):
        catalog.define(conn, f"DROP CONTINUOUS TRANSFORM {schema}.slow")


def test_streamviews_drop_finds_a_transform_and_list_sql_replays_in_order(pg, streams):
    schema = streams["schema"]
    with pg("sv_owner", autocommit=True) as conn:
        listed = conn.execute(cli.DEFINITIONS_IN_ORDER).fetchall()
        mine = [(kind, name) for kind, name, _ in listed if name.startswith(schema)]
        assert mine == [
            ("stream", streams["clicks"]),
            ("transform", f"{schema}.slow"),
            ("view", f"{schema}.slow_by_path"),
            ("view", f"{schema}.slow_total"),
        ]
        catalog.drop(conn, [f"{schema}.slow_by_path", f"{schema}.slow_total"])
        assert catalog.drop(conn, [f"{schema}.slow"]) == [f"transform {schema}.slow dropped"]
