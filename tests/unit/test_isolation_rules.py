"""The rules isolation decides by: which failures are the database's, which a view's, which the records'."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace

import psycopg
import pytest
from psycopg import errors as pg_errors

from pipelines.cv import status
from pipelines.cv.apply_errors import ViewApplyError, describe_error
from pipelines.cv.isolation import broken_definition, units_of
from pipelines.cv.stream_changes import Origin, StreamChanges
from pipelines.runtime.checkpoint import Fenced, is_transient
from pipelines.runtime.deadletter import DeadLetterError


def pg_error(cls: type[psycopg.Error]) -> psycopg.Error:
    error = cls("boom")
    assert error.sqlstate, cls
    return error


@pytest.mark.parametrize(
    "error",
    [
        Fenced("moved"),
        psycopg.OperationalError("server closed the connection"),
        pg_error(pg_errors.DeadlockDetected),
        pg_error(pg_errors.SerializationFailure),
        pg_error(pg_errors.QueryCanceled),
        pg_error(pg_errors.LockNotAvailable),
        pg_error(pg_errors.DiskFull),
        pg_error(pg_errors.AdminShutdown),
        DeadLetterError("kafka is away"),
    ],
)
def test_failures_of_the_database_or_kafka_retry_the_whole_batch(error):
    assert is_transient(error)
    assert is_transient(ViewApplyError("public.v", error)) == isinstance(error, psycopg.Error)


@pytest.mark.parametrize(
    "error",
    [
        pg_error(pg_errors.NumericValueOutOfRange),
        pg_error(pg_errors.DivisionByZero),
        pg_error(pg_errors.ProgramLimitExceeded),
        pg_error(pg_errors.UndefinedTable),
        pg_error(pg_errors.InsufficientPrivilege),
        TypeError("Integer exceeds 64-bit range"),
        RecursionError("maximum recursion depth exceeded"),
    ],
)
def test_failures_of_the_batch_are_isolated(error):
    assert not is_transient(error)
    assert not is_transient(ViewApplyError("public.v", error))


def test_a_view_that_cannot_run_is_told_from_records_it_cannot_take():
    assert broken_definition(pg_error(pg_errors.UndefinedTable))
    assert broken_definition(pg_error(pg_errors.UndefinedFunction))
    assert broken_definition(pg_error(pg_errors.InsufficientPrivilege))
    assert broken_definition(pg_error(pg_errors.FeatureNotSupported))
    assert not broken_definition(pg_error(pg_errors.NumericValueOutOfRange))
    assert not broken_definition(pg_error(pg_errors.UniqueViolation))
    assert not broken_definition(TypeError("not PostgreSQL's"))


def test_an_error_is_described_in_one_line_with_its_sqlstate():
    assert describe_error(pg_error(pg_errors.DivisionByZero)) == "SQLSTATE 22012: boom"
    assert describe_error(TypeError("Integer exceeds 64-bit range\n")) == "TypeError: Integer exceeds 64-bit range"


class Decoder:
    """Makes as many changes of a record as its value says (0: rejected or a tombstone, 2: an update)."""

    def decode_each(self, records, undecodable=None):
        n = sum(r.n for r in records)
        return SimpleNamespace(ops=[1] * n, columns=[[r.n for r in records for _ in range(r.n)]])


def test_each_change_is_traced_to_the_record_that_made_it_by_reading_the_records_again():
    a0 = [SimpleNamespace(n=1), SimpleNamespace(n=0), SimpleNamespace(n=2)]
    a1 = [SimpleNamespace(n=1)]
    b0 = [SimpleNamespace(n=1)]
    changes = StreamChanges()
    changes.extend([1] * 4, [[1, 2, 2, 1]], Origin("a", Decoder()))
    changes.extend([1], [[1]], Origin("b", Decoder()))

    units = units_of(changes, {("a", 1): a1, ("a", 0): a0, ("b", 0): b0, ("c", 0): [SimpleNamespace(n=5)]})

    # In partition order, each record with the changes it makes; the record that made none is left out.
    assert [(u.message, u.ops, u.columns) for u in units] == [
        (a0[0], [1], [[1]]),
        (a0[2], [1, 1], [[2, 2]]),
        (a1[0], [1], [[1]]),
        (b0[0], [1], [[1]]),
    ]
    assert changes.topics == ["a", "b"]


def test_changes_the_records_read_again_do_not_account_for_are_not_guessed_at():
    changes = StreamChanges()
    changes.extend([1, 1], [[1, 2]], Origin("a", Decoder()))
    assert units_of(changes, {("a", 0): [SimpleNamespace(n=1)]}) is None


def test_status_lists_the_views_not_maintained_and_what_to_do():
    since = datetime(2030, 1, 1, tzinfo=UTC)
    clicks = status.StreamStatus("clicks", "clicks", partitions=1, lag=0, held="stream clicks: SQLSTATE 42501")
    clicks.failed_views = [
        status.ViewFailure("public.by_page", "quarantined", 'SQLSTATE 42P01: relation "pages" does not exist', since),
        status.ViewFailure("public.by_day", "gap", "SQLSTATE 42P01: ...", since, missed='{"clicks": {"0": 5}} .. {}'),
    ]
    text = status.status_table("g", [clicks])
    assert "held: stream clicks: SQLSTATE 42501" in text
    assert "views not maintained" in text
    assert "public.by_page  quarantined" in text
    assert "the runner retries it" in text
    assert "replay the view" in text
    assert clicks.as_json()["failed_views"][0]["state"] == "quarantined"
