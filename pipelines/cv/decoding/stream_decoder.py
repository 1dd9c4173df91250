"""Decoding a stream's Kafka records, generated from its declaration: no hand-written code per stream.

`StreamDecoder(stream)` compiles what CREATE STREAM declares (column types, NOT NULL, DEFAULT, CHECK,
and the options `format`, `kafka_key`, `action_field`, `timestamp_column`, `unknown_fields`,
`max_event_bytes`) into two decoders that must agree record for record:

- `decode` is the reference: plain Python over the parsed JSON object (or CSV fields), in a fixed
  order (size, syntax, unknown fields, each column in declared order with its CHECKs, table CHECKs,
  the record key, the action), so every rejection has one stable reason and a detail naming the
  field and the value.
- `decode_batch` is the hot path: json batches go through the fast path (pipelines.cv.decoding.fast_json),
  and `decode` explains the records it could not vouch for. (csv and debezium batches are decoded
  by `decode`, record by record.)

How each column type is read is in pipelines.cv.decoding.values, a column's absence and CHECKs in
pipelines.cv.decoding.fields, CHECK and DEFAULT in pipelines.cv.decoding.checks (their expressions in
pipelines.cv.decoding.expressions). A JSON null is NULL, `wrong_type` on a NOT NULL column.

Formats:

- json: one JSON object per record; fields are the columns (and the `action_field`).
- csv: one RFC 4180 record (comma, double quotes, UTF-8, an optional final line break), fields in
  column order, every record an insert. An empty unquoted field has no value (as an absent JSON
  field: DEFAULT, record timestamp, NULL); a quoted empty field is the empty string. Values are
  read from text as strictly as from JSON: integers `-?(0|[1-9][0-9]*)`, numbers in JSON's grammar,
  `true`/`false`, jsonb as JSON text.
- debezium: a change event of the JSON converter without schemas (`{"before", "after", "op",
  "source": {"ts_ms"}}`); `c` and `r` insert the `after` row, `u` replaces its key's row with the
  `after` row (REPLACE: a delete of the key, then an insert; the engine takes the deleted values from
  the row it stored), `d` deletes the `before` row, a null value (tombstone) carries nothing. A
  delete's row image holds only the table's primary key: there, a NOT NULL column may be absent or
  null (NULL), and the `timestamp_column` takes the commit time `source.ts_ms` (also for an insert
  without it) before the record timestamp.

Every format: an event nested deeper than 500 levels is `out_of_range`, and a jsonb value is the
JSON text as written (pipelines.cv.decoding.json_text).
"""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

from pipelines.cv.decoding.checks import compile_check, enforce
from pipelines.cv.decoding.fast_json import FastJson
from pipelines.cv.decoding.fields import Field
from pipelines.cv.decoding.input_check import InputCheck, InputColumns
from pipelines.cv.decoding.json_text import RAW_OBJECT, TEXT_KINDS, check_depth, load_json, surrogate_rejection
from pipelines.cv.decoding.values import as_written
from pipelines.cv.model import DefinitionError, StreamDef
from pipelines.cv.sqltext.types import INPUT
from pipelines.runtime.events import DELETE, INSERT, InvalidEvent, may_repeat, quoted_names

# A Debezium update: its key's row is replaced. `decode` says so; a batch holds it as two changes,
# DELETE then INSERT of the new row, which a keyed stream's deltas turn into the old row's retraction
# and the new row's addition (an append-only stream keeps the insert only).
REPLACE = 2
DEBEZIUM_OPS = {"c": INSERT, "r": INSERT, "u": REPLACE, "d": DELETE}

