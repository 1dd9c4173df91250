"""Sliding-window views read as the aggregate over the last interval, to one step (1/60 of it).

The oracle is the view's own SELECT, with its window condition replaced by the steps a read merges
(those starting after now() - width - step), over the stream's rows in a temporary table, in the
same transaction as the read (so both see the same now()).
"""

from __future__ import annotations

import contextlib
import itertools
import math
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines.cv import catalog
from pipelines.cv.engine import StreamMaintainer
from pipelines.cv.model import DefinitionError
from tests.integration.conftest import apply_rows, as_stream_table, throwaway_views, unique

WIDTH = "10 minutes"
SELECT = """SELECT g, count(*) AS n, count(DISTINCT u) AS users, avg(x) AS avg_x, max(x) AS top,
                   percentile_cont(0.5) WITHIN GROUP (ORDER BY x) AS median
            FROM {stream} {where} GROUP BY g"""
KEYED_SELECT = "SELECT g, count(*) AS n, sum(x) AS total FROM {stream} {where} GROUP BY g"


@pytest.fixture(scope="module")
def streams(stack, pg):
    name = unique("win")
    append, keyed = f"{name}_events", f"{name}_keyed"
    window = f"WHERE ts > clock_timestamp() - interval '{WIDTH}'"
    definitions = f"""
        CREATE STREAM {append} (g bigint, u bigint, x double precision, ts timestamptz) WITH (topic = '{append}');
        CREATE STREAM {keyed} (g bigint, k bigint, x bigint, ts timestamptz)
            WITH (topic = '{keyed}', key = 'g, k', timestamp_column = 'ts');
        CREATE CONTINUOUS VIEW {name}.recent AS {SELECT.format(stream=append, where=window)};
        CREATE CONTINUOUS VIEW {name}.recent_keyed AS
            {KEYED_SELECT.format(stream=keyed, where="WHERE arrival_timestamp > now() - interval '" + WIDTH + "'")};
        CREATE CONTINUOUS VIEW {name}.recent_total AS
            SELECT count(*) AS n FROM {append} WHERE ts > now() - interval '{WIDTH}';
    """
    with throwaway_views(pg, name, [append, keyed], definitions):
        yield {"schema": name, "append": append, "keyed": keyed}


def read_and_recompute(conn, view, stream, columns, rows, select, groups):
    """The view and its oracle, read in one transaction (one now())."""
    merged = f"WHERE cv.window_step(ts, '{WIDTH}') > now() - interval '{WIDTH}' - interval '{WIDTH}' / 60"
    with conn.transaction(force_rollback=True):
        got = conn.execute(f"SELECT * FROM {view} WHERE g = ANY(%s) ORDER BY g", (groups,)).fetchall()
        as_stream_table(conn, stream, columns, rows)
        query = select.format(stream=stream, where=merged)
        expected = conn.execute(f"SELECT * FROM ({query}) q WHERE g = ANY(%s) ORDER BY g", (groups,)).fetchall()
    return got, expected


@contextlib.contextmanager
def defined(pg, view, statement):
    """A view of the test's own, dropped after."""
    with pg("sv_owner", autocommit=True) as owner:
        catalog.define(owner, statement)
        try:
            yield
        finally:
            catalog.drop(owner, [view], "view")


example = itertools.count(1)
event = st.tuples(st.integers(0, 2), st.integers(0, 5), st.integers(0, 100), st.integers(0, 20 * 60))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=st.lists(event, max_size=40), cuts=st.lists(st.integers(0, 40), max_size=3))
def test_a_window_reads_as_the_aggregate_over_its_steps_for_any_batching(writer, streams, events, cuts):
    base = next(example) * 10
    now = datetime.now(UTC)
    # Events from the last 20 minutes: half of them are older than the 10-minute window.
    rows = [(base + g, u, float(x), now - timedelta(seconds=age)) for g, u, x, age in events]
    bounds = sorted({0, len(rows), *(c for c in cuts if c <= len(rows))})
    for start, end in itertools.pairwise(bounds):
        apply_rows(writer, streams["append"], [1] * (end - start), rows[start:end])
    got, expected = read_and_recompute(
        writer,
        f"{streams['schema']}.recent",
        streams["append"],
        "g bigint, u bigint, x double precision, ts timestamptz",
        rows,
        SELECT,
        [base + g for g in range(3)],
    )
    assert [r[:5] for r in got] == [r[:5] for r in expected]  # distinct users: hll is exact at this size
    for mine, theirs in zip(got, expected, strict=True):  # the median from a t-digest: within one value
        assert math.isclose(mine[5], theirs[5], abs_tol=1.0)


