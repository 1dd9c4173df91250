"""A stream column's values read from JSON and from text, as strictly as PostgreSQL would store them.

Nothing is coerced silently. JSON types are strict (an integer column takes a JSON integer, not
`7.0`, `"7"` or `true`); a value outside its type's range is `out_of_range`, or the name of the
column's named CHECK if it has one; text cannot hold NUL; timestamps are RFC 3339 with an offset or
epoch milliseconds, as `parse_rfc3339` / `from_epoch_ms` accept them. Text (a CSV field, a constant
in a CHECK or DEFAULT) is read as strictly as JSON: integers `-?(0|[1-9][0-9]*)`, numbers in JSON's
grammar, `true`/`false`, jsonb as JSON text.

Numbers are PostgreSQL's: a double or real rounds the number as written (a number that rounds to
zero or beyond the type's range is `out_of_range`, as PostgreSQL's input finds it), a numeric
keeps every digit within numeric's bounds (see json_text.numeric_text_fits). A jsonb value is its
JSON text, as written (see json_text).
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Callable
from datetime import date, datetime
from decimal import MAX_EMAX, MAX_PREC, MIN_EMIN, Context, Decimal
from typing import Any
from uuid import UUID

import msgspec

from pipelines.cv.decoding.json_text import (
    ANY_JSON,
    NUMERIC_EXPONENT_LIMIT,
    NUMERIC_FRACTION_DIGITS,
    NUMERIC_WHOLE_DIGITS,
    HugeInt,
    check_depth,
    jsonb_rejection,
    load_json,
    read_decimal,
    read_integer,
    surrogate_rejection,
)
from pipelines.cv.model import Column
from pipelines.cv.sqltext.types import INPUT
from pipelines.runtime.events import DETAIL_LIMIT, InvalidEvent, check_text, from_epoch_ms, json_text, parse_rfc3339

INT_RANGES = {"smallint": (-(2**15), 2**15 - 1), "integer": (-(2**31), 2**31 - 1), "bigint": (-(2**63), 2**63 - 1)}
__all__ = ["ANY_JSON", "HugeInt"]  # re-exported for the decoders
EXACT = Context(prec=MAX_PREC, Emax=MAX_EMAX, Emin=MIN_EMIN)  # numeric + - * never rounds
INTEGER = re.compile(r"-?(?:0|[1-9][0-9]*)")
NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_FLOAT32 = struct.Struct("<f")
_BITS32 = struct.Struct("<I")
_INFINITY = float("inf")
_REAL_MAX = 2.0**128 - 2.0**104
_REAL_OVERFLOW = 2.0**128 - 2.0**103  # halfway between real's largest value and 2**128: overflows
_AS_WRITTEN = msgspec.json.Encoder(decimal_format="number", enc_hook=Decimal)  # HugeInt: as a Decimal
_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def wrong_type(name: str, expected: str, value: Any) -> InvalidEvent:
    """The rejection of a value of the wrong JSON type."""
    return InvalidEvent("wrong_type", f"{name} must be {expected}, got {as_written(value)}")


def json_converter(column: Column, range_reason: str) -> tuple[str, Callable[[Any], Any]]:
    """What a JSON value of the column must be, and the function turning it into the column's value.

    The function takes a present, non-null value as the generic decoder returns it (an integer as
    int, any other number as Decimal) and raises InvalidEvent.
    """
    name, kind, typmods = column.name, column.kind, column.typmods

    def out_of_range(value: Any, what: str) -> InvalidEvent:
        return InvalidEvent(range_reason, f"{name} {as_written(value)} is out of range for {what}")

    if kind in INT_RANGES:
        low, high = INT_RANGES[kind]

        def integer(value: Any) -> int:
            if type(value) is not int:
                if type(value) is HugeInt:
                    raise out_of_range(value, f"{kind} ({low} .. {high})")
                raise wrong_type(name, "a JSON integer", value)
            if not low <= value <= high:
                raise out_of_range(value, f"{kind} ({low} .. {high})")
            return value

        return "a JSON integer", integer
    if kind == "numeric":
        fits = _numeric_fit(typmods)

        def numeric(value: Any) -> Decimal:
            if type(value) is int or type(value) is HugeInt:
                value = Decimal(value)
            elif type(value) is not Decimal:
                raise wrong_type(name, "a JSON number", value)
            if value.is_zero() and value.is_signed():
                value = value.copy_abs()  # PostgreSQL has no negative zero numeric
            if not fits(value):
                raise out_of_range(value, column.type)
            return value

        return "a JSON number", numeric
    if kind in ("double", "real"):
        single = kind == "real"

        def number(value: Any) -> float:
            if type(value) is not int and type(value) is not Decimal and type(value) is not HugeInt:
                raise wrong_type(name, "a JSON number", value)
            try:
                result = float(value)  # correctly rounded, as PostgreSQL's input rounds
                if result == 0.0 and value != 0:
                    raise OverflowError  # lost to zero: PostgreSQL's input rejects an underflow
                if single:
                    result = as_real(result, value)
            except OverflowError:
                raise out_of_range(value, column.type) from None
            if result in (_INFINITY, -_INFINITY):
                raise out_of_range(value, column.type)
            return result

        return "a JSON number", number
    if kind == "boolean":

        def boolean(value: Any) -> bool:
            if type(value) is not bool:
                raise wrong_type(name, "true or false", value)
            return value

        return "true or false", boolean
    if kind in ("text", "varchar"):
        limit = typmods[0] if typmods else None

        def text(value: Any) -> str:
            if type(value) is not str:
                raise wrong_type(name, "a JSON string", value)
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
            if type(value) is HugeInt:
                raise InvalidEvent(
                    "bad_timestamp", f"{name} {as_written(value)} is not epoch milliseconds in 1970-01-01 .. 9999-12-31"
                )
            raise wrong_type(name, expected, value)

        return expected, timestamp
    if kind == "date":

        def day(value: Any) -> date:
            if type(value) is not str:
                raise wrong_type(name, "a JSON string (YYYY-MM-DD)", value)
            try:
                if _DATE.fullmatch(value):
                    return date.fromisoformat(value)
            except ValueError:
                pass
            raise InvalidEvent("bad_date", f"{name} {as_written(value)} is not a date (YYYY-MM-DD)")

        return "a JSON string (YYYY-MM-DD)", day
    if kind == "uuid":

        def uuid(value: Any) -> UUID:
            if type(value) is not str:
                raise wrong_type(name, "a JSON string", value)
            if not _UUID.fullmatch(value):
                raise InvalidEvent("bad_uuid", f"{name} {as_written(value)} is not a UUID (8-4-4-4-12 hex digits)")
            return UUID(value)

        return "a JSON string (a UUID)", uuid
    if kind == INPUT:
        expected = f"a JSON value PostgreSQL reads as {column.type}"

        def as_written_text(text: str) -> str:
            # `text`: a present value's JSON text, as written: PostgreSQL's input reads it (INPUT_SQL),
            # and the runner asks PostgreSQL whether it does (pipelines.cv.decoding.input_check).
            return text

        return expected, as_written_text
    assert kind == "jsonb", kind

    def jsonb(text: str) -> str:
        # `text`: a present value's JSON text, valid JSON (the parser read it) of at most MAX_DEPTH levels.
        rejection = jsonb_rejection(name, text, range_reason)
        if rejection is not None:
            raise rejection
        return text

    return "a JSON value other than null", jsonb


def as_real(value: float, exact: int | Decimal | None = None) -> float:
    """A double as PostgreSQL's real input rounds the number it came from (`exact`, when known).

    Raises:
        OverflowError: The number is beyond real's range, or a non-zero double rounds to zero.
        ValueError: The double lies halfway between two reals and `exact` is not given: which way
            the number itself rounds, only the number can tell (rounding twice may differ).
    """
    try:
        rounded = _FLOAT32.unpack(_FLOAT32.pack(value))[0]
    except OverflowError:
        if abs(value) != _REAL_OVERFLOW:
            raise
        rounded = math.copysign(_INFINITY, value)  # a tie: settled below
    # Halfway between two reals, a double has at most 25 significant bits (a real has 24).
    if rounded != value and (math.frexp(value)[0] * 33554432.0).is_integer():
        other = _other_side(value, rounded)
        if other is not None:
            if exact is None:
                raise ValueError(f"{value!r} lies halfway between two reals")
            if Decimal(exact) != Decimal(value) and (Decimal(exact) > Decimal(value)) != (rounded > value):
                rounded = other  # the number is not the tie its double is: it rounds to its side
    if (rounded == 0.0 and value != 0.0) or abs(rounded) == _INFINITY:
        raise OverflowError  # PostgreSQL's input rejects an underflow too
    return rounded


def _other_side(value: float, rounded: float) -> float | None:
    """The real beyond `value` from `rounded` when `value` is exactly halfway between the two, else None."""
    if abs(rounded) == _INFINITY:
        return math.copysign(_REAL_MAX, value)  # value is _REAL_OVERFLOW
    if rounded == 0.0:
        bits = 0x00000001 if value > 0 else 0x80000001  # the smallest real of value's sign
    else:
        bits = _BITS32.unpack(_FLOAT32.pack(rounded))[0] + (1 if abs(value) > abs(rounded) else -1)
    other = _FLOAT32.unpack(_BITS32.pack(bits))[0]
    return other if value - rounded == other - value else None


def _numeric_fit(typmods: tuple[int, ...]) -> Callable[[Decimal], bool]:
    precision, scale = (*typmods, 0)[:2] if typmods else (None, None)

    def fits(value: Decimal) -> bool:
        # First what numeric's input takes of str(value), the text sent (json_text.numeric_text_fits):
        # its scale as written (-exponent), its digits before the point, the exponent of a zero.
        _, digits, exponent = value.as_tuple()
        if exponent < -NUMERIC_FRACTION_DIGITS:  # type: ignore[operator]
            return False
        if digits[0] == 0:  # zero (a non-zero Decimal's digits start with a non-zero one)
            return exponent < NUMERIC_EXPONENT_LIMIT  # type: ignore[operator]
        whole = len(digits) + exponent  # type: ignore[operator]
        if whole > NUMERIC_WHOLE_DIGITS:
            return False
        if precision is None:
            return True
        # No rounding to the scale: a value with more decimals than the column keeps is not its value
        # (trailing zeros are not decimals it lacks).
        fraction = 0
        if exponent < 0:  # type: ignore[operator]
            zeros = len(digits) - len(bytes(digits).rstrip(b"\0"))
            fraction = max(0, -exponent - zeros)  # type: ignore[operator]
        return fraction <= scale and max(0, whole) <= precision - scale

    return fits


def text_converter(column: Column, from_json: Callable[[Any], Any], range_reason: str) -> Callable[[str], Any]:
    """The function reading a column's value from text (a CSV field, a constant), as strictly as JSON."""
    name, kind = column.name, column.kind

    def read(text: str) -> Any:
        if kind in INT_RANGES:
            if not INTEGER.fullmatch(text):
                raise InvalidEvent("wrong_type", f"{name} must be an integer, got {text[:DETAIL_LIMIT]!r}")
            return from_json(read_integer(text))
        if kind in ("numeric", "double", "real"):
            if not NUMBER.fullmatch(text):
                raise InvalidEvent("wrong_type", f"{name} must be a number, got {text[:DETAIL_LIMIT]!r}")
            return from_json(read_integer(text) if INTEGER.fullmatch(text) else read_decimal(text))
        if kind == "boolean":
            if text not in ("true", "false"):
                raise InvalidEvent("wrong_type", f"{name} must be true or false, got {text[:DETAIL_LIMIT]!r}")
            return text == "true"
        if kind == "timestamptz":
            return from_json(read_integer(text) if INTEGER.fullmatch(text) else text)
        if kind == INPUT and column.type.removeprefix("pg_catalog.") != "json":
            return from_json(json.dumps(text))  # the field's text, as a JSON string field gives it
        if kind in ("jsonb", INPUT):  # json: the field is JSON text
            encoded = text.encode()
            check_depth(encoded, name)
            try:
                value = load_json(encoded)
            except msgspec.DecodeError as e:
                raise surrogate_rejection(encoded, name) or InvalidEvent(
                    "wrong_type", f"{name} must be JSON text: {e}"
                ) from None
            if value is None:
                raise InvalidEvent("wrong_type", f"{name} must be {column.type} other than null, got null")
            return from_json(text)
        return from_json(text)

    return read


def _rfc3339(name: str, text: str) -> datetime:
    try:
        return parse_rfc3339(text)
    except InvalidEvent as e:
        if name == "ts" or not e.detail.startswith("ts "):
            raise
        raise InvalidEvent(e.reason, name + e.detail[2:]) from None  # name the column, not "ts"


def as_written(value: Any) -> str:
    """The offending value as the producer wrote it (`true`, `"42"`, `4.2`), bounded."""
    if type(value) is Decimal or type(value) is int or type(value) is HugeInt:
        return str(value)[:DETAIL_LIMIT]
    try:
        return json_text(value)
    except TypeError:  # a Decimal or a big integer inside: msgspec writes them as the numbers they are
        return _AS_WRITTEN.encode(value).decode()[:DETAIL_LIMIT]
