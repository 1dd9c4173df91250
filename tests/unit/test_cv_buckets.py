"""PipelineDB's bucket helpers are time buckets of a view, as date_trunc is (what its ttl expires by)."""

from __future__ import annotations

import pytest

from pipelines.cv.frontend.statements import NO_SCOPE, Scope, parse
from pipelines.cv.model import DefinitionError

CLICKS = "CREATE STREAM clicks (oid bigint, ts timestamptz, on_day date) WITH (topic = 'clicks')"


@pytest.fixture
def view():
    streams = {"clicks": parse(CLICKS, NO_SCOPE)}

    def parse_view(query: str, options: str = "WITH (ttl = '7 days')"):
        return parse(f"CREATE CONTINUOUS VIEW t.v {options} AS {query}", Scope(streams, frozenset()))

    return parse_view


@pytest.mark.parametrize(
    ("bucket", "unit"),
    [
        ("second(ts)", "second"),
        ("minute(ts)", "minute"),
        ("hour(ts)", "hour"),
        ("day(ts)", "day"),
        ("month(on_day)", "month"),
        ("public.year(ts)", "year"),
        ("date_round(ts, '5 minutes')", "5 minutes"),
        ("date_round(ts, interval '1 hour')", "1 hour"),
        ("date_trunc('week', ts)", "week"),
    ],
)
def test_each_helper_is_a_time_bucket_a_ttl_expires_by(view, bucket, unit):
    parsed = view(f"SELECT {bucket} AS b, count(*) AS n FROM clicks GROUP BY b")
    assert (parsed.bucket.name, parsed.bucket.bucket_unit, parsed.ttl) == ("b", unit, "7 days")


@pytest.mark.parametrize(
    "bucket", ["minute(ts + interval '1 minute')", "date_round(ts, make_interval(mins => 5))", "other.minute(ts)"]
)
def test_a_helper_over_an_expression_or_another_schema_is_no_bucket(view, bucket):
    with pytest.raises(DefinitionError, match="ttl needs a time bucket in GROUP BY"):
        view(f"SELECT {bucket} AS b, count(*) AS n FROM clicks GROUP BY b")


def test_a_helper_groups_by_position_as_pipelinedb_users_wrote_it(view):
    parsed = view("SELECT minute(ts), count(*) FROM clicks GROUP BY 1", "")
    assert [(g.name, g.sql, g.bucket_unit) for g in parsed.groups] == [("minute", "minute(ts)", "minute")]


@pytest.mark.parametrize(("position", "match"), [("3", "not in the select list"), ("2", "that output is an aggregate")])
def test_a_group_by_position_names_a_plain_output(view, position, match):
    with pytest.raises(DefinitionError, match=match):
        view(f"SELECT minute(ts), count(*) FROM clicks GROUP BY {position}", "")
