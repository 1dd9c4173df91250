"""What a translated aggregate call is made of: the stored values it needs and how it is read back.

Shared by pipelines.cv.frontend.aggregate_calls (PostgreSQL's aggregates) and
pipelines.cv.frontend.pipelinedb_calls (PipelineDB's), so that neither imports the other's rules.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pipelines.cv.model import AggregateKind

# A reader turns the stored values (SQL, in the call's order) and the call's result type into SQL.
Reader = Callable[[list[str], str], str]


@dataclass(frozen=True)
class Stored:
    """One value a call needs kept: an aggregate kind over an argument, under an optional filter."""

    kind: AggregateKind
    arg_sql: str | None = None
    filter_sql: str | None = None
    params: tuple[str, ...] = ()


@dataclass(frozen=True)
class Translation:
    """A call as the engine keeps it: the stored values and how to read the call from them."""

    function: str
    stored: tuple[Stored, ...]
    reader: Reader
    retractable: bool = True  # False: the stored values cannot forget a row (append-only streams)


def read_as_stored(refs: list[str], _type: str) -> str:
    """The reader of a call kept as one stored aggregate whose value is the call's."""
    return refs[0]
