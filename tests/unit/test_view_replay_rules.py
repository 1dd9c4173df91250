"""`streamviews replay`'s pure parts: what --from takes, when retention refuses it, the shadow's statement, refusals."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from pipelines.cv.catalog.replays import is_shadow, refusal, shadow_definition, shadow_name
from pipelines.cv.cli import parse_args
from pipelines.cv.cli_common import USAGE, CommandError
from pipelines.cv.frontend.statements import NO_SCOPE, parse
from pipelines.cv.model import Scope, ViewDef
from pipelines.cv.replay import parse_from, progress_line, retention_refusal

CLICKS = "CREATE STREAM clicks (url text, ms int, ts timestamptz) WITH (topic = 'clicks')"
USERS = "CREATE STREAM users (id int, name text) WITH (topic = 'users', key = 'id')"
NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)


def scope() -> Scope:
    streams = {s.name: s for s in (parse(CLICKS, NO_SCOPE), parse(USERS, NO_SCOPE))}
    return Scope(streams, frozenset({"my_agg"}))


def view(text: str) -> ViewDef:
    parsed = parse(text, scope())
    assert isinstance(parsed, ViewDef)
    return parsed


@pytest.mark.parametrize(
    ("given", "rule"),
    [("earliest", "earliest"), (" EARLIEST ", "earliest"), ("2026-11-26 12:00:00+00", "2026-11-26 12:00:00+00")],
)
def test_from_is_earliest_or_a_past_timestamp_with_its_time_zone(given, rule):
    assert parse_from(given, NOW) == rule


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ("none", "is not 'earliest' or a timestamp with its time zone"),
        ("yesterday", "is not 'earliest' or a timestamp with its time zone"),
        ("2026-11-26 12:00:00", "is not 'earliest' or a timestamp with its time zone"),  # no time zone
        ("2026-11-28 00:00:00+00", "is in the future"),
    ],
)
def test_any_other_from_is_refused_in_one_line_as_a_usage_error(given, says):
    with pytest.raises(CommandError) as refused:
        parse_from(given, NOW)
    assert says in str(refused.value)
    assert refused.value.status == USAGE


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp() * 1000)


def test_retention_refuses_a_from_before_the_oldest_event_a_partition_that_lost_records_still_holds():
    reach = {("t", 0): (0, ms("2026-11-20 00:00:00+00")), ("t", 1): (500, ms("2026-11-25 06:00:00+00"))}
    why = retention_refusal("2026-11-24 00:00:00+00", reach)
    assert why is not None
    assert "its complete history reaches back to 2026-11-25 06:00:00 UTC" in why
    assert "--from earliest" in why
    assert retention_refusal("2026-11-25 06:00:00+00", reach) is None  # from its oldest retained event on: whole
    assert retention_refusal("earliest", reach) is None  # whatever is retained


def test_a_partition_that_never_lost_a_record_holds_everything_and_one_that_lost_all_holds_nothing():
    assert retention_refusal("2020-01-01 00:00:00+00", {("t", 0): (0, ms("2026-11-20 00:00:00+00"))}) is None
    assert retention_refusal("2020-01-01 00:00:00+00", {("t", 0): (0, None)}) is None  # empty, never written
    reach = {("t", 0): (0, None), ("t", 1): (9, ms("2026-11-26 06:00:00+00")), ("t", 3): (70, None)}
    why = retention_refusal("2026-11-26 00:00:00+00", reach)
    assert why is not None
    assert "partition 3 of t retains no event any more" in why


def test_the_shadow_is_the_view_renamed_with_its_backfill_and_without_a_change_stream_of_its_own():
    definition = (
        "CREATE CONTINUOUS VIEW public.per_url WITH (changes = true, backfill = 'none') AS"
        " SELECT url, count(*) AS n FROM clicks GROUP BY url"
    )
    original = view(definition)
    text = shadow_definition(definition, original.options, shadow_name(7), "2026-11-26 12:00:00+00")
    shadow = view(text)
    assert shadow.qualified_name == "cv_replay.replay_7"
    assert is_shadow(shadow.qualified_name)
    assert not is_shadow(original.qualified_name)
    assert shadow.options == {"backfill": "2026-11-26 12:00:00+00"}
    assert not shadow.records_changes
    assert (shadow.groups, shadow.aggregates, shadow.outputs) == (
        original.groups,
        original.aggregates,
        original.outputs,
    )


def test_keyed_streams_and_order_dependent_aggregates_are_refused_naming_the_reason():
    keyed = view("CREATE CONTINUOUS VIEW public.names AS SELECT name, count(*) FROM users GROUP BY name")
    assert "its state is the source; nothing to replay" in refusal(keyed, scope().streams["users"])
    ordered = view("CREATE CONTINUOUS VIEW public.seq AS SELECT url, array_agg(ms) AS ms FROM clicks GROUP BY url")
    why = refusal(ordered, scope().streams["clicks"])
    assert why is not None
    assert "array_agg" in why
    assert "order events come in" in why
    counts = view("CREATE CONTINUOUS VIEW public.n AS SELECT url, count(*) FROM clicks GROUP BY url")
    assert refusal(counts, scope().streams["clicks"]) is None


def test_the_command_line_takes_a_view_and_from_no_wait_or_cancel():
    args = parse_args(["replay", "per_url", "--from", "earliest", "--no-wait"])
    assert (args.view, args.start, args.no_wait, args.cancel) == ("per_url", "earliest", True, False)
    assert parse_args(["replay", "per_url", "--cancel"]).cancel


def test_progress_says_offsets_done_of_those_to_do_and_an_eta_at_the_rate_so_far():
    from pipelines.cv.catalog.replays import Replay

    def state(done: int, total: int, caught_up: bool = False) -> Replay:
        return Replay(1, "public.v", "cv_replay.replay_1", "earliest", NOW, None, None, None, done, total, caught_up)

    assert (
        progress_line("public.v", state(0, 0), 1.0) == "replay of public.v: waiting for the stream runner to start it"
    )
    assert progress_line("public.v", state(250, 1000), 10.0) == "replay of public.v: 250/1000 offsets, about 30 s left"
    assert "caught up (1000/1000 offsets); swapping it in" in progress_line("public.v", state(1000, 1000, True), 1.0)
