"""`python -m pipelines.audit.search` without Elasticsearch: reading times and fields, the query, the output."""

from __future__ import annotations

import datetime
import socket

import pytest

from pipelines.audit import search

NOW = datetime.datetime(2026, 11, 22, 12, 0, tzinfo=datetime.UTC)


@pytest.mark.parametrize(
    ("text", "ago"),
    [
        ("90s", datetime.timedelta(seconds=90)),
        ("15m", datetime.timedelta(minutes=15)),
        ("2h", datetime.timedelta(hours=2)),
        ("7d", datetime.timedelta(days=7)),
    ],
)
def test_a_duration_means_that_long_before_now(text, ago):
    assert search.parse_time(text, NOW) == NOW - ago


@pytest.mark.parametrize(
    ("text", "moment"),
    [
        ("2026-11-22T10:00:00Z", datetime.datetime(2026, 11, 22, 10, tzinfo=datetime.UTC)),
        ("2026-11-22T11:00:00.5+01:00", datetime.datetime(2026, 11, 22, 10, 0, 0, 500_000, tzinfo=datetime.UTC)),
    ],
)
def test_an_rfc_3339_timestamp_is_taken_as_written(text, moment):
    assert search.parse_time(text, NOW) == moment


def test_a_timestamp_without_an_offset_is_refused_rather_than_guessed():
    with pytest.raises(ValueError, match="no UTC offset"):
        search.parse_time("2026-11-22T10:00:00", NOW)


@pytest.mark.parametrize("text", ["2 hours", "h2", "-5m", "yesterday", ""])
def test_anything_else_is_neither_a_duration_nor_a_timestamp(text):
    with pytest.raises(ValueError, match="neither a duration"):
        search.parse_time(text, NOW)


@pytest.mark.parametrize("text", ["99999999999d", "999999999999999999999s", "3000000000d"])
def test_a_duration_beyond_the_calendar_is_refused_not_a_crash(text):
    with pytest.raises(ValueError, match="before the year 1"):
        search.parse_time(text, NOW)


def test_a_field_filter_is_name_equals_value_and_the_value_may_hold_anything():
    assert search.parse_field("action=login") == ("action", "login")
    assert search.parse_field("note=a=b c") == ("note", "a=b c")


@pytest.mark.parametrize("text", ["action", "Action=x", "1st=x", "=x", "a-b=x"])
def test_a_field_filter_needs_a_contract_field_name(text):
    with pytest.raises(ValueError, match="not name=value"):
        search.parse_field(text)


@pytest.mark.parametrize("text", ["0", "10001"])
def test_the_limit_stays_within_what_one_search_returns(text):
    with pytest.raises(ValueError, match="between 1 and 10,000"):
        search.parse_limit(text)


def test_words_must_all_occur_in_content():
    query = search.build_query("failed login")["query"]["bool"]

    assert query["must"] == [{"match": {"content": {"query": "failed login", "operator": "and"}}}]
    assert query["filter"] == []


def test_without_words_every_event_matches():
    assert search.build_query()["query"] == {"bool": {"must": [], "filter": []}}


def test_uid_fields_and_time_are_exact_filters_that_do_not_score():
    since, until = NOW - datetime.timedelta(hours=2), NOW

    query = search.build_query(uid=42, since=since, until=until, fields=[("action", "login"), ("source", "web")])

    assert query["query"]["bool"]["filter"] == [
        {"term": {"uid": 42}},
        {"term": {"action": "login"}},
        {"term": {"source": "web"}},
        {"range": {"ts": {"gte": "2026-11-22T10:00:00+00:00", "lte": "2026-11-22T12:00:00+00:00"}}},
    ]


def test_an_open_ended_range_has_one_bound():
    (time_range,) = search.build_query(since=NOW)["query"]["bool"]["filter"]

    assert time_range == {"range": {"ts": {"gte": "2026-11-22T12:00:00+00:00"}}}


def test_hits_come_newest_first_with_the_row_address_breaking_ties():
    body = search.build_query("x", limit=5)

    assert [next(iter(key)) for key in body["sort"]] == ["ts", "pg_table", "pg_ctid"]
    assert {key[next(iter(key))]["order"] for key in body["sort"]} == {"desc"}
    assert (body["size"], body["track_total_hits"]) == (5, True)


HIT = {
    "_index": "audit-2026.11.22",
    "_id": "audit.shard03_20261122:12:5",
    "_source": {
        "ts": "2026-11-22T10:00:00.123456+00:00",
        "uid": 42,
        "content": "Failed login for bob\nfrom the console",
        "pg_table": "audit.shard03_20261122",
        "pg_ctid": "(12,5)",
        "action": "login",
        "source": "admin console",
    },
}


def test_a_hit_is_one_line_with_its_row_address_extras_and_content():
    line = search.format_hit(HIT)

    assert line == (
        "2026-11-22T10:00:00.123456+00:00  uid=42  audit.shard03_20261122  (12,5)  action=login"
        '  source="admin console"  Failed login for bob from the console'
    )


def test_matched_words_are_marked_and_cut_content_ends_with_an_ellipsis():
    hit = {**HIT, "highlight": {"content": ["«Failed» «login» for bob"]}}

    assert search.format_hit(hit).endswith("  «Failed» «login» for bob…")


def test_long_content_without_a_highlight_is_cut_to_one_line():
    hit = {**HIT, "_source": {**HIT["_source"], "content": "x" * 512}}

    assert search.format_hit(hit).endswith("  " + "x" * (search.CONTENT_CHARS - 1) + "…")


def test_json_output_is_the_stored_document_with_its_index_and_id():
    assert search.hit_json(HIT).startswith(
        '{"_index": "audit-2026.11.22", "_id": "audit.shard03_20261122:12:5", "ts": "2026-11-22T10:00:00.123456+00:00"'
    )


def test_an_unreachable_elasticsearch_is_a_clear_error_and_a_non_zero_exit(monkeypatch, capsys):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("ES_URL", f"http://127.0.0.1:{port}")

    assert search.main(["failed login"]) == 1
    assert capsys.readouterr().err.startswith(f"error: cannot reach Elasticsearch at http://127.0.0.1:{port}")
