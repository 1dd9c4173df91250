"""Decoding a stream's Kafka records, generated from its declaration: no hand-written code per stream.

`StreamDecoder(stream)` compiles what CREATE STREAM declares (column types, NOT NULL, DEFAULT, CHECK,
and the options `format`, `kafka_key`, `action_field`, `timestamp_column`, `unknown_fields`,
`max_event_bytes`) into two decoders that must agree record for record:

- `decode` is the reference: plain Python over the parsed JSON object (or CSV fields), in a fixed
  order (size, syntax, unknown fields, each column in declared order with its CHECKs, table CHECKs,
  the record key, the action), so every rejection has one stable reason and a detail naming the
  field and the value.
- `decode_batch` is the hot path (json): msgspec decodes each record into a Struct generated for the
  stream (strict types; CHECKs of the form `column <op> integer` become msgspec constraints), then
  whole columns are finished and checked with list comprehensions. When a step fails, only that step
  is redone record by record to find which records failed, and `decode` explains those: a bad record
  costs its own reference decoding, not its batch's speed. (csv and debezium batches are decoded by
  `decode`, record by record.)

Nothing is coerced silently. JSON types are strict (an integer column takes a JSON integer, not
`7.0`, `"7"` or `true`); a value outside its type's range is `out_of_range`, or the name of the
column's named CHECK if it has one; text cannot hold NUL; timestamps are RFC 3339 with an offset or
epoch milliseconds, as `parse_rfc3339` / `from_epoch_ms` accept them. An absent field takes the
column's DEFAULT, else (for the `timestamp_column`) the record's timestamp, else NULL, and is
`missing_field` on a NOT NULL column; a JSON null is NULL, `wrong_type` on a NOT NULL column.

Formats:

- json: one JSON object per record; fields are the columns (and the `action_field`).
- csv: one RFC 4180 record (comma, double quotes, UTF-8, an optional final line break), fields in
  column order, every record an insert. An empty unquoted field has no value (as an absent JSON
  field: DEFAULT, record timestamp, NULL); a quoted empty field is the empty string. Values are
  read from text as strictly as from JSON: integers `-?(0|[1-9][0-9]*)`, numbers in JSON's grammar,
  `true`/`false`, jsonb as JSON text.
- debezium: a change event of the JSON converter without schemas (`{"before", "after", "op",
  "source": {"ts_ms"}}`); `c`, `r` and `u` insert the `after` row, `d` deletes the `before` row, a
  null value (tombstone) carries nothing. A delete's row image holds only the table's primary key:
  there, a NOT NULL column may be absent or null (NULL), and the `timestamp_column` takes the commit
  time `source.ts_ms` (also for an insert without it) before the record timestamp.

Expressions (CHECK, DEFAULT) are compiled from the SQL PostgreSQL deparsed, with SQL semantics:
three-valued logic (a CHECK passes unless it is false), integer division truncating toward zero,
overflow and division by zero as errors. Ordering comparisons of text are refused: their result
depends on the database's collation. now() / current_timestamp are the decoding time, and
current_date the UTC date.
"""

from __future__ import annotations

import operator
import re
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import MAX_EMAX, MAX_PREC, MIN_EMIN, Context, Decimal, DecimalException
from itertools import compress
from operator import attrgetter
from typing import Annotated, Any, Literal, Protocol
from uuid import UUID

import msgspec
import pglast
from pglast import ast
from pglast.enums import A_Expr_Kind, BoolExprType, NullTestType, SQLValueFunctionOp
from pglast.stream import RawStream
from psycopg.types.json import Jsonb

from pipelines.cv.definitions import Check, Column, DefinitionError, StreamDef, resolve_type
from pipelines.runtime.events import (
    DELETE,
    DETAIL_LIMIT,
    INSERT,
    InvalidEvent,
    check_text,
    from_epoch_ms,
    json_text,
    parse_rfc3339,
)

INT_RANGES = {"smallint": (-(2**15), 2**15 - 1), "integer": (-(2**31), 2**31 - 1), "bigint": (-(2**63), 2**63 - 1)}
# PostgreSQL's limits of an unconstrained numeric: digits before and after the decimal point.
NUMERIC_WHOLE_DIGITS, NUMERIC_FRACTION_DIGITS = 131_072, 16_383
DEBEZIUM_OPS = {"c": INSERT, "r": INSERT, "u": INSERT, "d": DELETE}

_ABSENT = object()  # a field the event does not have (a JSON null is None)
_UNSET = msgspec.UNSET
# Generic JSON, numbers exact: a fraction or exponent is a Decimal of its text, an integer an int.
_ANY_JSON = msgspec.json.Decoder(float_hook=Decimal)
_EXACT = Context(prec=MAX_PREC, Emax=MAX_EMAX, Emin=MIN_EMIN)  # numeric + - * never rounds
_FLOAT32 = struct.Struct("f")
_INFINITY = float("inf")
_INTEGER = re.compile(r"-?(?:0|[1-9][0-9]*)")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_CSV_FIELD = re.compile(r'"((?:[^"]|"")*)"|([^,"\r\n]*)')


class RecordLike(Protocol):
    """A Kafka record as decode_batch reads it (`confluent_kafka.Message` is one)."""

    def key(self) -> bytes | None:
        """The record key."""
        ...

    def value(self) -> bytes | None:
        """The record value."""
        ...

    def timestamp(self) -> tuple[int, int]:
        """(timestamp type, epoch milliseconds); the milliseconds are -1 when the record has none."""
        ...


@dataclass
class DecodedBatch:
    """What decode_batch made of a list of records.

    Attributes:
        ops: INSERT or DELETE for each accepted record, in input order.
        columns: One list per output column, parallel to `ops`.
        rejected: (index into the records, why) for each rejected record, in input order.
        skipped: Records that carry nothing to apply (Debezium tombstones).
    """

    ops: list[int]
    columns: list[list[Any]]
    rejected: list[tuple[int, InvalidEvent]] = field(default_factory=list)
    skipped: int = 0


class _Fallback(Exception):
    """The fast path cannot vouch for a value: the reference decodes its record (and says why)."""


class _EvalError(Exception):
    """Evaluating a CHECK failed the way PostgreSQL's would (overflow, division by zero)."""