def test_retractions_leave_the_step_their_row_was_counted_in(writer, streams):
    now = datetime.now(UTC)
    g = 7_000_001
    rows = [(g, k, 10 * k, now - timedelta(minutes=k)) for k in range(1, 5)]
    apply_rows(writer, streams["keyed"], [1] * 4, rows)
    apply_rows(writer, streams["keyed"], [-1, -1], [rows[0], rows[2]])  # unlike two of them later

    got, expected = read_and_recompute(
        writer,
        f"{streams['schema']}.recent_keyed",
        streams["keyed"],
        "g bigint, k bigint, x bigint, ts timestamptz",
        [rows[1], rows[3]],
        KEYED_SELECT,
        [g],
    )
    assert got == expected == [(g, 2, 60)]


def test_old_steps_expire_and_late_rows_are_not_kept(writer, streams):
    maintainer = StreamMaintainer(streams["append"])
    now = datetime.now(UTC)
    late = (7_000_002, 1, 1.0, now - timedelta(hours=1))
    apply_rows(writer, streams["append"], [1], [late])
    storage = f"cv.{streams['schema']}__recent"
    assert writer.execute(f"SELECT count(*) FROM {storage} WHERE g = %s", (late[0],)).fetchone() == (0,)

    with writer.transaction():  # a step left behind by a window that moved on (written as the pipelines would)
        writer.execute(
            f"INSERT INTO {storage} (g, _cv_step, n, _cv_rows) VALUES (%s, now() - interval '1 hour', 1, 1)",
            (late[0],),
        )
    with writer.transaction():
        assert maintainer.expire(writer) >= 1
    assert writer.execute(f"SELECT count(*) FROM {storage} WHERE g = %s", (late[0],)).fetchone() == (0,)


def test_a_window_without_groups_has_one_row_and_a_read_by_group_is_an_index_scan(pg, writer, streams):
    apply_rows(writer, streams["append"], [1], [(7_000_003, 1, 1.0, datetime.now(UTC))])
    with pg("sv_reader") as reader:
        (n,) = reader.execute(f"SELECT n FROM {streams['schema']}.recent_total").fetchall()
        assert n[0] >= 1
        plan = "\n".join(
            r[0] for r in reader.execute(f"EXPLAIN SELECT * FROM {streams['schema']}.recent WHERE g = 7000003")
        )
        assert "Index Scan" in plan or "Index Only Scan" in plan, plan


def test_keyed_max_and_min_in_a_window_take_the_value_at_the_extreme_key_of_its_steps(pg, writer, streams):
    # PipelineDB's keyed_max(key, value) in a sliding window: the value at the greatest key among the
    # rows of the window (a tie of keys: the least value, as outside windows); rows older are not read.
    view = f"{streams['schema']}.keyed_window"
    statement = (
        f"CREATE CONTINUOUS VIEW {view} WITH (backfill = 'none') AS SELECT g, keyed_max(x, u) AS top_u,"
        f" keyed_min(x, u) AS low_u FROM {streams['append']} WHERE ts > now() - interval '{WIDTH}' GROUP BY g"
    )
    now, g = datetime.now(UTC), 7_000_100
    with defined(pg, view, statement):
        apply_rows(writer, streams["append"], [1, 1], [(g, 1, 5.0, now - timedelta(minutes=1)), (g, 3, 9.0, now)])
        apply_rows(
            writer,
            streams["append"],
            [1, 1, 1],
            [
                (g, 2, 9.0, now - timedelta(minutes=2)),  # ties with u = 3, in another step: the least u
                (g, 7, 1.0, now - timedelta(minutes=4)),
                (g, 4, 50.0, now - timedelta(minutes=20)),  # older than the window
            ],
        )
        with pg("sv_reader") as reader:
            assert reader.execute(f"SELECT top_u, low_u FROM {view} WHERE g = {g}").fetchall() == [(2, 7)]