_ABSENT = object()  # a field the event does not have (a JSON null is None)
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
        ops: INSERT or DELETE for each change, in input order: one per accepted record, two for a
            Debezium update (DELETE of the key, then INSERT of the new row, both with its values).
        columns: One list per output column, parallel to `ops`.
        rejected: (index into the records, why) for each rejected record, in input order.
        skipped: Records that carry nothing to apply (Debezium tombstones).
    """

    ops: list[int]
    columns: list[list[Any]]
    rejected: list[tuple[int, InvalidEvent]] = field(default_factory=list)
    skipped: int = 0


class StreamDecoder:
    """Decodes the records of one stream into (op, values), as its declaration says.

    Args:
        stream: The stream's definition.
        output: The columns whose values the caller needs, in that order (default: all, in declared
            order). The others are still decoded and checked.
        input_check: Asks PostgreSQL which values of a column of kind input (a type decoding does not
            read: pipelines.cv.sqltext.types) its input refuses; `decode_batch` and `decode_each`
            reject those records (`invalid_input`). Without it, they are kept as written.

    Raises:
        DefinitionError: A CHECK or DEFAULT cannot be evaluated, or `output` names an unknown column.
    """

    def __init__(
        self, stream: StreamDef, output: Sequence[str] | None = None, input_check: InputCheck | None = None
    ) -> None:
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
        self._fields = tuple(Field(i, c, stream, what) for i, c in enumerate(stream.columns))
        self._inputs = InputColumns(
            [(p, self._fields[i].column) for p, i in enumerate(self._out) if self._fields[i].kind == INPUT],
            input_check,
        )
        columns = {c.name: (i, c) for i, c in enumerate(stream.columns)}
        self._table_checks = tuple(compile_check(c, columns, what) for c in stream.checks)
        self._allowed = frozenset(names) | ({stream.action_field} if stream.action_field else set())
        self._reject_unknown = stream.unknown_fields == "reject"
        self._quoted = quoted_names(sorted(self._allowed))  # a column or the action field given twice
        self._key_index = names.index(stream.kafka_key) if stream.kafka_key else None
        # jsonb columns, and those PostgreSQL reads (kind input), keep the JSON text as written: the
        # reference finds it in a second, unparsed read.
        self._raw_text = any(c.kind in TEXT_KINDS for c in stream.columns)
        self._actions = {a: INSERT for a in stream.insert_actions} | {a: DELETE for a in stream.delete_actions}
        self._fast = (
            FastJson.of(stream, self._fields, self._table_checks, self._actions, self._key_index, self._out)
            if stream.format == "json"
            else None
        )

    # --- the reference ---------------------------------------------------------------------------

    def decode(self, key: bytes | None, value: bytes | None, timestamp_ms: int) -> tuple[int, tuple] | None:
        """Decode one record: (INSERT, DELETE or REPLACE, the output columns' values), or None for a tombstone.

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
            return self._debezium(event, value, record_ms)
        if may_repeat(value, self._quoted):
            _reject_repeated(value, self._allowed)
        row = self._row(event, record_ms, texts=RAW_OBJECT.decode(value) if self._raw_text else None)
        self._check_key(key, row)
        return self._op(event), tuple(row[i] for i in self._out)

    def _row(
        self,
        event: dict[str, Any],
        record_ms: Callable[[], int],
        commit_ms: int | None = None,
        deleting: bool = False,
        texts: dict[str, msgspec.Raw] | None = None,
    ) -> list[Any]:
        """The row of a JSON object (an event, or a Debezium row image), every CHECK enforced.

        `texts`: the object's fields as JSON text, when the stream has jsonb columns (their value).
        """
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
            elif texts is not None and f.kind in TEXT_KINDS:
                value = f.from_json(bytes(texts[f.name]).decode())
            else:
                value = f.from_json(raw)
            row.append(f.checked(value))
        return self._checked(row)

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
            row.append(f.checked(value))
        return self._checked(row)

    def _checked(self, row: list[Any]) -> list[Any]:
        """The row, once it passes the table's CHECKs."""
        for check in self._table_checks:
            enforce(check, tuple(row[i] for i in check.columns))
        return row

    def _debezium(self, event: dict[str, Any], value: bytes, record_ms: Callable[[], int]) -> tuple[int, tuple]:
        op = DEBEZIUM_OPS.get(event.get("op")) if type(event.get("op")) is str else None
        if op is None:
            raise InvalidEvent("unknown_action", f"change op {event.get('op')!r} cannot be applied row by row")
        image = "before" if op == DELETE else "after"
        row_image = event.get(image)
        if type(row_image) is not dict:
            raise InvalidEvent(
                "missing_field", f"op {event['op']!r} needs the {image} row, got {as_written(row_image)}"
            )
        source = event.get("source")
        committed = source.get("ts_ms") if type(source) is dict else None
        commit_ms = committed if type(committed) is int else None
        texts = RAW_OBJECT.decode(RAW_OBJECT.decode(value)[image]) if self._raw_text else None
        row = self._row(row_image, record_ms, commit_ms, deleting=op == DELETE, texts=texts)
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
            raise InvalidEvent("wrong_type", f"{name} must be a JSON string, got {as_written(action)}")
        op = self._actions.get(action)
        if op is None:
            expected = " or ".join(map(repr, self._actions))
            raise InvalidEvent("unknown_action", f"{name} must be {expected}, got {action!r}")
        return op

    # --- batches ---------------------------------------------------------------------------------

    def decode_each(self, records: Sequence[RecordLike], undecodable: str | None = None) -> DecodedBatch:
        """What `decode` gives record by record, as a batch: the reference for `decode_batch`.

        Args:
            records: The records, in order.
            undecodable: When given, a record on which `decode` fails unexpectedly (a bug, not bad
                input) is rejected with this reason instead of raising, so the others still count.
        """
        batch = DecodedBatch([], [[] for _ in self._out])
        records_of: list[int] | None = [] if self._inputs else None  # each change's record
        for index, record in enumerate(records):
            try:
                decoded = self.decode(record.key(), record.value(), record.timestamp()[1])
            except InvalidEvent as e:
                batch.rejected.append((index, e))
                continue
            except Exception as e:
                if undecodable is None:
                    raise
                batch.rejected.append((index, InvalidEvent(undecodable, f"{type(e).__name__}: {e}")))
                continue
            if decoded is None:
                batch.skipped += 1
                continue
            _append(batch, *decoded, index, records_of)
        return self._inputs.checked(batch, records_of)

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
            if not retry:  # one change per record (json)
                return self._inputs.checked(batch, list(range(len(records))) if self._inputs else None)
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
        records_of: list[int] | None = None  # each change's record, when the input check needs it
        if self._inputs:
            retried = set(retry)
            records_of = [i for i in range(len(records)) if i not in retried] if batch.ops else []
        if late and self._fast is not None and batch.ops:
            # Put them in input order among the fast path's (rare: a JSON key given twice, say).
            retried = {i for i, _ in batch.rejected} | {i for i, *_ in late}
            fast = [i for i in range(len(records)) if i not in retried]
            rows = zip(*batch.columns, strict=True) if batch.columns else [()] * len(fast)
            late += zip(fast, batch.ops, rows, strict=True)
            late.sort(key=operator.itemgetter(0))
            batch.ops, batch.columns = [], [[] for _ in self._out]
            records_of = [] if records_of is not None else None
        for index, op, values in late:
            _append(batch, op, values, index, records_of)
        return self._inputs.checked(batch, records_of)


def _append(batch: DecodedBatch, op: int, values: tuple, index: int = 0, records_of: list[int] | None = None) -> None:
    """Add a decoded record's change to a batch: two for a REPLACE (`records_of`: each change's record)."""
    if op == REPLACE:
        _append(batch, DELETE, values, index, records_of)
        op = INSERT
    batch.ops.append(op)
    if records_of is not None:
        records_of.append(index)
    for into, value in zip(batch.columns, values, strict=True):
        into.append(value)


# --- formats -------------------------------------------------------------------------------------


def _load_object(value: bytes) -> dict[str, Any]:
    # Not runtime.events.load_object: orjson reads integers beyond 64 bits as errors and numbers as
    # floats, where a stream needs them exact (numeric columns, out-of-range ids named as such).
    check_depth(value, "value")  # before parsing: the parsers recurse
    try:
        event = load_json(value)
    except msgspec.DecodeError as e:
        raise surrogate_rejection(value, "value") or InvalidEvent("malformed_json", f"value is not JSON: {e}") from None
    if type(event) is not dict:
        raise InvalidEvent("malformed_json", f"value must be a JSON object, got {as_written(event)}")
    return event


def _reject_repeated(value: bytes, names: frozenset[str]) -> None:
    """Raise `duplicate_field` when the value's top-level object gives one of `names` twice (exact).

    runtime.events.reject_repeated, reading numbers as text: an integer of any length is no error.
    """
    objects: list[list[tuple[str, Any]]] = []  # every object, innermost first: the top level comes last
    json.loads(value, object_pairs_hook=lambda pairs: objects.append(pairs) or {}, parse_int=str, parse_float=str)
    seen: set[str] = set()
    for key, _ in objects[-1] if objects else ():
        if key in seen and key in names:
            raise InvalidEvent("duplicate_field", f"field {key!r} is given twice")
        seen.add(key)


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