class StreamDecoder:
    """Decodes the records of one stream into (op, values), as its declaration says.

    Args:
        stream: The stream's definition.
        output: The columns whose values the caller needs, in that order (default: all, in declared
            order). The others are still decoded and checked.

    Raises:
        DefinitionError: A CHECK or DEFAULT cannot be evaluated, or `output` names an unknown column.
    """

    def __init__(self, stream: StreamDef, output: Sequence[str] | None = None) -> None:
        self.stream = stream
        what = f"CREATE STREAM {stream.name}"
        names = stream.column_names
        self.output: tuple[str, ...] = tuple(names if output is None else output)
        unknown = [n for n in self.output if n not in names]
        if unknown or len(set(self.output)) != len(self.output):
            raise DefinitionError(
                f"{what}: output {list(self.output)} must name distinct columns of {', '.join(names)}"
            )
        self._out = tuple(names.index(n) for n in self.output)
        self._limit = stream.max_event_bytes
        self._fields = tuple(_Field(i, c, stream, what) for i, c in enumerate(stream.columns))
        columns = {c.name: (i, c) for i, c in enumerate(stream.columns)}
        self._table_checks = tuple(_compile_check(c, columns, what) for c in stream.checks)
        self._allowed = frozenset(names) | ({stream.action_field} if stream.action_field else set())
        self._reject_unknown = stream.unknown_fields == "reject"
        self._key_index = names.index(stream.kafka_key) if stream.kafka_key else None
        self._actions = {a: INSERT for a in stream.insert_actions} | {a: DELETE for a in stream.delete_actions}
        self._fast = _FastJson.of(self) if stream.format == "json" else None

    # --- the reference ---------------------------------------------------------------------------

    def decode(self, key: bytes | None, value: bytes | None, timestamp_ms: int) -> tuple[int, tuple] | None:
        """Decode one record: (INSERT or DELETE, the output columns' values), or None for a tombstone.

        Args:
            key: The record key (compared with the `kafka_key` column when the stream has one).
            value: The record value.
            timestamp_ms: The record's timestamp (-1 when it has none), taken by the
                `timestamp_column` when the event has no value for it.

        Raises:
            InvalidEvent: The record breaks the stream's declaration; `reason` says how.
        """
        return self._decode(key, value, lambda: timestamp_ms)

    def _decode(self, key: bytes | None, value: bytes | None, record_ms: Callable[[], int]) -> tuple[int, tuple] | None:
        stream = self.stream
        if value is None:
            if stream.format == "debezium":
                return None  # a tombstone: log compaction's marker, nothing to apply
            raise InvalidEvent("empty", "value is null (a tombstone?)")
        if not value:
            raise InvalidEvent("empty", "value is empty")
        if len(value) > self._limit:
            # Before parsing: the limit also bounds the work a hostile record can cause.
            raise InvalidEvent("oversized", f"value is {len(value)} bytes, over the {self._limit}-byte limit")
        if stream.format == "csv":
            row = self._csv_row(value, record_ms)
            self._check_key(key, row)
            return INSERT, tuple(row[i] for i in self._out)
        event = _load_object(value)
        if stream.format == "debezium":
            return self._debezium(event, record_ms)
        row = self._row(event, record_ms)
        self._check_key(key, row)
        return self._op(event), tuple(row[i] for i in self._out)

    def _row(
        self, event: dict[str, Any], record_ms: Callable[[], int], commit_ms: int | None = None, deleting: bool = False
    ) -> list[Any]:
        """The row of a JSON object (an event, or a Debezium row image), every CHECK enforced."""
        if self._reject_unknown and not self._allowed.issuperset(event):
            unknown = ", ".join(sorted(map(repr, event.keys() - self._allowed)))
            allowed = ", ".join(sorted(self._allowed))
            raise InvalidEvent("unknown_field", f"unknown field {unknown}; {self.stream.name} has {allowed}")
        row = []
        for f in self._fields:
            raw = event.get(f.name, _ABSENT)
            if raw is _ABSENT or (deleting and raw is None):
                value = f.absent(record_ms, commit_ms, deleting)
            elif raw is None:
                if f.not_null:
                    raise f.wrong_type(None)
                value = None
            else:
                value = f.from_json(raw)
            for check in f.checks:
                _enforce(check, (value,))
            row.append(value)
        for check in self._table_checks:
            _enforce(check, tuple(row[i] for i in check.columns))
        return row

    def _csv_row(self, value: bytes, record_ms: Callable[[], int]) -> list[Any]:
        try:
            text = value.decode()
        except UnicodeDecodeError as e:
            raise InvalidEvent("malformed_csv", f"value is not UTF-8: {e}") from None
        fields = _split_csv(text.removesuffix("\n").removesuffix("\r") if text.endswith("\n") else text)
        if len(fields) != len(self._fields) and not (len(fields) > len(self._fields) and not self._reject_unknown):
            names = ", ".join(f.name for f in self._fields)
            raise InvalidEvent(
                "malformed_csv", f"{len(fields)} fields; {self.stream.name} has {len(self._fields)} ({names})"
            )
        row = []
        for f, text_value in zip(self._fields, fields, strict=False):
            value = f.absent(record_ms, None, False) if text_value is None else f.from_text(text_value)
            for check in f.checks:
                _enforce(check, (value,))
            row.append(value)
        for check in self._table_checks:
            _enforce(check, tuple(row[i] for i in check.columns))
        return row

    def _debezium(self, event: dict[str, Any], record_ms: Callable[[], int]) -> tuple[int, tuple]:
        op = DEBEZIUM_OPS.get(event.get("op")) if type(event.get("op")) is str else None
        if op is None:
            raise InvalidEvent("unknown_action", f"change op {event.get('op')!r} cannot be applied row by row")
        image = "before" if op == DELETE else "after"
        row_image = event.get(image)
        if type(row_image) is not dict:
            raise InvalidEvent("missing_field", f"op {event['op']!r} needs the {image} row, got {_shown(row_image)}")
        source = event.get("source")
        committed = source.get("ts_ms") if type(source) is dict else None
        commit_ms = committed if type(committed) is int else None
        row = self._row(row_image, record_ms, commit_ms, deleting=op == DELETE)
        return op, tuple(row[i] for i in self._out)

    def _check_key(self, key: bytes | None, row: list[Any]) -> None:
        # A wrong key means the event may sit on another partition than the rest of its row's events,
        # so its order relative to them is lost: reject rather than apply it out of order.
        if self._key_index is None:
            return
        text = str(row[self._key_index])  # the value as text: 42, a0eebc99-9c0b-..., été
        if key != text.encode():
            name = self.stream.kafka_key
            if key is None:
                raise InvalidEvent("key_mismatch", f"key is missing, must be the {name} as text: {text}")
            raise InvalidEvent("key_mismatch", f"key {key!r} does not match {name} {text}")

    def _op(self, event: dict[str, Any]) -> int:
        name = self.stream.action_field
        if name is None or name not in event:
            return INSERT
        action = event[name]
        if type(action) is not str:
            raise InvalidEvent("wrong_type", f"{name} must be a JSON string, got {_shown(action)}")
        op = self._actions.get(action)
        if op is None:
            expected = " or ".join(map(repr, self._actions))
            raise InvalidEvent("unknown_action", f"{name} must be {expected}, got {action!r}")
        return op

    # --- batches ---------------------------------------------------------------------------------

    def decode_batch(self, records: Sequence[RecordLike]) -> DecodedBatch:
        """Decode many records at once: exactly what `decode` gives record by record, faster.

        Returns:
            The accepted records' ops and output columns, the rejected ones with their reasons, and
            the number of records that carried nothing.
        """
        batch = DecodedBatch([], [[] for _ in self._out])
        if self._fast is None:
            retry: Sequence[int] = range(len(records))
        else:
            batch.ops, batch.columns, retry = self._fast.decode(records)
            if not retry:
                return batch
        late = []  # records the fast path could not vouch for, yet the reference accepts
        wants_key = self._key_index is not None
        for i in retry:
            record = records[i]
            try:
                decoded = self._decode(
                    record.key() if wants_key else None, record.value(), lambda r=record: r.timestamp()[1]
                )
            except InvalidEvent as e:
                # Kept without its traceback: thousands of them would otherwise hold their frames
                # alive, and the garbage collector would walk them all again and again.
                e.__traceback__ = e.__context__ = e.__cause__ = None
                batch.rejected.append((i, e))
                continue
            if decoded is None:
                batch.skipped += 1
            else:
                late.append((i, *decoded))
        if late and self._fast is not None and batch.ops:
            # Put them in input order among the fast path's (rare: a JSON key given twice, say).
            retried = {i for i, _ in batch.rejected} | {i for i, *_ in late}
            fast = [i for i in range(len(records)) if i not in retried]
            rows = zip(*batch.columns, strict=True) if batch.columns else [()] * len(fast)
            late += zip(fast, batch.ops, rows, strict=True)
            late.sort(key=operator.itemgetter(0))
            batch.ops, batch.columns = [], [[] for _ in self._out]
        for _, op, values in late:
            batch.ops.append(op)
            for into, value in zip(batch.columns, values, strict=True):
                into.append(value)
        return batch


