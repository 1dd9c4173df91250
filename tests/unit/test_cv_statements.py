"""ALTER and DROP statements, and CREATE OR REPLACE, as the parser reads them (no database)."""

from __future__ import annotations

import pytest

from pipelines.cv.frontend.changes import AlterView, Drop, parse_change, with_options
from pipelines.cv.frontend.statements import NO_SCOPE, numbered_statements, parse
from pipelines.cv.model import DefinitionError, Scope, ViewDef

STREAM = "CREATE STREAM clicks (url text, ts timestamptz) WITH (topic = 'clicks')"
HOURLY = (
    "CREATE CONTINUOUS VIEW web.hourly WITH (ttl = '30 days') AS "
    "SELECT url, date_trunc('hour', ts) AS hour, count(*) AS n FROM clicks GROUP BY url, hour"
)


@pytest.mark.parametrize(
    ("statement", "change"),
    [
        ("ALTER CONTINUOUS VIEW web.hourly SET (ttl = '7 days')", AlterView("web.hourly", {"ttl": "7 days"}, ())),
        ("alter continuous view hourly reset (ttl);", AlterView("public.hourly", {}, ("ttl",))),
        ("DROP CONTINUOUS VIEW IF EXISTS web.a, b", Drop("view", ("web.a", "public.b"), True)),
        ("DROP STREAM clicks", Drop("stream", ("clicks",), False)),
        (STREAM, None),
    ],
)
def test_alter_and_drop_statements_are_read_as_changes(statement, change):
    assert parse_change(statement) == change


@pytest.mark.parametrize(
    ("statement", "match"),
    [
        ("ALTER CONTINUOUS VIEW web.hourly SET (retention = '1 day')", "cannot be changed"),
        ("ALTER CONTINUOUS VIEW web.hourly RENAME TO other", "supported"),
        ("DROP STREAM clicks CASCADE", "CASCADE"),
        ("DROP STREAM web.clicks", "no schema"),
        ("DROP CONTINUOUS VIEW", "syntax error"),
    ],
)
def test_an_unsupported_change_is_refused_naming_it(statement, match):
    with pytest.raises(DefinitionError, match=match):
        parse_change(statement)


def test_options_are_rewritten_into_the_definition_and_it_still_parses():
    streams = {"clicks": parse(STREAM, NO_SCOPE)}
    rewritten = with_options(HOURLY, {"ttl": "7 days"})
    view = parse(rewritten, Scope(streams, frozenset()))
    assert isinstance(view, ViewDef)
    assert (view.ttl, view.outputs) == ("7 days", parse(HOURLY, Scope(streams, frozenset())).outputs)


def test_or_replace_marks_the_view_and_is_kept_out_of_its_stored_definition():
    streams = {"clicks": parse(STREAM, NO_SCOPE)}
    view = parse(HOURLY.replace("CREATE CONTINUOUS", "CREATE OR REPLACE CONTINUOUS"), Scope(streams, frozenset()))
    assert view.replace
    assert view.definition == HOURLY


def test_errors_in_a_file_of_changes_name_the_statement():
    statements = numbered_statements(f"{STREAM};\nALTER CONTINUOUS VIEW web.hourly SET (ttl = '1 day');")
    assert [s.label for s in statements] == ["CREATE STREAM clicks", "ALTER CONTINUOUS VIEW web.hourly"]
