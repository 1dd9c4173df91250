"""A stream's options for its topic: where its first consumption starts, its retention, and ALTER STREAM SET / RESET.

PostgreSQL reads the retention's interval and size when the stream is defined (the catalog's check,
tests/integration/test_start_offsets.py); here, what the front end reads and refuses on its own.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from pipelines.cv.frontend.changes import AlterStream, parse_change, stream_with_column, stream_with_options
from pipelines.cv.frontend.statements import NO_SCOPE, parse, read_script
from pipelines.cv.model import DefinitionError


def stream(options: str):
    return parse(f"CREATE STREAM s (a bigint) WITH ({options})", NO_SCOPE)


def test_a_stream_starts_at_the_beginning_of_its_topic_unless_told_otherwise():
    assert parse("CREATE STREAM s (a bigint)", NO_SCOPE).start_at == "earliest"
    assert stream("start_offset = 'latest'").start_at == "latest"
    assert stream("start_offset = 'earliest'").start_at == "earliest"


def test_a_start_time_is_a_timestamp_with_its_zone_taken_as_epoch_milliseconds():
    expected = int(datetime(2026, 11, 26, 12, tzinfo=UTC).timestamp() * 1000)
    assert stream("start_offset = '2026-11-26 12:00:00+00'").start_at == expected
    assert stream("start_offset = '2026-11-26T13:00:00+01:00'").start_at == expected
    assert stream("start_offset = '2026-11-26 12:00:00.250Z'").start_at == expected + 250


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("2026-11-26 12:00:00", "with its time zone"),  # a session's zone would decide
        ("yesterday", "is not 'earliest', 'latest' or a timestamp"),
        ("LATEST", "is not 'earliest', 'latest' or a timestamp"),
        ("", "is not 'earliest', 'latest' or a timestamp"),
    ],
)
def test_a_start_offset_that_is_no_rule_is_refused_naming_what_it_takes(value, match):
    with pytest.raises(DefinitionError, match=match):
        stream(f"start_offset = '{value}'")


def test_retention_is_kept_as_written_for_postgresql_to_read():
    s = stream("retention = '7 days', retention_bytes = '10 GB'")
    assert (s.retention, s.retention_bytes) == ("7 days", "10 GB")
    assert (parse("CREATE STREAM s (a bigint)", NO_SCOPE).retention, s.start_offset) == (None, "earliest")


def test_alter_stream_sets_and_resets_its_topic_options():
    assert parse_change("ALTER STREAM s SET (retention = '3 days', retention_bytes = '1 GB')") == AlterStream(
        "s", {"retention": "3 days", "retention_bytes": "1 GB"}, ()
    )
    assert parse_change("alter stream s reset (retention);") == AlterStream("s", {}, ("retention",))
    [item] = read_script("ALTER STREAM s SET (retention = '1 day');").statements
    assert item.change == AlterStream("s", {"retention": "1 day"}, ())


@pytest.mark.parametrize(
    ("statement", "match"),
    [
        ("ALTER STREAM s SET (topic = 'other')", "option 'topic' cannot be changed; known: retention, retention_bytes"),
        ("ALTER STREAM s SET (start_offset = 'latest')", "option 'start_offset' cannot be changed"),
        ("ALTER STREAM s SET (retention = 7)", "option retention takes a quoted string"),
        ("ALTER STREAM x.s SET (retention = '1 day')", "a stream's name has no schema"),
        (
            "ALTER STREAM s ALTER COLUMN a TYPE text",
            "the type of column a cannot change: its views' state was computed",
        ),
        ("ALTER STREAM s ALTER COLUMN a SET DEFAULT 1", "supported: SET / RESET .*, ADD COLUMN, DROP COLUMN"),
        ("ALTER STREAM s ADD COLUMN b int, ADD COLUMN c int", "one ADD COLUMN or DROP COLUMN per statement"),
        ("ALTER STREAM s ADD COLUMN b int, SET (retention = '1 day')", "one ADD COLUMN or DROP COLUMN per statement"),
        ("ALTER STREAM s DROP COLUMN b CASCADE", "CASCADE is not supported"),
        ("ALTER STREAM s DROP COLUMN IF EXISTS b", "DROP COLUMN IF EXISTS is not supported"),
        ("ALTER STREAM s ADD COLUMN IF NOT EXISTS b int", "ADD COLUMN IF NOT EXISTS is not supported"),
    ],
)
def test_an_alter_stream_of_what_cannot_change_is_refused_in_one_line(statement, match):
    with pytest.raises(DefinitionError, match=match):
        parse_change(statement)


def test_the_statement_altered_keeps_everything_but_its_options_as_written():
    definition = (
        "CREATE STREAM s (a bigint DEFAULT (1), b text CHECK (b <> 'with (x)')) -- a comment\n"
        "  WITH (topic = 't', partitions = 3, retention = '1 day');"
    )
    altered = stream_with_options(definition, {"retention_bytes": "1 GB"}, ("retention",))

    assert altered == (
        "CREATE STREAM s (a bigint DEFAULT (1), b text CHECK (b <> 'with (x)')) -- a comment\n"
        "WITH (topic = 't', partitions = '3', retention_bytes = '1 GB')"
    )
    s = parse(altered, NO_SCOPE)
    assert (s.topic, s.partitions, s.retention, s.retention_bytes) == ("t", 3, None, "1 GB")


def test_options_added_to_a_statement_without_any_and_all_reset_away():
    added = stream_with_options("CREATE STREAM s (a bigint)", {"retention": "2 days"}, ())
    assert added == "CREATE STREAM s (a bigint)\nWITH (retention = '2 days')"
    assert stream_with_options(added, {}, ("retention",)) == "CREATE STREAM s (a bigint)"


def test_add_and_drop_column_name_the_column():
    assert parse_change("ALTER STREAM s ADD COLUMN country text DEFAULT 'unknown'") == AlterStream(
        "s", {}, (), add_column="country text DEFAULT 'unknown'"
    )
    assert parse_change("ALTER STREAM s ADD c int") == AlterStream("s", {}, (), add_column="c integer")  # deparsed
    assert parse_change("ALTER STREAM s DROP COLUMN c;") == AlterStream("s", {}, (), drop_column="c")


DEFINITION = (
    "CREATE STREAM s (a bigint DEFAULT (1), b text CHECK (b <> 'x, y'), -- the referrer\n"
    "  ts timestamptz, CHECK (a > 0)) WITH (topic = 't');"
)


def test_a_column_added_goes_last_and_the_rest_stays_as_written():
    added = stream_with_column(DEFINITION, "country text DEFAULT 'unknown'", None)

    assert added == (
        "CREATE STREAM s (a bigint DEFAULT (1), b text CHECK (b <> 'x, y'), -- the referrer\n"
        "  ts timestamptz, CHECK (a > 0),\n    country text DEFAULT 'unknown'\n) WITH (topic = 't')"
    )
    assert parse(added, NO_SCOPE).column_names == ("a", "b", "ts", "country")


@pytest.mark.parametrize(("column", "columns"), [("a", ("b", "ts")), ("b", ("a", "ts")), ("ts", ("a", "b"))])
def test_a_column_dropped_leaves_the_others_and_the_table_checks(column, columns):
    dropped = stream_with_column(DEFINITION, None, column)

    if column == "a":  # the table CHECK reads it: the statement no longer parses, and the catalog says so
        with pytest.raises(DefinitionError, match=r"CHECK \(a > 0\) uses a, which it may not"):
            parse(dropped, NO_SCOPE)
        return
    assert parse(dropped, NO_SCOPE).column_names == columns


def test_dropping_a_column_the_stream_does_not_have_is_refused():
    with pytest.raises(DefinitionError, match="DROP COLUMN zz: the stream has no such column"):
        stream_with_column(DEFINITION, None, "zz")