# --- columns ---------------------------------------------------------------------------------------


class _Field:
    """One column as decoding reads it: converters from JSON and from text, its absence, its CHECKs."""

    def __init__(self, index: int, column: Column, stream: StreamDef, what: str) -> None:
        where = f"{what}: column {column.name}"
        self.index, self.column, self.name, self.kind = index, column, column.name, column.kind
        self.not_null = column.not_null
        self.is_timestamp = column.name == stream.timestamp_column
        me = {column.name: (index, column)}
        self.checks = tuple(_compile_check(check, me, where) for check in column.checks)
        named = [check.name for check in column.checks if check.name]
        # A value beyond the type's range breaks the column's contract as surely as its CHECK does.
        self.range_reason = named[0] if named else "out_of_range"
        self.expected, self.from_json = _json_converter(column, self.range_reason)
        self.from_text = _text_converter(column, self.from_json, self.range_reason)
        self.default: Callable[[], Any] | None = None
        if column.default is not None:
            self.default = _compile_default(column, self, where)

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
        return InvalidEvent("wrong_type", f"{self.name} must be {self.expected}, got {_shown(value)}")


def _wrong_type(name: str, expected: str, value: Any) -> InvalidEvent:
    return InvalidEvent("wrong_type", f"{name} must be {expected}, got {_shown(value)}")


def _json_converter(column: Column, range_reason: str) -> tuple[str, Callable[[Any], Any]]:
    """What a JSON value of the column must be, and the function turning it into the column's value.

    The function takes a present, non-null value as the generic decoder returns it (an integer as
    int, any other number as Decimal) and raises InvalidEvent.
    """
    name, kind, typmods = column.name, column.kind, column.typmods

    def out_of_range(value: Any, what: str) -> InvalidEvent:
        return InvalidEvent(range_reason, f"{name} {_shown(value)} is out of range for {what}")

    if kind in INT_RANGES:
        low, high = INT_RANGES[kind]

        def integer(value: Any) -> int:
            if type(value) is not int:
                raise _wrong_type(name, "a JSON integer", value)
            if not low <= value <= high:
                raise out_of_range(value, f"{kind} ({low} .. {high})")
            return value

        return "a JSON integer", integer
    if kind == "numeric":
        fits = _numeric_fit(typmods)

        def numeric(value: Any) -> Decimal:
            if type(value) is int:
                value = Decimal(value)
            elif type(value) is not Decimal:
                raise _wrong_type(name, "a JSON number", value)
            if value.is_zero() and value.is_signed():
                value = value.copy_abs()  # PostgreSQL has no negative zero numeric
            if not fits(value):
                raise out_of_range(value, column.type)
            return value

        return "a JSON number", numeric
    if kind in ("double", "real"):
        single = kind == "real"

        def number(value: Any) -> float:
            if type(value) is not int and type(value) is not Decimal:
                raise _wrong_type(name, "a JSON number", value)
            try:
                result = _single(float(value)) if single else float(value)
            except OverflowError:
                raise out_of_range(value, column.type) from None
            if result in (float("inf"), float("-inf")):
                raise out_of_range(value, column.type)
            return result

        return "a JSON number", number
    if kind == "boolean":

        def boolean(value: Any) -> bool:
            if type(value) is not bool:
                raise _wrong_type(name, "true or false", value)
            return value

        return "true or false", boolean
    if kind in ("text", "varchar"):
        limit = typmods[0] if typmods else None

        def text(value: Any) -> str:
            if type(value) is not str:
                raise _wrong_type(name, "a JSON string", value)
            check_text(name, value)
            if limit is not None and len(value) > limit:
                raise InvalidEvent("too_long", f"{name} is {len(value)} characters, over {column.type}")
            return value

        return "a JSON string", text
    if kind == "timestamptz":
        expected = "an RFC 3339 string or epoch milliseconds"

        def timestamp(value: Any) -> datetime:
            if type(value) is str:
                return _rfc3339(name, value)
            if type(value) is int:
                return from_epoch_ms(value, name)
            raise _wrong_type(name, expected, value)

        return expected, timestamp
    if kind == "date":

        def day(value: Any) -> date:
            if type(value) is not str:
                raise _wrong_type(name, "a JSON string (YYYY-MM-DD)", value)
            try:
                if _DATE.fullmatch(value):
                    return date.fromisoformat(value)
            except ValueError:
                pass
            raise InvalidEvent("bad_date", f"{name} {_shown(value)} is not a date (YYYY-MM-DD)")

        return "a JSON string (YYYY-MM-DD)", day
    if kind == "uuid":

        def uuid(value: Any) -> UUID:
            if type(value) is not str:
                raise _wrong_type(name, "a JSON string", value)
            if not _UUID.fullmatch(value):
                raise InvalidEvent("bad_uuid", f"{name} {_shown(value)} is not a UUID (8-4-4-4-12 hex digits)")
            return UUID(value)

        return "a JSON string (a UUID)", uuid
    assert kind == "jsonb", kind

    def jsonb(value: Any) -> Jsonb:
        return Jsonb(_plain_json(name, value, range_reason))

    return "a JSON value other than null", jsonb


def _single(value: float) -> float:
    """A double as PostgreSQL stores it in a real: rounded, and neither overflowing nor lost to zero."""
    rounded = _FLOAT32.unpack(_FLOAT32.pack(value))[0]
    if (rounded == 0.0 and value != 0.0) or abs(rounded) == _INFINITY:
        raise OverflowError  # PostgreSQL's cast from double rejects an underflow too
    return rounded


def _plain_json(name: str, value: Any, range_reason: str) -> Any:
    """A jsonb value as psycopg dumps it: numbers as float (finite), no NUL in strings or keys."""
    kind = type(value)
    if kind is str:
        check_text(name, value)
    elif kind is Decimal:
        result = float(value)
        if result in (float("inf"), float("-inf")):
            raise InvalidEvent(range_reason, f"{name} holds {value}, out of range for a JSON number")
        return result
    elif kind is list:
        return [_plain_json(name, item, range_reason) for item in value]
    elif kind is dict:
        for item in value:
            check_text(name, item)
        return {k: _plain_json(name, v, range_reason) for k, v in value.items()}
    return value


def _numeric_fit(typmods: tuple[int, ...]) -> Callable[[Decimal], bool]:
    precision, scale = (*typmods, 0)[:2] if typmods else (None, None)

    def fits(value: Decimal) -> bool:
        if value.is_zero():
            return True
        try:
            _, digits, exponent = value.normalize(_EXACT).as_tuple()
        except DecimalException:
            return False
        whole, fraction = max(0, len(digits) + exponent), max(0, -exponent)
        if precision is None:
            return whole <= NUMERIC_WHOLE_DIGITS and fraction <= NUMERIC_FRACTION_DIGITS
        # No rounding to the scale: a value with more decimals than the column keeps is not its value.
        return fraction <= scale and whole <= precision - scale

    return fits


