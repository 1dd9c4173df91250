"""A view's change stream as defined: the `changes` option, what a change's delta covers, the capture's SQL."""

from __future__ import annotations

import pytest

from pipelines.cv import status
from pipelines.cv.cli import parse_args
from pipelines.cv.frontend.changes import AlterView, parse_change, with_options
from pipelines.cv.frontend.statements import NO_SCOPE, parse
from pipelines.cv.model import DefinitionError, Scope
from pipelines.cv.subscribe import names_view, qualified
from pipelines.cv.views import change_capture
from pipelines.cv.views.view_types import ViewTypes

CLICKS = "CREATE STREAM clicks (url text, ms int, ts timestamptz) WITH (topic = 'clicks')"


def view(query: str, options: str = ""):
    scope = Scope({"clicks": parse(CLICKS, NO_SCOPE)}, frozenset())
    return parse(f"CREATE CONTINUOUS VIEW t.v {options} AS {query}", scope)


STATS = (
    "SELECT url, count(*) AS n, sum(ms) AS total, avg(ms) AS mean, sum(ms) / count(*) AS ratio FROM clicks GROUP BY url"
)
TYPES = ViewTypes(("text",), ("bigint", "bigint", "bigint"), None, ("bigint", "bigint", "numeric", "bigint", "bigint"))


@pytest.mark.parametrize(
    ("options", "records"),
    [("", False), ("WITH (changes = true)", True), ("WITH (changes = 'on')", True), ("WITH (changes = false)", False)],
)
def test_changes_are_recorded_only_when_the_view_asks(options, records):
    assert view(STATS, options).records_changes is records


def test_changes_takes_a_boolean():
    with pytest.raises(DefinitionError, match="option changes takes true or false, not 'sometimes'"):
        view(STATS, "WITH (changes = 'sometimes')")


def test_a_sliding_window_refuses_changes_and_says_why():
    windowed = "SELECT url, count(*) AS n FROM clicks WHERE ts > clock_timestamp() - interval '5 minutes' GROUP BY url"
    assert not view(windowed).records_changes
    with pytest.raises(DefinitionError, match="rows change as time passes"):
        view(windowed, "WITH (changes = true)")


def test_alter_sets_and_resets_changes_like_ttl():
    assert parse_change("ALTER CONTINUOUS VIEW t.v SET (changes = true)") == AlterView("t.v", {"changes": "true"}, ())
    assert parse_change("ALTER CONTINUOUS VIEW t.v RESET (changes)") == AlterView("t.v", {}, ("changes",))
    text = with_options(f"CREATE CONTINUOUS VIEW t.v AS {STATS}", {"changes": "true", "ttl": "1 day"})
    assert "WITH (changes = 'true', ttl = '1 day')" in text


def test_the_delta_covers_outputs_that_are_a_count_or_a_sum_alone():
    # avg has no delta (PipelineDB's (delta) held its state, not a value); an expression has none either.
    assert change_capture.delta_columns(view(STATS), TYPES) == ["n", "total"]


def test_the_capture_projects_rows_as_the_read_view_shows_them():
    text = change_capture.projection(view(STATS), TYPES)
    assert text.startswith("SELECT to_jsonb(_cv_key) AS key, to_jsonb(_cv_row) AS row FROM cv_rows AS s")
    assert 'CROSS JOIN LATERAL (SELECT s."url") AS _cv_key' in text
    assert ' AS "mean"' in text
    assert ' AS "ratio"' in text


def test_three_statement_triggers_with_transition_tables():
    statements = [s.as_string(None) for s in change_capture.create_triggers(view(STATS), TYPES)]
    assert sum(s.startswith("DROP TRIGGER IF EXISTS") for s in statements) == 3
    created = [s for s in statements if s.startswith("CREATE TRIGGER")]
    assert [s.split()[4] for s in created] == ["INSERT", "UPDATE", "DELETE"]
    assert all("FOR EACH STATEMENT" in s and 'ON "cv"."t__v"' in s for s in created)


@pytest.mark.parametrize(
    ("payload", "named"),
    [
        ('{"views": {"public.a": 3}}', True),
        ('{"views": {"public.b": 3}}', False),
        ('{"views": ["public.a"]}', True),  # truncated to names
        ('{"views": null}', True),  # even the names were too long: read again
        ("not json", True),
    ],
)
def test_a_notification_wakes_the_subscriber_of_the_views_it_names(payload, named):
    assert names_view(payload, "public.a") is named


def test_subscribe_arguments():
    args = parse_args(["subscribe", "pv", "--from", "0", "--limit", "5"])
    assert (qualified(args.view), args.start, args.limit) == ("public.pv", "0", 5)
    assert parse_args(["subscribe", "x.pv"]).start == "now"
    with pytest.raises(SystemExit):
        parse_args(["subscribe", "pv", "--limit", "0"])


def test_status_lists_the_views_recording_changes_with_their_last_position():
    clicks = status.StreamStatus("clicks", "clicks", partitions=1, lag=0, change_positions={"public.by_url": 41})
    text = status.status_table("g", [clicks])
    assert "change streams" in text
    assert text.splitlines()[-1].split() == ["public.by_url", "clicks", "41"]
    assert clicks.as_json()["change_positions"] == {"public.by_url": 41}
    assert "change streams" not in status.status_table("g", [status.StreamStatus("clicks", "clicks")])
