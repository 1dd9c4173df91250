"""What applying a batch to a stream's views can fail with, and how such a failure reads in one line.

Raised by the engine (pipelines.cv.engine) and its plans (pipelines.cv.plans); the isolation layers
(pipelines.cv.isolation, pipelines.cv.feed_isolation) tell them apart to decide what stops.
"""

from __future__ import annotations

import psycopg

from pipelines.errors import StreamviewsError


class StreamDropped(StreamviewsError):
    """The stream is no longer in the catalog: a batch read before its DROP has nowhere to go."""


class StreamRedefined(StreamviewsError):
    """The batch was decoded for other columns than the stream has now (ALTER STREAM ADD/DROP COLUMN).

    Transient: the batch is rolled back and read again once the runner decodes with the new declaration.
    """

    transient = True


class ViewApplyError(StreamviewsError):
    """One view's maintenance failed: which view, and the error (PostgreSQL's, as `__cause__`)."""

    def __init__(self, view: str, error: Exception) -> None:
        super().__init__(f"view {view}: {describe_error(error)}")
        self.view = view
        self.error = error
        self.__cause__ = error


class TransformApplyError(StreamviewsError):
    """A transform's statement failed: which transform, and PostgreSQL's error (as `__cause__`).

    Not a ViewApplyError: a transform is never quarantined. Its output is a stream others read
    exactly once, so when it cannot run whatever the events (a table gone) isolation holds its
    stream back; an event it fails on (a division by zero) is dead-lettered.
    """

    def __init__(self, transform: str, error: psycopg.Error) -> None:
        super().__init__(f"transform {transform}: {describe_error(error)}")
        self.sqlstate = error.sqlstate
        self.__cause__ = error


def describe_error(error: BaseException) -> str:
    """An error in one line: PostgreSQL's SQLSTATE and primary message, or the Python exception."""
    state = getattr(error, "sqlstate", None)
    if state:
        diag = getattr(error, "diag", None)
        message = (diag.message_primary if diag is not None else None) or str(error)
        return f"SQLSTATE {state}: {message.strip()}"
    return f"{type(error).__name__}: {str(error).strip()}"