def _text_converter(column: Column, from_json: Callable[[Any], Any], range_reason: str) -> Callable[[str], Any]:
    """The function reading a column's value from text (a CSV field, a constant), as strictly as JSON."""
    name, kind = column.name, column.kind

    def integer(text: str) -> int:
        try:
            return int(text)
        except ValueError:  # more digits than int() converts: far beyond any column's range
            raise InvalidEvent(range_reason, f"{name} has {len(text)} digits, out of range") from None

    def read(text: str) -> Any:
        if kind in INT_RANGES:
            if not _INTEGER.fullmatch(text):
                raise InvalidEvent("wrong_type", f"{name} must be an integer, got {text[:DETAIL_LIMIT]!r}")
            return from_json(integer(text))
        if kind in ("numeric", "double", "real"):
            if not _NUMBER.fullmatch(text):
                raise InvalidEvent("wrong_type", f"{name} must be a number, got {text[:DETAIL_LIMIT]!r}")
            return from_json(integer(text) if _INTEGER.fullmatch(text) else Decimal(text))
        if kind == "boolean":
            if text not in ("true", "false"):
                raise InvalidEvent("wrong_type", f"{name} must be true or false, got {text[:DETAIL_LIMIT]!r}")
            return text == "true"
        if kind == "timestamptz":
            return from_json(integer(text) if _INTEGER.fullmatch(text) else text)
        if kind == "jsonb":
            try:
                value = _ANY_JSON.decode(text.encode())
            except (msgspec.DecodeError, msgspec.ValidationError) as e:
                raise InvalidEvent("wrong_type", f"{name} must be JSON text: {e}") from None
            if value is None:
                raise InvalidEvent("wrong_type", f"{name} must be {column.type} other than null, got null")
            return from_json(value)
        return from_json(text)

    return read


def _rfc3339(name: str, text: str) -> datetime:
    try:
        return parse_rfc3339(text)
    except InvalidEvent as e:
        if name == "ts" or not e.detail.startswith("ts "):
            raise
        raise InvalidEvent(e.reason, name + e.detail[2:]) from None  # name the column, not "ts"


def _load_object(value: bytes) -> dict[str, Any]:
    # Not runtime.events.load_object: orjson reads integers beyond 64 bits as errors and numbers as
    # floats, where a stream needs them exact (numeric columns, out-of-range ids named as such).
    try:
        event = _ANY_JSON.decode(value)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as e:
        raise InvalidEvent("malformed_json", f"value is not JSON: {e}") from None
    if type(event) is not dict:
        raise InvalidEvent("malformed_json", f"value must be a JSON object, got {_shown(event)}")
    return event


def _split_csv(text: str) -> list[str | None]:
    """The fields of one CSV record: None for an empty unquoted field, the text for any other."""
    fields: list[str | None] = []
    position, end = 0, len(text)
    while True:
        match = _CSV_FIELD.match(text, position)
        assert match is not None  # the second alternative matches the empty string
        quoted, plain = match.groups()
        fields.append(quoted.replace('""', '"') if quoted is not None else plain or None)
        position = match.end()
        if position == end:
            return fields
        if text[position] != ",":
            raise InvalidEvent(
                "malformed_csv",
                f"unexpected {text[position]!r} at character {position}: a field holding a comma, quote or line "
                "break must be quoted, a quote inside doubled",
            )
        position += 1


def _shown(value: Any) -> str:
    """The offending value as the producer wrote it (`true`, `"42"`, `4.2`), bounded."""
    if type(value) is Decimal or type(value) is int:
        return str(value)[:DETAIL_LIMIT]
    try:
        return json_text(value)
    except TypeError:  # a Decimal or a big integer inside: msgspec writes them
        return msgspec.json.encode(value).decode()[:DETAIL_LIMIT]


def _sql_value(value: Any) -> str:
    if value is None:
        return "NULL"
    if type(value) is bool:
        return "true" if value else "false"
    if isinstance(value, int | float | Decimal):
        return str(value)
    if isinstance(value, Jsonb):
        return _shown(value.obj)
    if isinstance(value, datetime | date):
        return f"'{value.isoformat()}'"
    return "'" + str(value)[:DETAIL_LIMIT].replace("'", "''") + "'"


# --- CHECK and DEFAULT expressions -------------------------------------------------------------------


@dataclass(frozen=True)
class _Check:
    """A compiled CHECK: `test(*values of columns)` is True, False or None (NULL: the check passes).

    Attributes:
        bounds: (lowest, highest) allowed value when the check is `column <op> integer` on an integer
            column (or an AND / BETWEEN of such): exactly a msgspec constraint on that column.
    """

    reason: str
    sql: str
    names: tuple[str, ...]
    columns: tuple[int, ...]
    test: Callable[..., bool | None]
    bounds: tuple[int | None, int | None] | None = None


def _enforce(check: _Check, values: tuple) -> None:
    try:
        passed = check.test(*values)
    except _EvalError as e:
        shown = ", ".join(f"{n} = {_sql_value(v)}" for n, v in zip(check.names, values, strict=True))
        raise InvalidEvent(check.reason, f"{shown}: CHECK ({check.sql}) fails: {e}") from None
    if passed is False:
        shown = ", ".join(f"{n} = {_sql_value(v)}" for n, v in zip(check.names, values, strict=True))
        raise InvalidEvent(check.reason, f"{shown} violates CHECK ({check.sql})")


_NOT_CONSTANT = object()
_NUMBER_KINDS = ("int", "numeric", "float")
_EXPR_KINDS = {
    "smallint": ("int", 2),
    "integer": ("int", 4),
    "bigint": ("int", 8),
    "numeric": ("numeric", 0),
    "double": ("float", 0),
    "real": ("float", 4),  # compared as double precision, as PostgreSQL does; no arithmetic
    "boolean": ("bool", 0),
    "text": ("text", 0),
    "varchar": ("text", 0),
}
_WIDTH_RANGES = {2: INT_RANGES["smallint"], 4: INT_RANGES["integer"], 8: INT_RANGES["bigint"]}
_COMPARISONS: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq,
    "<>": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
