"""One stream column as decoding reads it: its converters, its value when absent, its CHECKs.

An absent field takes the column's DEFAULT, else (for the `timestamp_column`) the record's
timestamp, else NULL, and is `missing_field` on a NOT NULL column.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pipelines.cv.decoding.checks import compile_check, compile_default, enforce
from pipelines.cv.decoding.values import json_converter, text_converter, wrong_type
from pipelines.cv.model import Column, StreamDef
from pipelines.runtime.events import InvalidEvent, from_epoch_ms


class Field:
    """One column as decoding reads it: converters from JSON and from text, its absence, its CHECKs."""

    def __init__(self, index: int, column: Column, stream: StreamDef, what: str) -> None:
        where = f"{what}: column {column.name}"
        self.index, self.column, self.name, self.kind = index, column, column.name, column.kind
        self.not_null = column.not_null
        self.is_timestamp = column.name == stream.timestamp_column
        me = {column.name: (index, column)}
        self.checks = tuple(compile_check(check, me, where) for check in column.checks)
        named = [check.name for check in column.checks if check.name]
        # A value beyond the type's range breaks the column's contract as surely as its CHECK does.
        self.range_reason = named[0] if named else "out_of_range"
        self.expected, self.from_json = json_converter(column, self.range_reason)
        self.from_text = text_converter(column, self.from_json, self.range_reason)
        self.default: Callable[[], Any] | None = None
        if column.default is not None:
            self.default = compile_default(column, self.from_json, self.checks, where)

    def checked(self, value: Any) -> Any:
        """The value, once it passes the column's CHECKs."""
        for check in self.checks:
            enforce(check, (value,))
        return value

    def absent(self, record_ms: Callable[[], int], commit_ms: int | None, deleting: bool) -> Any:
        """The value of a column the event has no value for."""
        if self.is_timestamp:
            if commit_ms is not None:
                return from_epoch_ms(commit_ms, f"{self.name} is missing and the commit time source.ts_ms")
            return from_epoch_ms(record_ms(), f"{self.name} is missing and the record timestamp")
        if deleting:
            return None  # a delete's image holds the key only; the stream knows the rest
        if self.default is not None:
            return self.default()
        if self.not_null:
            raise InvalidEvent("missing_field", f"{self.name} is missing")
        return None

    def wrong_type(self, value: Any) -> InvalidEvent:
        """The rejection of a value of the wrong JSON type."""
        return wrong_type(self.name, self.expected, value)