def test_a_window_without_groups_counts_0_over_no_step_distinct_values_too(pg, streams):
    # PostgreSQL's count and count(DISTINCT) over no rows are 0 (a distinct count is kept as sketches
    # per step: merging none is NULL, read as 0); the other aggregates are NULL, as in PostgreSQL.
    view = f"{streams['schema']}.empty_window"
    statement = (
        f"CREATE CONTINUOUS VIEW {view} WITH (backfill = 'none') AS SELECT count(*) AS n, count(DISTINCT u) AS users,"
        f" max(x) AS top FROM {streams['append']} WHERE ts > now() - interval '1 second'"
    )
    with defined(pg, view, statement), pg("sv_reader") as reader:
        assert reader.execute(f"SELECT n, users, top FROM {view}").fetchall() == [(0, 0, None)]


@pytest.mark.parametrize(
    ("where", "match"),
    [
        ("WHERE g > now() - interval '1 minute'", "timestamptz column"),
        ("WHERE ts > now() - (interval '1 minute' * g)", "constant interval"),
        ("WHERE ts > now() - interval '1 minute' AND ts > now() - interval '2 minutes'", "only one"),
        # cv.window_step divides the width into 60 steps: these would fail every batch.
        ("WHERE ts > now() - interval '0 seconds'", r"at least 1 second wide .*not '0 seconds'"),
        ("WHERE ts > now() - interval '-5 minutes'", "at least 1 second wide"),
        ("WHERE ts > now() - interval '5 minutes ago'", "at least 1 second wide"),
        ("WHERE ts > now() - interval '1 month -40 days'", "at least 1 second wide"),
        ("WHERE ts > now() - interval '500 milliseconds'", "at least 1 second wide"),
        # now() minus about 6,700 years is out of PostgreSQL's range: every batch would fail.
        ("WHERE ts > now() - interval '7000 years'", "longer than 1000 years"),
        ("WHERE ts > now() - interval '5 minuts'", "is not an interval"),
    ],
)
def test_a_window_must_slide_over_a_timestamp_by_a_constant_width(pg, streams, where, match):
    statement = (
        f"CREATE CONTINUOUS VIEW {streams['schema']}.bad AS SELECT g, count(*) AS n FROM {streams['append']} "
        f"{where} GROUP BY g"
    )
    with pg("sv_owner", autocommit=True) as owner, pytest.raises(DefinitionError, match=match):
        catalog.define(owner, statement)


@pytest.mark.parametrize(
    ("ttl", "match"),
    [
        ("0 days", "positive"),
        ("-1 day", "positive"),
        ("1 millisecond", "at least 1 second"),
        ("7000 years", "longer than 1000 years"),
        ("soon", "not an"),
    ],
)
def test_a_ttl_must_be_from_1_second_to_1000_years(pg, streams, ttl, match):
    statement = (
        f"CREATE CONTINUOUS VIEW {streams['schema']}.bad WITH (ttl = '{ttl}') AS SELECT g, date_trunc('hour', ts) AS h,"
        f" count(*) AS n FROM {streams['append']} GROUP BY g, h"
    )
    with pg("sv_owner", autocommit=True) as owner, pytest.raises(DefinitionError, match=match):
        catalog.define(owner, statement)


@pytest.mark.parametrize(
    ("group", "match"),
    [
        ("date_trunc('fortnight', ts)", 'unit "fortnight" not recognized'),
        ("date_part('fortnight', ts)", 'unit "fortnight" not recognized'),
        ("extract(fortnight FROM ts)", 'unit "fortnight" not recognized'),
    ],
)
def test_a_time_unit_is_checked_when_the_view_is_defined_not_at_its_first_event(pg, streams, group, match):
    # Types are resolved over NULLs, which every unit passes; a real timestamp does not.
    statement = (
        f"CREATE CONTINUOUS VIEW {streams['schema']}.bad AS SELECT {group} AS b, count(*) AS n"
        f" FROM {streams['append']} GROUP BY b"
    )
    with pg("sv_owner", autocommit=True) as owner, pytest.raises(DefinitionError, match=match):
        catalog.define(owner, statement)
