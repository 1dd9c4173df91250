"""Views over views as the front end reads them (FROM <view>, FROM output_of(<view>), refusals), and their status."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from pipelines.cv.feeds import FeedState
from pipelines.cv.frontend.statements import NO_SCOPE, parse
from pipelines.cv.frontend.view_sources import changes_stream, from_definition, rows_stream, to_definition
from pipelines.cv.model import DefinitionError, Scope
from pipelines.cv.status import feeds_table
from pipelines.cv.views.stream_sql import feed_to_deltas

CLICKS = parse("CREATE STREAM clicks (url text, ms int, ts timestamptz) WITH (topic = 'clicks')", NO_SCOPE)
PER_MINUTE = rows_stream(
    "web.per_minute",
    (("minute", "timestamp with time zone"), ("url", "text"), ("n", "bigint"), ("peak", "integer")),
    ("minute", "url"),
)
SCOPE = Scope({"clicks": CLICKS}, frozenset(), views={"web.per_minute": PER_MINUTE})


def view(select: str, scope: Scope = SCOPE):
    return parse(f"CREATE CONTINUOUS VIEW web.v AS {select}", scope)


def test_a_view_named_in_from_is_read_as_a_keyed_stream_of_its_rows():
    hourly = view(
        "SELECT date_trunc('hour', minute) AS hour, url, sum(n) AS n, max(peak) AS peak, count(*) AS minutes"
        " FROM web.per_minute GROUP BY 1, 2"
    )
    assert hourly.stream == "web.per_minute"
    assert PER_MINUTE.key == ("minute", "url")
    assert PER_MINUTE.feed_of == "web.per_minute"


def test_an_unqualified_view_is_in_public():
    scope = Scope(
        {"clicks": CLICKS},
        frozenset(),
        views={"public.pm": rows_stream("public.pm", (("g", "text"), ("n", "bigint")), ("g",))},
    )
    assert view("SELECT g, sum(n) AS n FROM pm GROUP BY g", scope).stream == "public.pm"


@pytest.mark.parametrize("spelling", ["'web.per_minute'", "web.per_minute", "'per_minute'"])
def test_output_of_reads_the_changes_as_old_new_and_delta(spelling):
    scope = SCOPE if "web" in spelling else Scope({}, frozenset(), views={"public.per_minute": PER_MINUTE})
    alerts = view(
        f"SELECT (new).url AS url, count(*) AS crossings FROM output_of({spelling})"
        " WHERE (new).n >= 100 AND ((old) IS NULL OR (old).n < 100) GROUP BY 1",
        scope,
    )
    upstream = "web.per_minute" if "web" in spelling else "public.per_minute"
    assert alerts.stream == f"output_of({upstream})"
    assert changes_stream(upstream).column_names == ("old", "new", "delta")
    assert changes_stream(upstream).key is None


def test_a_feed_streams_definition_reads_back():
    for stream in (PER_MINUTE, changes_stream("web.per_minute")):
        assert from_definition(stream.name, stream.topic, to_definition(stream)) == stream
        assert stream.topic.startswith("view:")  # no Kafka topic can be named so


@pytest.mark.parametrize(
    ("select", "message"),
    [
        (
            "SELECT url, combine(n) AS n FROM web.per_minute GROUP BY url",
            "combine.*no continuous view.*records its states",
        ),
        (
            "SELECT g, count(*) AS n FROM output_of('web.nope') GROUP BY g",
            "no continuous view or transform named web\\.nope",
        ),
        ("SELECT g, count(*) AS n FROM output_of('a', 'b') GROUP BY g", "give exactly one view"),
        ("SELECT g, count(*) AS n FROM generate_series(1, 3) AS g GROUP BY g", "FROM must name one stream"),
        ("SELECT url, count(*) AS n FROM web.per_minute AS p GROUP BY url", "alias"),
        ("SELECT url, count(*) AS n FROM web.elsewhere GROUP BY url", "not a stream .* nor a continuous view"),
        (
            "SELECT url, percentile_cont(0.5) WITHIN GROUP (ORDER BY peak) AS p FROM web.per_minute GROUP BY url",
            "cannot forget",
        ),
    ],
)
def test_what_cannot_be_read_is_refused_in_one_line(select, message):
    with pytest.raises(DefinitionError, match=message):
        view(select)


def test_a_feed_stream_is_read_through_its_view_not_by_its_name():
    scope = Scope({"clicks": CLICKS, "web.per_minute": PER_MINUTE}, frozenset())
    assert view("SELECT url, sum(n) AS n FROM web.per_minute GROUP BY url", scope).stream == "web.per_minute"


def test_status_lists_each_feed_with_its_lag_and_views():
    feed = FeedState(
        "web.per_minute", "web.per_minute", 40, 42, datetime(2026, 11, 26, 20, 0, tzinfo=UTC), "web.hourly", 1
    )
    assert feed.as_json() | {"taken_at": None} == {
        "feed": "web.per_minute",
        "upstream": "web.per_minute",
        "position": 40,
        "upstream_last": 42,
        "lag": 2,
        "taken_at": None,
        "views": ["web.hourly"],
        "quarantined_views": 1,
        "dead_letters": 0,
    }
    lines = feeds_table([feed]).splitlines()
    assert lines[2] == "views over views"
    row = ["web.per_minute", "web.per_minute", "2", "2026-11-26", "20:00:00", "web.hourly", "1", "0"]
    assert lines[-1].split() == row  # ... quarantined views, dead letters
    assert feeds_table([]) == ""


def test_a_feed_types_its_page_keys_from_json_text_unless_a_key_is_no_json_scalar():
    scalar = feed_to_deltas(PER_MINUTE).as_string(None)
    assert "(u.key ->> 'minute')::timestamp with time zone" in scalar
    assert "jsonb_populate_record" not in scalar
    tagged = rows_stream("web.per_tags", (("tags", "text[]"), ("n", "bigint")), ("tags",))
    assert 'jsonb_populate_record(NULL::"cv"."state_web.per_tags", u.key)' in feed_to_deltas(tagged).as_string(None)
