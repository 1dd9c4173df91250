r"""JSON text as decoding reads it and PostgreSQL stores it: nesting, integers of any length, jsonb.

- An event is nested at most MAX_DEPTH (500) levels, counting its own object: deeper is
  `out_of_range`. msgspec and Python's json recurse on the interpreter's stack (1000 frames by
  default, shared with the caller's), so without a fixed bound below it the same record would be
  decodable in one thread and not in another. PostgreSQL's jsonb takes far deeper values (its bound
  is `max_stack_depth`).
- An integer may have any length: Python's int() refuses more than 4300 digits (a guard against
  quadratic conversion), and so does msgspec. Such an integer is read as a HugeInt (a Decimal),
  which numeric and jsonb columns take and every other type finds out of range.
- A jsonb value is kept as the JSON text the producer wrote (PostgreSQL's jsonb keeps numbers as
  numeric, exactly, where a double would round them), and rejected only where PostgreSQL's jsonb
  input would fail its whole batch: a string or key holding `\u0000` (jsonb strings are text, which
  cannot hold NUL: `invalid_text`), and a number beyond numeric's range (`out_of_range`, see
  `numeric_text_fits`). An unpaired UTF-16 surrogate (`"\ud800"`) is not Unicode text, in any
  column: msgspec refuses it, and decoding says so (`invalid_text`).
"""

from __future__ import annotations

import json
import re
from decimal import MAX_EMAX, Decimal, InvalidOperation
from itertools import accumulate
from typing import Any

import msgspec

from pipelines.runtime.events import InvalidEvent

MAX_DEPTH = 500
# PostgreSQL's numeric: digits before the decimal point and after it (its display scale, as written),
# and the bound numeric_in puts on an exponent before anything else (INT_MAX / 2).
NUMERIC_WHOLE_DIGITS, NUMERIC_FRACTION_DIGITS, NUMERIC_EXPONENT_LIMIT = 131_072, 16_383, 1_073_741_823
_INT_DIGITS = 4300  # sys.int_info.default_max_str_digits: int() of longer text raises ValueError


def read_decimal(text: str) -> Decimal:
    """A JSON number's value as a Decimal, exact but for an exponent past 10**17 (out of every range anyway)."""
    try:
        return Decimal(text)
    except InvalidOperation:  # an exponent beyond Decimal's 10**18
        mantissa, _, exponent = text.lower().partition("e")
        return Decimal(f"{mantissa}e{'-' if exponent.startswith('-') else ''}{MAX_EMAX // 2}")


# Generic JSON, numbers exact: a fraction or exponent is a Decimal of its text, an integer an int.
ANY_JSON = msgspec.json.Decoder(float_hook=read_decimal)
# A JSON object's fields as their JSON text, unparsed: how a jsonb column's text is found.
RAW_OBJECT = msgspec.json.Decoder(dict[str, msgspec.Raw])
# The kinds whose value is the field's JSON text as written: jsonb, and every type PostgreSQL reads.
TEXT_KINDS = frozenset({"jsonb", "input"})

