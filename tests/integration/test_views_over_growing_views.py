"""Views over views whose rows only grow (pipelines.cv.views.growth) against PostgreSQL.

A max over the rows of a view that only grow keeps no value counts; it stays exact when those rows
move back after all (a replay, a rewrite: the level is rebuilt from its feed's state), and when the
upstream takes a ttl (its readers count values again). The oracle: each level equals its own SELECT
over the current rows of the level below.
"""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from pipelines.cv import catalog
from tests.integration.conftest import apply_rows, throwaway_views, unique
from tests.integration.test_views_over_views import feed_all, normalized

T0 = datetime(2026, 11, 20, 22, 50, tzinfo=UTC)
PER_MINUTE = (
    "SELECT date_trunc('minute', ts) AS minute, url, count(*) AS n, sum(ms) AS total, max(ms) AS peak"
    " FROM {src} GROUP BY 1, 2"
)
HOURLY = (
    "SELECT date_trunc('hour', minute) AS hour, url, sum(n) AS n, max(peak) AS peak, count(*) AS minutes"
    " FROM {src} GROUP BY 1, 2"
)
DAILY = "SELECT date_trunc('day', hour) AS day, sum(n) AS n, max(peak) AS peak FROM {src} GROUP BY 1"


@pytest.fixture
def levels(pg):
    """A stream of clicks, the chain minute -> hour -> day over it (a group no runner runs), the pipelines' role."""
    name = unique("grow")
    clicks = f"{name}_clicks"
    definitions = f"""
        CREATE STREAM {clicks} (url text, ms int, ts timestamptz)
            WITH (topic = '{clicks}', consumer_group = 'it-{name}');
        CREATE CONTINUOUS VIEW {name}.per_minute AS {PER_MINUTE.format(src=clicks)};
        CREATE CONTINUOUS VIEW {name}.hourly AS {HOURLY.format(src=f"{name}.per_minute")};
        CREATE CONTINUOUS VIEW {name}.daily AS {DAILY.format(src=f"{name}.hourly")};
    """
    with throwaway_views(pg, name, [clicks], definitions), pg("sv_writer", autocommit=True) as writer:
        yield {"schema": name, "clicks": clicks, "writer": writer}


def clicks(writer: psycopg.Connection, stream: str, rng: random.Random, batches: int) -> None:
    for _ in range(batches):
        rows = [
            (rng.choice(["/1", "/2", "/3", None]), rng.randint(1, 900), T0 + timedelta(minutes=rng.choice([0, 1, 70])))
            for _ in range(rng.choice([1, 5, 20]))
        ]
        apply_rows(writer, stream, [1] * len(rows), rows)
        if rng.random() < 0.5:
            feed_all(writer, rng.choice([2, 10_000]))
    feed_all(writer)


def assert_levels_exact(conn: psycopg.Connection, schema: str) -> None:
    """Each level equals its SELECT over the current rows of the level below."""
    for level, below, select in (("hourly", "per_minute", HOURLY), ("daily", "hourly", DAILY)):
        expected = conn.execute(select.format(src=f"{schema}.{below}")).fetchall()
        assert normalized(conn.execute(f"SELECT * FROM {schema}.{level}").fetchall()) == normalized(expected), level


def grows(conn: psycopg.Connection, view: str) -> dict[str, str]:
    definition = conn.execute("SELECT definition FROM cv.streams WHERE name = %s", (view,)).fetchone()[0]
    return json.loads(definition).get("grows", {})


def value_counts(conn: psycopg.Connection, schema: str, view: str) -> int:
    """Rows in the view's min/max value counts tables (`<storage>__m<i>`)."""
    tables = conn.execute(
        "SELECT relname FROM pg_class WHERE relnamespace = 'cv'::regnamespace AND relname ~ %s",
        (f"^{schema}__{view}__m[0-9]+$",),
    ).fetchall()
    assert tables, "a max over a view's rows has its counts table, kept or not"
    return sum(conn.execute(f'SELECT count(*) FROM cv."{t}"').fetchone()[0] for (t,) in tables)


def test_a_max_over_rows_that_only_grow_keeps_no_value_counts_and_is_exact(pg, levels):
    schema, writer = levels["schema"], levels["writer"]
    clicks(writer, levels["clicks"], random.Random(1), 12)
    assert grows(writer, f"{schema}.per_minute") == {"minute": "fixed", "url": "fixed", "n": "up", "peak": "up"}
    assert grows(writer, f"{schema}.hourly") == {"hour": "fixed", "url": "fixed", "peak": "up", "minutes": "up"}
    assert value_counts(writer, schema, "hourly") == value_counts(writer, schema, "daily") == 0
    assert_levels_exact(writer, schema)


@pytest.mark.parametrize("seed", [1, 2])
def test_a_level_is_rebuilt_when_the_rows_it_reads_move_back(pg, levels, seed):
    """A rewrite of the minute view's rows (as a replay's swap makes) lowers maxima and removes a group."""
    schema, writer, rng = levels["schema"], levels["writer"], random.Random(seed)
    clicks(writer, levels["clicks"], rng, 8)
    with pg("sv_owner", autocommit=True) as owner:
        owner.execute(f"UPDATE cv.{schema}__per_minute SET peak = peak - 1000 WHERE url = '/1'")
        owner.execute(f"DELETE FROM cv.{schema}__per_minute WHERE url = '/2'")
    clicks(writer, levels["clicks"], rng, 4)
    assert_levels_exact(writer, schema)
    assert value_counts(writer, schema, "hourly") == 0


def test_an_upstream_given_a_ttl_makes_its_readers_count_values_until_it_is_reset(pg, levels):
    schema, writer = levels["schema"], levels["writer"]
    clicks(writer, levels["clicks"], random.Random(3), 6)
    with pg("sv_owner", autocommit=True) as owner:
        catalog.define(owner, f"ALTER CONTINUOUS VIEW {schema}.per_minute SET (ttl = '10000 days')")
        assert grows(owner, f"{schema}.per_minute") == {}
        assert grows(owner, f"{schema}.hourly") == {}  # down the chain: hourly's rows may now go too
        assert value_counts(owner, schema, "hourly") > 0
        assert value_counts(owner, schema, "daily") > 0
        assert_levels_exact(owner, schema)
        owner.execute(f"DELETE FROM cv.{schema}__per_minute WHERE url = '/1'")  # what its ttl deletes
    clicks(writer, levels["clicks"], random.Random(4), 4)
    assert_levels_exact(writer, schema)
    with pg("sv_owner", autocommit=True) as owner:
        catalog.define(owner, f"ALTER CONTINUOUS VIEW {schema}.per_minute RESET (ttl)")
        assert grows(owner, f"{schema}.per_minute")["peak"] == "up"
        assert grows(owner, f"{schema}.hourly")["peak"] == "up"
    clicks(writer, levels["clicks"], random.Random(5), 4)
    assert_levels_exact(writer, schema)
