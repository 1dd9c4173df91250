r"""The audit queries refuse a regex with back-references, which only the statement timeout would stop.

A back-reference (\1 .. \9) takes PostgreSQL's regex engine from its automaton to backtracking:
`(.*)(.*)\2\1 $` spends half a second on one 512-character content, and a user's day of them runs
to the reader's 10 s timeout. audit.user_events, user_events_estimate and user_events_count refuse
one before reading anything, with one line and SQLSTATE 2201B (invalid_regular_expression). (The
terminal search, `python -m pipelines.audit.search`, takes words for Elasticsearch's `match`, never a
regex: tests/unit/test_search_query.py.)
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
import pytest

NOW = datetime.now(UTC)
RANGE = {"u": 1, "since": NOW - timedelta(hours=1), "until": NOW}


@pytest.mark.parametrize("function", ["user_events", "user_events_estimate", "user_events_count"])
@pytest.mark.parametrize("pattern", [r"(.*)(.*)\2\1 $", r"^(a)\1", r"(?b)\(x\)\9", r"\\\1", r"(?<n>x)\k<n>"])
def test_a_back_reference_is_refused_in_one_line_before_anything_is_read(pg, function, pattern):
    with pg("sv_reader") as conn, pytest.raises(psycopg.errors.InvalidRegularExpression) as refused:
        conn.execute(
            f"SELECT * FROM audit.{function}(%(u)s, %(since)s, %(until)s, pattern => %(p)s)", {**RANGE, "p": pattern}
        )
    message = refused.value.diag.message_primary
    assert refused.value.sqlstate == "2201B"
    assert "\n" not in message
    assert message.startswith(f'audit: pattern "{pattern}" has a back-reference (\\')
    assert message.endswith("which the regex engine cannot bound; search without it")


@pytest.mark.parametrize("pattern", [r"^(login|password)", r"\d+ failed", r"\\1", r"a\01", r"***=\1"])
def test_other_patterns_and_an_escaped_backslash_are_searched(pg, pattern):
    with pg("sv_reader") as conn:
        assert conn.execute(
            "SELECT audit.user_events_count(%(u)s, %(since)s, %(until)s, pattern => %(p)s)", {**RANGE, "p": pattern}
        ).fetchone() == (0,)