_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"', re.DOTALL)
_STRING_TEXT = re.compile(r'"(?:[^"\\]++|\\.)*+"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = [0] * 256
_STEP[ord("[")] = _STEP[ord("{")] = 1
_STEP[ord("]")] = _STEP[ord("}")] = -1
_ESCAPE = re.compile(r"\\(?:u([0-9a-fA-F]{4})|.)", re.DOTALL)  # escapes, read left to right
# What may be a number numeric cannot store: an exponent of 1000 or more, or 15000 digits in a row
# (with an exponent below 1000, fewer digits stay within both of numeric's bounds). Strings may
# match too: numeric_text_fits then looks at the numbers themselves.
SUSPECT_NUMBER = re.compile(r"[eE][+-]?0*[1-9][0-9]{3}|(?<![0-9.])[0-9.]{15000}")
_NUMBER_TOKEN = re.compile(r"-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_NUMBER_PARTS = re.compile(r"-?([0-9]+)(?:\.([0-9]+))?(?:[eE]([+-]?)([0-9]+))?")


class HugeInt(Decimal):
    """A JSON integer of more than 4300 digits (Python's int() refuses to read it)."""

    __slots__ = ()


def load_json(value: bytes) -> Any:
    """Any JSON value, numbers exact (see ANY_JSON), integers of any length (HugeInt beyond 4300 digits).

    Raises:
        msgspec.DecodeError: The value is not JSON (or not UTF-8).
    """
    try:
        return ANY_JSON.decode(value)
    except msgspec.ValidationError:  # an integer of more than 4300 digits somewhere
        pass
    except UnicodeDecodeError as e:
        raise msgspec.DecodeError(str(e)) from None
    # Rare: Python's json reads it, with the same grammar (strict, no NaN), but it takes unpaired
    # surrogates, which msgspec refuses.
    try:
        text = value.decode()
        if unpaired_surrogate(text):
            raise ValueError("invalid utf-16 surrogate pair")
        return json.loads(text, parse_int=read_integer, parse_float=read_decimal, parse_constant=_constant)
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise msgspec.DecodeError(str(e)) from None


def read_integer(text: str) -> int | HugeInt:
    """A JSON integer's value: an int, or a HugeInt beyond the 4300 digits int() reads."""
    return int(text) if len(text) <= _INT_DIGITS else HugeInt(text)


def _constant(text: str) -> Any:
    raise ValueError(f"{text} is not JSON")


def nesting_depth(value: bytes) -> int:
    """How deep JSON text nests arrays and objects (brackets inside strings do not count)."""
    brackets = _STRING.sub(b"", value).translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def too_deep(value: bytes) -> bool:
    """Whether JSON text nests deeper than MAX_DEPTH (cheap unless it holds more brackets than that)."""
    return (
        len(value) > MAX_DEPTH
        and value.count(b"[") + value.count(b"{") > MAX_DEPTH
        and nesting_depth(value) > MAX_DEPTH
    )


def check_depth(value: bytes, what: str) -> None:
    """Reject (`out_of_range`) JSON text nested deeper than MAX_DEPTH; `what` names it."""
    if too_deep(value):
        raise InvalidEvent(
            "out_of_range", f"{what} is nested {nesting_depth(value)} deep, over the {MAX_DEPTH} levels decoding reads"
        )


def unpaired_surrogate(text: str) -> str | None:
    r"""The first escape of an unpaired UTF-16 surrogate in JSON text (`\ud800`), or None."""
    if "\\u" not in text:
        return None
    high, high_end = None, -1  # a high surrogate waiting for its low half, right after it
    for escape in _ESCAPE.finditer(text):
        hex_digits = escape.group(1)
        code = int(hex_digits, 16) if hex_digits else -1
        if high is not None:
            if escape.start() != high_end or not 0xDC00 <= code <= 0xDFFF:
                return high
            high = None
        elif 0xD800 <= code <= 0xDBFF:
            high, high_end = escape.group(), escape.end()
        elif 0xDC00 <= code <= 0xDFFF:
            return escape.group()
    return high


def surrogate_rejection(value: bytes, what: str) -> InvalidEvent | None:
    """The rejection of JSON text that msgspec refused for an unpaired surrogate, if that is why."""
    if b"\\u" not in value:
        return None
    escape = unpaired_surrogate(value.decode(errors="replace"))
    if escape is None:
        return None
    return InvalidEvent(
        "invalid_text", f"{what} holds {escape}, an unpaired UTF-16 surrogate: not Unicode text, nor storable"
    )


def numeric_text_fits(number: str) -> bool:
    """Whether PostgreSQL's numeric input takes this JSON number, as written.

    Its bounds: at most 131072 digits before the decimal point, and a display scale (digits after
    the point as written, less the exponent: `1.0e-16383` has 16384) of at most 16383, zero
    included; any exponent of 2^30 - 1 or more in magnitude fails before that.
    """
    match = _NUMBER_PARTS.fullmatch(number)
    if match is None:
        return False
    whole, fraction, sign, exponent_digits = match.groups()
    fraction = fraction or ""
    exponent = 0
    if exponent_digits:
        significant = exponent_digits.lstrip("0")
        if len(significant) > 10:
            return False
        exponent = int(significant or "0") * (-1 if sign == "-" else 1)
        if not -NUMERIC_EXPONENT_LIMIT < exponent < NUMERIC_EXPONENT_LIMIT:
            return False
    if len(fraction) - exponent > NUMERIC_FRACTION_DIGITS:
        return False
    digits = whole + fraction
    first = len(digits) - len(digits.lstrip("0"))  # position of the first significant digit
    return first == len(digits) or len(whole) - first + exponent <= NUMERIC_WHOLE_DIGITS


def jsonb_rejection(name: str, text: str, range_reason: str) -> InvalidEvent | None:
    """Why PostgreSQL's jsonb input would refuse this JSON text (valid JSON), or None when it takes it."""
    if "\\u0000" in text:
        for escape in _ESCAPE.finditer(text):
            if escape.group(1) == "0000":
                return InvalidEvent(
                    "invalid_text", f"{name} holds \\u0000; jsonb strings are text, which cannot hold NUL"
                )
    if SUSPECT_NUMBER.search(text):
        for number in _NUMBER_TOKEN.finditer(_STRING_TEXT.sub('""', text)):
            if not numeric_text_fits(number.group()):
                shown = number.group() if len(number.group()) <= 40 else number.group()[:40] + "..."
                return InvalidEvent(
                    range_reason,
                    f"{name} holds the number {shown}, out of range for numeric "
                    f"({NUMERIC_WHOLE_DIGITS} digits before the point, {NUMERIC_FRACTION_DIGITS} after)",
                )
    return None
