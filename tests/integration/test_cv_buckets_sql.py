"""PipelineDB's bucket helpers (migration 0022): in plain SQL, in rolled-back transactions, and in a view.

date_round's cases are PipelineDB's own regression tests (src/test/regress/sql/date_round.sql, its
expected times in PST), here in UTC.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.integration.conftest import apply_rows, throwaway_views, unique

AT = "2001-02-17 04:38:40+00"  # PipelineDB's TIMESTAMP '2001-02-16 20:38:40' PST


@pytest.fixture
def owner(pg):
    with pg("sv_owner") as conn:
        yield conn  # each test's statements run in a transaction closed without a commit


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        ("15 second", "2001-02-17 04:38:30+00"),
        ("10 minute", "2001-02-17 04:30:00+00"),
        ("3 hour", "2001-02-17 03:00:00+00"),
        ("2 month", "2000-12-26 00:00:00+00"),  # 60 days from 2000-01-01
        ("7 year", "2000-01-01 00:00:00+00"),
        ("150 second", "2001-02-17 04:37:30+00"),
        ("65 minute", "2001-02-17 03:45:00+00"),
        ("48 hour", "2001-02-16 00:00:00+00"),
        ("36 day", "2001-01-31 00:00:00+00"),
    ],
)
def test_date_round_rounds_down_as_pipelinedb(owner, step, expected):
    got = owner.execute("SELECT date_round(%s::timestamptz, %s::interval) = %s::timestamptz", (AT, step, expected))
    assert got.fetchone() == (True,)


def test_date_round_of_nulls_and_infinity_and_before_2000(owner):
    row = owner.execute(
        "SELECT date_round(NULL, '5 minutes'), date_round(%s::timestamptz, NULL) = %s::timestamptz,"
        " isfinite(date_round('infinity'::timestamptz, '1 minute')), date_round('1999-12-31 23:59:59+00', '1 hour')",
        (AT, AT),
    ).fetchone()
    # NULL stays NULL, no step keeps ts, infinity stays infinite, before 2000 rounds down (not toward 2000)
    assert row == (None, True, False, datetime(1999, 12, 31, 23, tzinfo=UTC))


def test_date_round_of_a_timestamp_is_a_timestamptz_of_the_session_zone_as_pipelinedb(owner):
    owner.execute("SET LOCAL TimeZone = 'PST8PDT'")
    row = owner.execute("SELECT date_round('2001-02-16 20:38:40'::timestamp, '3 hours')").fetchone()
    assert row == (datetime(2001, 2, 17, 3, tzinfo=UTC),)  # 19:00 PST, as PipelineDB's date_round test answers


@pytest.mark.parametrize("zone", ["UTC", "Asia/Kolkata", "America/Los_Angeles"])
def test_the_unit_helpers_truncate_in_utc_whatever_the_session_zone(owner, zone):
    owner.execute("SELECT set_config('TimeZone', %s, true)", (zone,))
    row = owner.execute(
        "SELECT second(t), minute(t), hour(t), day(t), month(t), year(t)"
        " FROM (SELECT '2001-02-17 04:38:40.5+00'::timestamptz AS t) AS s"
    ).fetchone()
    assert [v.astimezone(UTC) for v in row] == [
        datetime(2001, 2, 17, 4, 38, 40, tzinfo=UTC),
        datetime(2001, 2, 17, 4, 38, tzinfo=UTC),
        datetime(2001, 2, 17, 4, tzinfo=UTC),
        datetime(2001, 2, 17, tzinfo=UTC),
        datetime(2001, 2, 1, tzinfo=UTC),
        datetime(2001, 1, 1, tzinfo=UTC),
    ]


def test_the_helpers_are_immutable_and_readers_may_call_them(pg):
    with pg("sv_reader") as conn:
        volatility = conn.execute(
            "SELECT DISTINCT provolatile FROM pg_proc"
            " WHERE proname IN ('second', 'minute', 'hour', 'day', 'month', 'year', 'date_round')"
        ).fetchall()
        assert volatility == [("i",)]
        assert conn.execute("SELECT minute('2030-01-01 00:00:30+00'::timestamptz)").fetchone()[0].second == 0


def test_a_view_groups_by_a_helper_and_its_ttl_expires_by_it(stack, pg):
    name = unique("bucket")
    stream = f"{name}_clicks"
    now = datetime.now(UTC)
    definitions = f"""
        CREATE STREAM {stream} (url text, ts timestamptz) WITH (topic = '{stream}');
        CREATE CONTINUOUS VIEW {name}.per_minute WITH (ttl = '1 hour') AS
            SELECT minute(ts), url, count(*) FROM {stream} GROUP BY 1, url;
        CREATE CONTINUOUS VIEW {name}.per_5 AS
            SELECT date_round(ts, '5 minutes') AS at, count(*) AS n FROM {stream} GROUP BY at;
    """
    with throwaway_views(pg, name, [stream], definitions), pg("sv_writer", autocommit=True) as conn:
        times = [now - timedelta(hours=2), now, now + timedelta(seconds=1)]
        apply_rows(conn, stream, [1, 1, 1], [("/a", t) for t in times])
        rows = conn.execute(f"SELECT minute, url, count FROM {name}.per_minute ORDER BY 1").fetchall()
        expected = conn.execute(
            "SELECT minute(t), '/a', count(*) FROM unnest(%s::timestamptz[]) AS t"
            " WHERE t >= now() - interval '1 hour' GROUP BY 1 ORDER BY 1",
            (times,),
        ).fetchall()
        assert rows == expected  # the event of two hours ago is past the ttl: never kept
        fives = conn.execute(f"SELECT at, n FROM {name}.per_5 ORDER BY 1").fetchall()
        assert (
            fives
            == conn.execute(
                "SELECT date_round(t, '5 minutes'), count(*) FROM unnest(%s::timestamptz[]) AS t GROUP BY 1 ORDER BY 1",
                (times,),
            ).fetchall()
        )