_MIRRORED = {"=": "=", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_FUNCTIONS = {"length": len, "char_length": len, "character_length": len, "lower": str.lower, "upper": str.upper}
SUPPORTED_EXPRESSIONS = (
    "column references, constants, casts of constants, = <> < <= > >=, AND, OR, NOT, IS [NOT] NULL, IN (...), "
    "BETWEEN, + - * / %, length(), char_length(), lower(), upper()"
)


@dataclass(frozen=True)
class _Expr:
    """A compiled expression: its type and `fn(values)`, values being those of the referenced columns.

    `kind` is int, numeric, float, bool, text, timestamptz, date, uuid, jsonb, unknown (a string
    literal, typed by what it meets) or null (the NULL literal).
    """

    kind: str
    fn: Callable[[tuple], Any]
    width: int = 0  # int: 2, 4 or 8 bytes; float: 4 for a real column
    constant: Any = _NOT_CONSTANT
    column: int | None = None  # the position of a plain column reference
    bounds: tuple[int, int | None, int | None] | None = None  # (column position, lowest, highest)

    @property
    def is_constant(self) -> bool:
        """True for a constant (folded at compile time)."""
        return self.constant is not _NOT_CONSTANT


def _constant(kind: str, value: Any, width: int = 0) -> _Expr:
    return _Expr(kind, lambda values: value, width, value)


class _Compiler:
    """Compiles one CHECK or DEFAULT expression of a stream into Python closures."""

    def __init__(self, columns: dict[str, tuple[int, Column]], what: str, sql: str) -> None:
        self.columns, self.what, self.sql = columns, what, sql
        self.refs: list[str] = []

    def fail(self, message: str) -> DefinitionError:
        """The error for an expression that cannot be compiled."""
        return DefinitionError(f"{self.what}: {self.sql}: {message}")

    def compile(self, node: ast.Node) -> _Expr:
        """Compile a pglast expression node."""
        if isinstance(node, ast.ColumnRef):
            return self.column(node)
        if isinstance(node, ast.A_Const):
            return self.literal(node)
        if isinstance(node, ast.TypeCast):
            return self.cast(node)
        if isinstance(node, ast.A_Expr):
            operands = node.rexpr if isinstance(node.rexpr, tuple) else None
            if node.kind == A_Expr_Kind.AEXPR_OP:
                return self.operator(node)
            if node.kind == A_Expr_Kind.AEXPR_IN and operands:
                negated = node.name[-1].sval == "<>"
                tests = [self.compare("<>" if negated else "=", node.lexpr, item) for item in operands]
                return self.logic(BoolExprType.AND_EXPR if negated else BoolExprType.OR_EXPR, tests)
            if node.kind in (A_Expr_Kind.AEXPR_BETWEEN, A_Expr_Kind.AEXPR_NOT_BETWEEN) and operands:
                if node.kind == A_Expr_Kind.AEXPR_BETWEEN:
                    tests = [self.compare(">=", node.lexpr, operands[0]), self.compare("<=", node.lexpr, operands[1])]
                    return self.logic(BoolExprType.AND_EXPR, tests)
                tests = [self.compare("<", node.lexpr, operands[0]), self.compare(">", node.lexpr, operands[1])]
                return self.logic(BoolExprType.OR_EXPR, tests)
        if isinstance(node, ast.BoolExpr):
            return self.logic(node.boolop, [self.compile(arg) for arg in node.args])
        if isinstance(node, ast.NullTest) and not node.argisrow:
            arg = self.compile(node.arg)
            fn, is_null = arg.fn, node.nulltesttype == NullTestType.IS_NULL
            return self.fold(
                _Expr("bool", (lambda v: fn(v) is None) if is_null else (lambda v: fn(v) is not None)), arg
            )
        if isinstance(node, ast.FuncCall):
            return self.function(node)
        raise self.fail(f"{RawStream()(node)} is not supported; supported: {SUPPORTED_EXPRESSIONS}")

    def column(self, node: ast.ColumnRef) -> _Expr:
        """A column reference: its value, typed as the column."""
        name = ".".join(f.sval if isinstance(f, ast.String) else "*" for f in node.fields)
        if name not in self.columns:
            raise self.fail(f"{name} is not a column it may use ({', '.join(self.columns) or 'none'})")
        if name not in self.refs:
            self.refs.append(name)
        column = self.columns[name][1]
        kind, width = _EXPR_KINDS.get(column.kind, (column.kind, 0))
        return _Expr(kind, operator.itemgetter(self.refs.index(name)), width, column=self.refs.index(name))

    def literal(self, node: ast.A_Const) -> _Expr:
        """A literal: integers as PostgreSQL types them (int4, int8, else numeric), strings untyped."""
        if node.isnull:
            return _constant("null", None)
        value = node.val
        if isinstance(value, ast.Integer):
            return _constant("int", value.ival, 4)
        if isinstance(value, ast.Float):
            if _INTEGER.fullmatch(value.fval) and INT_RANGES["bigint"][0] <= int(value.fval) <= INT_RANGES["bigint"][1]:
                return _constant("int", int(value.fval), 8)
            return _constant("numeric", Decimal(value.fval))
        if isinstance(value, ast.Boolean):
            return _constant("bool", value.boolval)
        if isinstance(value, ast.String):
            return _constant("unknown", value.sval)
        raise self.fail(f"{RawStream()(node)} is not a supported constant")

    def cast(self, node: ast.TypeCast) -> _Expr:
        """A cast of a constant: the constant read as the type's text, as strictly as an event's."""
        arg = self.compile(node.arg)
        kind, typmods = resolve_type(node.typeName, f"{self.what}: {self.sql}")
        if arg.is_constant:
            return self.typed(arg, Column("constant", RawStream()(node.typeName), kind, typmods=typmods))
        # A value can be cast where nothing is lost: an integer to a wider type, numeric to double.
        target, width = _EXPR_KINDS.get(kind, (kind, 0))
        widening = (arg.kind, target) in (("int", "numeric"), ("int", "float"), ("numeric", "float"))
        if typmods or not (widening or (arg.kind == target == "int" and width >= arg.width)):
            raise self.fail(f"{RawStream()(node)}: only constants, or numbers to a wider type, can be cast")
        if target == "float":
            return _as_float(arg)
        f = arg.fn
        return _Expr(
            target, (lambda v: None if (x := f(v)) is None else Decimal(x)) if target == "numeric" else f, width
        )

    def typed(self, arg: _Expr, column: Column) -> _Expr:
        """A constant as a value of a column type (an untyped literal takes the type)."""
        kind, width = _EXPR_KINDS.get(column.kind, (column.kind, 0))
        if arg.constant is None:
            return _constant(kind, None, width)
        value = _constant_text(arg.constant)
        try:
            converted = _text_converter(column, _json_converter(column, "out_of_range")[1], "out_of_range")(value)
        except InvalidEvent as e:
            raise self.fail(f"{value!r} is not a {column.type}: {e.detail}") from None
        return _constant(kind, converted, width)

    def operator(self, node: ast.A_Expr) -> _Expr:
        """A comparison, arithmetic, or a unary sign."""
        name = node.name[-1].sval
        if node.lexpr is None and name in ("-", "+"):
            arg = self.compile(node.rexpr)
            if arg.kind == "unknown":
                raise self.fail(f"{RawStream()(node)}: a sign needs a number")
            return self.arithmetic(name, _constant("int", 0, 2), arg) if name == "-" else self.number(arg)
        if name in _COMPARISONS and node.lexpr is not None:
            return self.compare(name, node.lexpr, node.rexpr)
        if name in ("+", "-", "*", "/", "%") and node.lexpr is not None:
            return self.arithmetic(name, self.compile(node.lexpr), self.compile(node.rexpr))
        raise self.fail(f"operator {name} is not supported; supported: {SUPPORTED_EXPRESSIONS}")

    def number(self, arg: _Expr) -> _Expr:
        """An operand that must be a number."""
        if arg.kind not in _NUMBER_KINDS and arg.kind != "null":
            raise self.fail(f"expected a number, got {arg.kind}")
        return arg

    def coerce(self, left: _Expr, right: _Expr) -> tuple[_Expr, _Expr]:
        """Both operands in one type, as PostgreSQL resolves them (an untyped literal takes the other's)."""
        if left.kind == "unknown" and right.kind not in ("unknown", "null"):
            left = self.typed(left, _column_of(right))
        elif right.kind == "unknown" and left.kind not in ("unknown", "null"):
            right = self.typed(right, _column_of(left))
        if "null" in (left.kind, right.kind):
            return left, right
        if left.kind == right.kind or {left.kind, right.kind} == {"unknown", "text"}:
            return left, right
        if left.kind in _NUMBER_KINDS and right.kind in _NUMBER_KINDS:
            if "float" in (left.kind, right.kind):
                return _as_float(left), _as_float(right)
            return left, right  # int and numeric: Python compares and adds int and Decimal exactly
        raise self.fail(f"cannot compare or combine {left.kind} with {right.kind}")

    def compare(self, name: str, left_node: ast.Node | _Expr, right_node: ast.Node | _Expr) -> _Expr:
        """A comparison, NULL when either side is."""
        left = left_node if isinstance(left_node, _Expr) else self.compile(left_node)
        right = right_node if isinstance(right_node, _Expr) else self.compile(right_node)
        left, right = self.coerce(left, right)
        if "null" in (left.kind, right.kind):
            return _constant("bool", None)
        if left.kind == "jsonb":
            raise self.fail("jsonb values can only be tested with IS [NOT] NULL")
        if left.kind in ("text", "unknown") and name not in ("=", "<>"):
            raise self.fail(f"text {name} text depends on the database's collation; use = <> IN or length()")
        compare, f, g = _COMPARISONS[name], left.fn, right.fn
        if right.is_constant:
            c = right.constant
            fn = lambda v: None if (x := f(v)) is None else compare(x, c)  # noqa: E731
        else:
            fn = lambda v: None if (x := f(v)) is None or (y := g(v)) is None else compare(x, y)  # noqa: E731
        result = self.fold(_Expr("bool", fn), left, right)
        bounds = _bounds(name, left, right) or _bounds(_MIRRORED[name], right, left)
        return result if bounds is None or result.is_constant else _Expr("bool", fn, bounds=bounds)

    def arithmetic(self, name: str, left: _Expr, right: _Expr) -> _Expr:
        """+ - * / % with PostgreSQL's results: integer division truncates, overflow is an error."""
        left, right = self.coerce(self.number(left), self.number(right))
        if "null" in (left.kind, right.kind):
            return _constant(left.kind if right.kind == "null" else right.kind, None)
        if 4 in (left.width, right.width) and left.kind == right.kind == "float":
            raise self.fail("arithmetic on real values is not supported; compare them instead")
        kind = left.kind if left.kind == right.kind else "numeric"
        if kind == "int":
            width = max(left.width, right.width)
            op = _integer_operation(name, *_WIDTH_RANGES[width])
        elif kind == "numeric":
            if name not in ("+", "-", "*"):
                raise self.fail(f"numeric {name} is not supported (its result scale is PostgreSQL's to choose)")
            width, op = 0, {"+": _EXACT.add, "-": _EXACT.subtract, "*": _EXACT.multiply}[name]
        else:
            if name == "%":
                raise self.fail("% of double precision values does not exist in PostgreSQL")
            width, op = 0, _float_operation(name)
        f, g = left.fn, right.fn
        fn = lambda v: None if (x := f(v)) is None or (y := g(v)) is None else op(x, y)  # noqa: E731
        return self.fold(_Expr(kind, fn, width), left, right)

    def logic(self, boolop: BoolExprType, args: list[_Expr]) -> _Expr:
        """AND, OR, NOT in three-valued logic, evaluated left to right."""
        for arg in args:
            if arg.kind not in ("bool", "null"):
                raise self.fail(f"AND, OR and NOT take conditions, not {arg.kind}")
        fns = [a.fn for a in args]
        if boolop == BoolExprType.NOT_EXPR:
            f = fns[0]
            return self.fold(_Expr("bool", lambda v: None if (x := f(v)) is None else not x), *args)
        stop = boolop == BoolExprType.OR_EXPR  # the value that decides: True for OR, False for AND

        def combine(values: tuple) -> bool | None:
            result: bool | None = not stop
            for f in fns:
                x = f(values)
                if x is stop:
                    return stop
                if x is None:
                    result = None
            return result

        folded = self.fold(_Expr("bool", combine), *args)
        bounds = None
        if boolop == BoolExprType.AND_EXPR and all(a.bounds for a in args):
            positions = {a.bounds[0] for a in args}  # type: ignore[index]
            if len(positions) == 1:
                lows = [a.bounds[1] for a in args if a.bounds[1] is not None]  # type: ignore[index]
                highs = [a.bounds[2] for a in args if a.bounds[2] is not None]  # type: ignore[index]
                bounds = (positions.pop(), max(lows, default=None), min(highs, default=None))
        return folded if bounds is None or folded.is_constant else _Expr("bool", combine, bounds=bounds)

    def function(self, node: ast.FuncCall) -> _Expr:
        """length(), char_length(), lower(), upper() of text."""
        names = [n.sval for n in node.funcname]
        function = _FUNCTIONS.get(names[-1]) if len(names) == 1 or names[0] == "pg_catalog" else None
        plain = not (node.agg_star or node.agg_distinct or node.over or node.agg_filter or node.func_variadic)
        if function is None or not plain or len(node.args or ()) != 1:
            raise self.fail(f"{RawStream()(node)} is not supported; supported: {SUPPORTED_EXPRESSIONS}")
        arg = self.compile(node.args[0])
        if arg.kind == "unknown":
            arg = _Expr("text", arg.fn, constant=arg.constant)
        if arg.kind not in ("text", "null"):
            raise self.fail(f"{names[-1]}() takes text, not {arg.kind}")
        f = arg.fn
        kind, width = ("int", 4) if function is len else ("text", 0)
        return self.fold(_Expr(kind, lambda v: None if (x := f(v)) is None else function(x), width), arg)

    def fold(self, expr: _Expr, *args: _Expr) -> _Expr:
        """A constant when every operand is one (a constant failing to evaluate fails the definition)."""
        if not all(a.is_constant for a in args):
            return expr
        try:
            return _constant(expr.kind, expr.fn(()), expr.width)
        except _EvalError as e:
            raise self.fail(str(e)) from None


def _column_of(expr: _Expr) -> Column:
    """A column type for typing a literal that meets `expr`."""
    kinds = {"int": "bigint", "numeric": "numeric", "float": "double", "bool": "boolean", "text": "text"}
    kind = kinds.get(expr.kind, expr.kind)
    return Column("constant", kind, kind)  # type: ignore[arg-type]


def _constant_text(value: Any) -> str:
    if type(value) is bool:
        return "true" if value else "false"
    if isinstance(value, Jsonb):
        return msgspec.json.encode(value.obj).decode()
    if isinstance(value, datetime | date):
        return value.isoformat()
    return repr(value) if type(value) is float else str(value)


def _as_float(expr: _Expr) -> _Expr:
    if expr.kind == "float":
        return expr
    if expr.is_constant:
        return _constant("float", None if expr.constant is None else float(expr.constant))
    f = expr.fn
    return _Expr("float", lambda v: None if (x := f(v)) is None else float(x), column=None)


def _bounds(name: str, column: _Expr, constant: _Expr) -> tuple[int, int | None, int | None] | None:
    """`column <op> integer` on an integer column as (position, lowest, highest), else None."""
    if column.column is None or column.kind != "int" or not constant.is_constant or type(constant.constant) is not int:
        return None
    c = constant.constant
    return {
        "=": (column.column, c, c),
        "<": (column.column, None, c - 1),
        "<=": (column.column, None, c),
        ">": (column.column, c + 1, None),
        ">=": (column.column, c, None),
    }.get(name)


def _integer_operation(name: str, low: int, high: int) -> Callable[[int, int], int]:
    def checked(result: int) -> int:
        if not low <= result <= high:
            raise _EvalError(f"integer out of range ({result})")
        return result

    def divide(x: int, y: int) -> int:
        if y == 0:
            raise _EvalError("division by zero")
        quotient = abs(x) // abs(y)
        return checked(-quotient if (x < 0) != (y < 0) else quotient)

    def modulo(x: int, y: int) -> int:
        if y == 0:
            raise _EvalError("division by zero")
        remainder = abs(x) % abs(y)
        return -remainder if x < 0 else remainder  # the sign of the dividend, as in C

    return {
        "+": lambda x, y: checked(x + y),
        "-": lambda x, y: checked(x - y),
        "*": lambda x, y: checked(x * y),
        "/": divide,
        "%": modulo,
    }[name]


def _float_operation(name: str) -> Callable[[float, float], float]:
    inf = float("inf")

    def checked(result: float, x: float, y: float, product: bool) -> float:
        # PostgreSQL's float8 checks: an infinite result of finite operands overflowed, and a zero
        # product or quotient of non-zero operands underflowed.
        if abs(result) == inf and abs(x) != inf and abs(y) != inf:
            raise _EvalError("value out of range: overflow")
        if product and result == 0.0 and x != 0.0 and y != 0.0 and abs(y) != inf:
            raise _EvalError("value out of range: underflow")
        return result

    def divide(x: float, y: float) -> float:
        if y == 0.0:
            raise _EvalError("division by zero")
        return checked(x / y, x, y, True)

    return {
        "+": lambda x, y: checked(x + y, x, y, False),
        "-": lambda x, y: checked(x - y, x, y, False),
        "*": lambda x, y: checked(x * y, x, y, True),
        "/": divide,
    }[name]


def _parse_expression(sql: str, what: str) -> ast.Node:
    try:
        statement = pglast.parse_sql(f"SELECT {sql}")[0].stmt
    except pglast.parser.ParseError as e:
        raise DefinitionError(f"{what}: {sql}: {e}") from None
    targets = statement.targetList or ()
    if len(targets) != 1 or statement.fromClause or statement.whereClause:
        raise DefinitionError(f"{what}: {sql} is not one expression")
    return targets[0].val


def _compile_check(check: Check, columns: dict[str, tuple[int, Column]], what: str) -> _Check:
    label = f"CHECK ({check.sql})"
    compiler = _Compiler(columns, what, label)
    root = compiler.compile(_parse_expression(check.sql, f"{what}: {label}"))
    if root.kind not in ("bool", "null"):
        raise compiler.fail(f"a CHECK is a condition, not a {root.kind} value")
    fn = root.fn
    bounds = root.bounds[1:] if root.bounds is not None and len(compiler.refs) == 1 else None
    return _Check(
        check.name or "check_violation",
        check.sql,
        tuple(compiler.refs),
        tuple(columns[name][0] for name in compiler.refs),
        lambda *values: fn(values),
        bounds,
    )


def _compile_default(column: Column, f: _Field, what: str) -> Callable[[], Any]:
    """A DEFAULT as a function of nothing: a constant, or the time of decoding."""
    assert column.default is not None
    label = f"DEFAULT {column.default}"
    node = _parse_expression(column.default, f"{what}: {label}")
    now_function = isinstance(node, ast.FuncCall) and node.funcname[-1].sval in ("now", "clock_timestamp")
    value_function = isinstance(node, ast.SQLValueFunction)
    if now_function or (value_function and node.op == SQLValueFunctionOp.SVFOP_CURRENT_TIMESTAMP):
        if column.kind != "timestamptz":
            raise DefinitionError(f"{what}: {label} is a timestamptz, not {column.type}")
        return lambda: datetime.now(UTC)
    if value_function and node.op == SQLValueFunctionOp.SVFOP_CURRENT_DATE:
        if column.kind != "date":
            raise DefinitionError(f"{what}: {label} is a date, not {column.type}")
        return lambda: datetime.now(UTC).date()
    compiler = _Compiler({}, what, label)
    value = compiler.compile(node)
    if not value.is_constant:
        raise compiler.fail("a default is a constant, now(), current_timestamp, clock_timestamp() or current_date")
    if value.kind == "unknown":
        converted = compiler.typed(value, column).constant
    elif value.constant is None:
        converted = None
    elif value.kind in ("timestamptz", "date", "uuid", "jsonb"):
        if value.kind != column.kind:
            raise compiler.fail(f"a {value.kind} is not a {column.type}")
        converted = value.constant
    else:
        if value.kind == "text" and column.kind not in ("text", "varchar"):
            raise compiler.fail(f"text is not a {column.type}")
        constant = Decimal(repr(value.constant)) if type(value.constant) is float else value.constant
        try:
            converted = f.from_json(constant)
        except InvalidEvent as e:
            raise compiler.fail(e.detail) from None
    if converted is None and column.not_null:
        raise compiler.fail(f"NULL in the NOT NULL column {column.name}")
    # Checked once, here: the fast path does not check what it fills in (see _FastJson).
    for check in f.checks:
        try:
            _enforce(check, (converted,))
        except InvalidEvent as e:
            raise compiler.fail(e.detail) from None
    return lambda: converted


# --- the fast path -----------------------------------------------------------------------------------


class _FastJson:
    """decode_batch's fast path for json streams: msgspec Structs, then whole columns at once.

    It decodes what it can vouch for and hands back the positions of the records it cannot (for the
    reference to explain): a failure is located by redoing only the step that failed one record at a
    time, so one bad record does not slow its batch down.
    """

    @classmethod
    def of(cls, decoder: StreamDecoder) -> _FastJson | None:
        """The fast path of a json stream, or None when a column can hold no value at all."""
        try:
            return cls(decoder)
        except _Fallback:
            return None

    def __init__(self, decoder: StreamDecoder) -> None:
        stream = decoder.stream
        self.fields = decoder._fields
        self.limit = stream.max_event_bytes
        self.check_utf8 = stream.unknown_fields == "ignore"  # msgspec skips unknown fields unread
        types: list[tuple[Any, ...]] = []
        rename = {}
        for f in self.fields:
            fast_type = _fast_type(f)
            rename[f"f{f.index}"] = f.name  # a column may be named like a Python keyword
            if f.default is not None or f.is_timestamp:
                types.append((f"f{f.index}", fast_type | msgspec.UnsetType, _UNSET))
            elif not f.not_null:
                types.append((f"f{f.index}", fast_type, None))
            else:
                types.append((f"f{f.index}", fast_type))
        self.actions: dict[Any, int] | None = None
        if stream.action_field:
            rename["action"] = stream.action_field
            choices = Literal[tuple(decoder._actions)]  # type: ignore[valid-type]
            types.append(("action", choices | msgspec.UnsetType, _UNSET))
            self.actions = {_UNSET: INSERT, **decoder._actions}
        event = msgspec.defstruct(
            f"{stream.name}_event",
            types,
            kw_only=True,
            forbid_unknown_fields=stream.unknown_fields == "reject",
            rename=rename,
            gc=False,
        )
        self.parse = msgspec.json.Decoder(event).decode
        self.placeholder = event(**{f"f{f.index}": None for f in self.fields})  # for a record it could not parse
        self.getters = [attrgetter(f"f{f.index}") for f in self.fields]
        self.converters = [_fast_converter(f) for f in self.fields]
        # The CHECKs msgspec enforces as bounds of the field type need no second look.
        self.checks = [c for f in self.fields for c in f.checks if c.bounds is None] + list(decoder._table_checks)
        self.key_index = decoder._key_index
        self.out = decoder._out

    def decode(self, records: Sequence[RecordLike]) -> tuple[list[int], list[list[Any]], list[int]]:
        """The ops and output columns of the records it vouches for, and the positions of the others."""
        values = [r.value() for r in records]
        try:
            unreadable = max(map(len, values), default=0) > self.limit or not all(values)
        except TypeError:  # len(None): a null value
            unreadable = True
        if unreadable or (self.check_utf8 and not all(map(bytes.isascii, values))):
            values = [v if self._readable(v) else b"!" for v in values]  # b"!": parsing fails at once
        bad: set[int] = set()  # positions of the records the reference must see
        events: list[Any] = []
        remaining = iter(values)
        while True:
            try:
                # list.extend keeps what it appended before an exception, and the iterator is past
                # the failed value: parsing resumes right after it.
                events.extend(map(self.parse, remaining))
            except Exception:
                bad.add(len(events))
                events.append(self.placeholder)  # all None: flows through every step unnoticed
                continue
            break
        columns = [self._column(f, get, convert, events, records, bad) for f, get, convert in self.column_plan]
        for check in self.checks:
            args = [columns[i] for i in check.columns]
            try:
                results = list(map(check.test, *args))
            except Exception:
                results = _each(check.test, list(zip(*args, strict=True)), bad, star=True)
            if False in results:
                bad.update(p for p, passed in enumerate(results) if passed is False)
        if self.key_index is not None:
            keys = [r.key() for r in records]
            expected = [str(v).encode() for v in columns[self.key_index]]
            if keys != expected:
                bad.update(p for p, (k, e) in enumerate(zip(keys, expected, strict=True)) if k != e)
        if self.actions is None:
            ops = [INSERT] * len(events)
        else:
            actions = self.actions
            ops = [actions[e.action] for e in events]
        out = [columns[i] for i in self.out]
        if not bad:
            return ops, out, []
        keep = [True] * len(events)
        for p in bad:
            keep[p] = False
        return list(compress(ops, keep)), [list(compress(column, keep)) for column in out], sorted(bad)

    @property
    def column_plan(self) -> zip:
        """Each field with its getter and converter."""
        return zip(self.fields, self.getters, self.converters, strict=True)

    def _readable(self, value: bytes | None) -> bool:
        if not value or len(value) > self.limit:
            return False
        if self.check_utf8 and not value.isascii():
            try:
                value.decode()
            except UnicodeDecodeError:
                return False
        return True

    def _column(
        self,
        f: _Field,
        get: Callable[[Any], Any],
        convert: Callable[[Any], Any] | None,
        events: list[Any],
        records: Sequence[RecordLike],
        bad: set[int],
    ) -> list[Any]:
        column = list(map(get, events))
        if convert is not None:
            try:
                column = [v if v is None or v is _UNSET else convert(v) for v in column]
            except Exception:
                column = _each(lambda v: v if v is None or v is _UNSET else convert(v), column, bad)
        if f.kind in ("text", "varchar"):
            try:
                text = "".join(column)
            except TypeError:  # NULLs or absent values
                text = "".join([v for v in column if type(v) is str])
            if "\x00" in text:
                bad.update(p for p, v in enumerate(column) if type(v) is str and "\x00" in v)
        if not (f.is_timestamp or f.default is not None):
            return column
        count = column.count(_UNSET)
        if not count:
            return column
        if f.default is not None:
            default = f.default()
            return [default if v is _UNSET else v for v in column]
        # The record timestamp: read only for the events that need it, converted once per millisecond.
        if count == len(column):
            ms: list[int | None] = [r.timestamp()[1] for r in records]
        else:
            ms = [r.timestamp()[1] if v is _UNSET else None for v, r in zip(column, records, strict=True)]
        what = f"{f.name} is missing and the record timestamp"
        times: dict[int | None, datetime | None] = {}
        for m in set(ms).difference([None]):
            try:
                times[m] = from_epoch_ms(m, what)  # type: ignore[arg-type]
            except InvalidEvent:
                times[m] = None
        if None in times.values():
            bad.update(p for p, m in enumerate(ms) if m is not None and times[m] is None)
        if count == len(column):
            return [times[m] for m in ms]
        return [v if m is None else times[m] for v, m in zip(column, ms, strict=True)]


def _each(fn: Callable[..., Any], items: list[Any], bad: set[int], star: bool = False) -> list[Any]:
    """`fn` of each item, marking in `bad` the positions where it raises (their result: None)."""
    results = []
    for position, item in enumerate(items):
        try:
            results.append(fn(*item) if star else fn(item))
        except Exception:
            bad.add(position)
            results.append(None)
    return results


def _fast_type(f: _Field) -> Any:
    """The msgspec type of a column's field: exactly the JSON values `from_json` accepts, or fewer."""
    kind = f.kind
    if kind in ("numeric", "jsonb"):
        return msgspec.Raw  # read by the reference's own converter (a JSON null included)
    if kind in INT_RANGES:
        low, high = INT_RANGES[kind]
        for check in f.checks:
            if check.bounds is not None:
                low = max(low, check.bounds[0] if check.bounds[0] is not None else low)
                high = min(high, check.bounds[1] if check.bounds[1] is not None else high)
        if low > high:
            raise _Fallback  # every value fails a CHECK: leave the reference to say so
        fast: Any = Annotated[int, msgspec.Meta(ge=low, le=high)]
    elif kind == "varchar" and f.column.typmods:
        fast = Annotated[str, msgspec.Meta(max_length=f.column.typmods[0])]
    else:
        fast = {
            "double": float,
            "real": float,
            "boolean": bool,
            "text": str,
            "varchar": str,
            "timestamptz": str | int,
            "date": str,
            "uuid": str,
        }[kind]
    return fast if f.not_null else fast | None


def _fast_converter(f: _Field) -> Callable[[Any], Any] | None:
    """What turns a present, non-null value as msgspec decoded it into the column's value (None: as is)."""
    kind, convert = f.kind, f.from_json
    if kind in INT_RANGES or kind in ("boolean", "double", "text", "varchar"):
        return None  # msgspec checked it all (text: but NUL, checked for the whole column)
    if kind == "real":
        return _single
    if kind == "numeric":
        nullable = not f.not_null

        def numeric(raw: msgspec.Raw) -> Any:
            text = bytes(raw).decode()
            if text == "null" and nullable:
                return None
            if not _NUMBER.fullmatch(text):
                raise _Fallback  # not a number: the reference names the type
            return convert(int(text) if _INTEGER.fullmatch(text) else Decimal(text))

        return numeric
    if kind == "jsonb":
        nullable = not f.not_null

        def jsonb(raw: msgspec.Raw) -> Any:
            value = _ANY_JSON.decode(raw)
            if value is None and not nullable:
                raise _Fallback
            return None if value is None else convert(value)

        return jsonb
    return convert
