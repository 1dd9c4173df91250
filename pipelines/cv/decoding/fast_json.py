r"""decode_batch's fast path for json streams: msgspec decodes, whole columns are checked at once.

msgspec decodes each record into a Struct generated for the stream (strict types; CHECKs of the form
`column <op> integer` become msgspec constraints), then whole columns are finished and checked with
list comprehensions. When a step fails, only that step is redone record by record to find which
records failed, and the reference decoder (StreamDecoder.decode) explains those: a bad record costs
its own reference decoding, not its batch's speed.

Where msgspec's reading is not enough, cheap tests over a whole column pick the records the
reference must look at: a record that may nest too deep (more brackets than json_text.MAX_DEPTH),
a double or real read as zero from a record that may write a number too small for it, jsonb text
that may hold `\u0000` or a number beyond numeric's range. They err toward the reference, which
decides.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from datetime import datetime
from itertools import compress
from operator import attrgetter, methodcaller
from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec

from pipelines.cv.decoding.checks import CompiledCheck
from pipelines.cv.decoding.fields import Field
from pipelines.cv.decoding.json_text import MAX_DEPTH, SUSPECT_NUMBER, TEXT_KINDS, read_decimal, too_deep
from pipelines.cv.decoding.values import INT_RANGES, NUMBER, as_real
from pipelines.cv.model import StreamDef
from pipelines.runtime.events import INSERT, InvalidEvent, from_epoch_ms, quoted_names, repeat_suspects

if TYPE_CHECKING:
    from pipelines.cv.decoding.stream_decoder import RecordLike

_UNSET = msgspec.UNSET
_RAW = msgspec.Raw
# A number a double or real cannot hold but as zero, in some field of the record: a negative
# exponent of three digits or more, or 200 zeros after a decimal point (with an exponent of two
# digits at most, fewer leave the number within double's range).
_MAY_UNDERFLOW = re.compile(rb"[eE]-0*[1-9][0-9]{2}|\.0{200}")
_ZEROS = b"." + b"0" * 200
# A column kind's JSON values, as the quote count of `FastJson._repeated` sees them.
_QUOTE_KINDS = {
    "text": "str",
    "varchar": "str",
    "date": "str",
    "uuid": "str",
    "timestamptz": "mixed",  # RFC 3339 text or epoch milliseconds
    "smallint": "none",
    "integer": "none",
    "bigint": "none",
    "double": "none",
    "real": "none",
    "boolean": "none",
}


class _Fallback(Exception):
    """The fast path cannot vouch for a value: the reference decodes its record (and says why)."""


class FastJson:
    """decode_batch's fast path for json streams: msgspec Structs, then whole columns at once.

    It decodes what it can vouch for and hands back the positions of the records it cannot (for the
    reference to explain): a failure is located by redoing only the step that failed one record at a
    time, so one bad record does not slow its batch down.

    Args:
        stream: The stream, of format json.
        fields: Its columns as the reference decoder reads them, in declared order.
        table_checks: Its table-level CHECKs.
        actions: Each value of its `action_field`: INSERT or DELETE.
        key_index: The position of its `kafka_key` column, if it has one.
        out: The positions of the columns the caller wants, in that order.
    """

    @classmethod
    def of(cls, *args: Any) -> FastJson | None:
        """`FastJson(*args)`, or None when a column can hold no value at all."""
        try:
            return cls(*args)
        except _Fallback:
            return None

    def __init__(
        self,
        stream: StreamDef,
        fields: tuple[Field, ...],
        table_checks: tuple[CompiledCheck, ...],
        actions: dict[str, int],
        key_index: int | None,
        out: tuple[int, ...],
    ) -> None:
        self.fields = fields
        self.limit = stream.max_event_bytes
        self.check_utf8 = stream.unknown_fields == "ignore"  # msgspec skips unknown fields unread
        # Whether msgspec may read a record nested deeper than MAX_DEPTH: in a jsonb column or an
        # ignored field (a column of another type fails at its first bracket).
        self.nests = self.check_utf8 or any(f.kind in TEXT_KINDS for f in fields)
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
            choices = Literal[tuple(actions)]  # type: ignore[valid-type]
            types.append(("action", choices | msgspec.UnsetType, _UNSET))
            self.actions = {_UNSET: INSERT, **actions}
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
        self.checks = [c for f in self.fields for c in f.checks if c.bounds is None] + list(table_checks)
        self.key_index = key_index
        self.out = out
        # Fields that must not be given twice (see runtime.events.repeat_suspects), with the getters
        # telling how many records hold each.
        names = [f.name for f in self.fields] + ([stream.action_field] if stream.action_field else [])
        self.watched = quoted_names(names)
        self.watched_getters = [*self.getters, *([attrgetter("action")] if stream.action_field else [])]
        # How each watched field's values count in quotes: all strings, strings or not, never strings.
        # None: a column whose values msgspec leaves raw (numeric, jsonb) hides keys from the count.
        kinds = [_QUOTE_KINDS.get(f.kind) for f in self.fields] + ["str"] * bool(stream.action_field)
        self.quote_kinds: list[str] | None = None if None in kinds else kinds  # type: ignore[assignment]
        # A required field has a value in every record msgspec reads (counting its values is not free).
        self.required = [f.not_null and f.default is None and not f.is_timestamp for f in self.fields] + [False] * bool(
            stream.action_field
        )

    def decode(self, records: Sequence[RecordLike]) -> tuple[list[int], list[list[Any]], list[int]]:
        """The ops and output columns of the records it vouches for, and the positions of the others."""
        values = [r.value() for r in records]
        try:
            unreadable = max(map(len, values), default=0) > self.limit or not all(values)
        except TypeError:  # len(None): a null value
            unreadable = True
        if unreadable or (self.check_utf8 and not all(map(bytes.isascii, values))):
            values = [v if self._readable(v) else b"!" for v in values]  # b"!": parsing fails at once
        if self.nests and max(map(len, values), default=0) > MAX_DEPTH:
            values = [b"!" if too_deep(v) else v for v in values]
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
        raws = [list(map(get, events)) for get in self.watched_getters]
        bad.update(self._repeated(values, raws, bad))
        fields = zip(self.fields, raws[: len(self.fields)], self.converters, strict=True)  # raws[-1]: the action
        columns = [self._column(f, raw, convert, records, values, bad) for f, raw, convert in fields]
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

    def _readable(self, value: bytes | None) -> bool:
        if not value or len(value) > self.limit:
            return False
        if self.check_utf8 and not value.isascii():
            try:
                value.decode()
            except UnicodeDecodeError:
                return False
        return True

    def _repeated(self, values: list[bytes], raws: list[list[Any]], failed: set[int]) -> set[int]:
        """The records that may give a field twice (JSON parsers keep the last): the reference decides.

        A whole batch is cleared at once by counting its quotes: each key is two, each string value
        two more, so when the batch holds exactly as many as the fields msgspec found (a null value
        is not counted, and an escaped quote is one more), no record wrote a key it did not read.
        Otherwise (nulls, escapes, numeric or jsonb columns whose values are not typed here), each
        watched name is counted (runtime.events.repeat_suspects).
        """
        unread = len(failed)  # records msgspec could not read: their placeholder holds None everywhere
        holding = [
            len(raw) - unread if required else len(raw) - raw.count(None) - raw.count(_UNSET)
            for raw, required in zip(raws, self.required, strict=True)
        ]
        if self.quote_kinds is not None:
            strings = [
                h if kind == "str" else list(map(type, raw)).count(str) if kind == "mixed" else 0
                for h, raw, kind in zip(holding, raws, self.quote_kinds, strict=True)
            ]
            if sum(map(methodcaller("count", b'"'), values)) == 2 * (sum(holding) + sum(strings)):
                return set()
        return repeat_suspects(values, self.watched, holding)

    def _column(
        self,
        f: Field,
        column: list[Any],
        convert: Callable[[Any], Any] | None,
        records: Sequence[RecordLike],
        values: list[bytes],
        bad: set[int],
    ) -> list[Any]:
        """A column from its values as msgspec read them (`column`, changed in place or replaced)."""
        if f.kind in TEXT_KINDS:
            column = _jsonb_column(column, not f.not_null, bad)
        elif f.kind in ("double", "real") and 0.0 in column:
            # Zero, or a number too small for the type that msgspec rounded to zero: the reference tells.
            zeros = [p for p, v in enumerate(column) if v == 0.0]
            written = b"\x00".join([values[p] for p in zeros])
            if b"e-" in written or b"E-" in written or _ZEROS in written:
                bad.update(p for p in zeros if _MAY_UNDERFLOW.search(values[p]))
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


def _jsonb_column(column: list[Any], nullable: bool, bad: set[int]) -> list[Any]:
    r"""A jsonb column's values as their JSON text (msgspec.Raw as read), null as None.

    Valid JSON (msgspec read it), but not checked for UTF-8, and with a `\u0000` or a number
    numeric cannot hold left to the reference (see json_text.jsonb_rejection), which the whole
    column is searched for at once.
    """
    if not column:
        return column
    raws = [v if type(v) is _RAW else b"null" for v in column]  # None: a record msgspec could not read
    try:
        joined = b"\x00".join(raws).decode()  # JSON text holds no NUL byte: a safe separator
        texts = joined.split("\x00")
    except UnicodeDecodeError:
        joined, texts = "", []
        for p, raw in enumerate(raws):
            try:
                texts.append(bytes(raw).decode())
            except UnicodeDecodeError:
                bad.add(p)
                texts.append("null")
        joined = "\x00".join(texts)
    if "\\u0000" in joined or SUSPECT_NUMBER.search(joined):
        bad.update(p for p, t in enumerate(texts) if "\\u0000" in t or SUSPECT_NUMBER.search(t))
    if "null" in texts:
        for p, t in enumerate(texts):
            if t == "null":
                if type(column[p]) is not _RAW:
                    texts[p] = column[p]  # absent (a DEFAULT fills it in), or unread
                elif nullable:
                    texts[p] = None
                else:
                    bad.add(p)  # the reference says why
    return texts


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


def _fast_type(f: Field) -> Any:
    """The msgspec type of a column's field: exactly the JSON values `from_json` accepts, or fewer."""
    kind = f.kind
    if kind == "numeric" or kind in TEXT_KINDS:
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


def _fast_converter(f: Field) -> Callable[[Any], Any] | None:
    """What turns a present, non-null value as msgspec decoded it into the column's value (None: as is)."""
    kind, convert = f.kind, f.from_json
    if kind in INT_RANGES or kind in ("boolean", "double", "text", "varchar"):
        return None  # msgspec checked it all (text: but NUL, checked for the whole column)
    if kind == "real":
        return as_real  # ValueError halfway between two reals: the reference rounds the number itself
    if kind == "numeric":
        nullable = not f.not_null

        def numeric(raw: msgspec.Raw) -> Any:
            text = bytes(raw).decode()
            if text == "null" and nullable:
                return None
            if not NUMBER.fullmatch(text):
                raise _Fallback  # not a number: the reference names the type
            return convert(read_decimal(text))  # an integer too: exact, of any length

        return numeric
    if kind in TEXT_KINDS:
        return None  # see _jsonb_column
    return convert
