"""What every decoder shares: the rejection of an event, JSON objects, and RFC 3339 / epoch timestamps.

Decoders run once per event, so these are plain checks on what the JSON parser returns, not a
validation library. Nothing is coerced or guessed: an event that breaks its contract raises
`InvalidEvent` with a stable `reason` code, and the pipeline sends it to the dead-letter topic and
counts it, so what reaches PostgreSQL is exactly what the producer meant.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from operator import methodcaller
from typing import Any

import orjson

from pipelines.errors import StreamviewsError

# A change to a keyed stream inserts a row or deletes it; aggregates add the op rather than branch.
INSERT, DELETE = 1, -1

# Every fixed `InvalidEvent.reason`, e.g. to create metric labels up front. A stream's named CHECK
# constraints add their own names (see pipelines.cv.decoding.stream_decoder).
REASONS = (
    "oversized",
    "empty",
    "malformed_json",
    "malformed_csv",
    "missing_field",
    "wrong_type",
    "unknown_field",
    "unknown_action",
    "id_out_of_range",
    "out_of_range",
    "too_long",
    "check_violation",
    "bad_timestamp",
    "bad_date",
    "bad_uuid",
    "key_mismatch",
    "self_follow",
    "invalid_text",
    "ts_out_of_range",
    "duplicate_field",
    # Found while applying, not decoding (pipelines/cv/isolation.py): a view's SQL, or the stream's
    # own state, failed on this record alone; the detail names which and PostgreSQL's SQLSTATE.
    "view_error",
    "apply_error",
)

DETAIL_LIMIT = 200

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MAX_EPOCH_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z, the last millisecond `datetime` holds.
# Below 2**32 s (year 2106) `ms / 1000` is a double close enough to round back to the exact millisecond,
# and `fromtimestamp` is twice as fast as adding a timedelta; beyond it only the integer path is exact.
_FLOAT_EXACT_MS = 2**32 * 1000

# The separators of an RFC 3339 date-time, every third character from the fifth:
# "2026-11-22T10:00:00.123+02:00"[4:20:3] == "--T::." (the last one opens the fraction or the offset).
_SHAPES = frozenset(f"--{sep}::{after}" for sep in "Tt " for after in "Z+-.")


class InvalidEvent(StreamviewsError):
    """An event that breaks its contract: never retried, it goes to the dead-letter topic.

    Attributes:
        reason: Short stable code (one of `REASONS`) for the dead-letter header and the metric label.
        detail: Human message naming the field and the offending value, at most `DETAIL_LIMIT` chars so
            that a hostile payload cannot bloat headers and logs.
    """

    def __init__(self, reason: str, detail: str) -> None:
        if len(detail) > DETAIL_LIMIT:
            detail = detail[: DETAIL_LIMIT - 3] + "..."
        super().__init__(reason, detail)
        self.reason = reason
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.reason}: {self.detail}"


def load_object(value: bytes, limit: int, repeated: RepeatedFields | None = None) -> dict[str, Any]:
    """A record value as a JSON object, at most `limit` bytes (checked before parsing).

    `repeated`: the fields that must not be given twice.
    """
    if len(value) > limit:
        # Before parsing: the limit also bounds the work a hostile record can cause.
        raise InvalidEvent("oversized", f"value is {len(value)} bytes, over the {limit}-byte limit")
    try:
        event = orjson.loads(value)
    except orjson.JSONDecodeError as e:
        raise InvalidEvent("malformed_json", f"value is not JSON: {e}") from None
    if type(event) is not dict:
        raise InvalidEvent("malformed_json", f"value must be a JSON object, got {json_text(event)}")
    if repeated is not None:
        repeated(value)
    return event


# --- a field given twice --------------------------------------------------------------------------------
# JSON parsers keep the last of a key given twice, so {"action": "unlike", "action": "like"} would be
# applied as a like. A field that matters (a column, the action field) given twice is rejected. The
# exact check parses again, so it runs only on the records a cheap test cannot clear: a watched key
# written out twice (`"uid"` appearing twice anywhere), or any escape (an escaped key can hide a name).


def quoted_names(names: Iterable[str]) -> tuple[bytes, ...]:
    """The names as they appear in compact JSON text, quoted: what `may_repeat` looks for."""
    return tuple(json.dumps(n).encode() for n in names)


def may_repeat(value: bytes, quoted: Sequence[bytes]) -> bool:
    """False only when no watched key can be given twice: each written at most once, and no escape."""
    return b"\\" in value or any(value.count(q) > 1 for q in quoted)


def repeat_suspects(values: Sequence[bytes], quoted: Sequence[bytes], holding: Sequence[int]) -> set[int]:
    """The positions of the values `may_repeat` does not clear, looked for a whole batch at a time.

    `holding[i]`: how many values surely hold watched key i (a parser found a value for it there).
    When the name is written no more often than that in the whole batch, each of those holds it
    exactly once and the others not at all: the batch is cleared with one count in C. Only a batch
    where they differ (explicit nulls, a name inside a string, a repeat) is looked at value by value.
    """
    joined = b"\x00".join(values)
    suspects: set[int] = set()
    if b"\\" in joined:
        suspects.update(p for p, v in enumerate(values) if b"\\" in v)
    for name, held in zip(quoted, holding, strict=True):
        if joined.count(name) <= held:
            continue
        counts = map(methodcaller("count", name), values)
        suspects.update(p for p, c in enumerate(counts) if c > 1)
    return suspects


class RepeatedFields:
    """Rejects a JSON object that gives one of these fields twice (cheap unless it may)."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names = frozenset(names)
        self.quoted = quoted_names(sorted(self.names))

    def __call__(self, value: bytes) -> None:
        """Raise `duplicate_field` when the value gives one of the fields twice."""
        if may_repeat(value, self.quoted):
            reject_repeated(value, self.names)


def reject_repeated(value: bytes, names: frozenset[str]) -> None:
    """Raise `duplicate_field` when the value's top-level object gives one of `names` twice (exact)."""
    objects: list[list[tuple[str, Any]]] = []  # every object, innermost first: the top level comes last
    json.loads(value, object_pairs_hook=lambda pairs: objects.append(pairs) or {})
    seen: set[str] = set()
    for key, _ in objects[-1] if objects else ():
        if key in seen and key in names:
            raise InvalidEvent("duplicate_field", f"field {key!r} is given twice")
        seen.add(key)


def check_text(name: str, text: str) -> None:
    """Reject text PostgreSQL cannot store (a NUL character)."""
    # PostgreSQL text cannot hold NUL: one such event would fail its whole batch, again and again.
    if "\x00" in text:
        raise InvalidEvent("invalid_text", f"{name} contains a NUL character (\\u0000); PostgreSQL text cannot hold it")


def from_epoch_ms(ms: int, what: str) -> datetime:
    """Epoch milliseconds as a UTC datetime, exact to the millisecond over 1970 .. 9999."""
    if 0 <= ms < _FLOAT_EXACT_MS:
        return datetime.fromtimestamp(ms / 1000, UTC)
    if 0 <= ms <= MAX_EPOCH_MS:
        return EPOCH + timedelta(milliseconds=ms)
    raise InvalidEvent("bad_timestamp", f"{what} {ms} is not epoch milliseconds in 1970-01-01 .. 9999-12-31")


def parse_rfc3339(text: str) -> datetime:
    """An RFC 3339 date-time with seconds and an offset, as a UTC datetime."""
    # `fromisoformat` also takes ISO 8601 forms that RFC 3339 excludes (a date alone, no offset, week
    # dates, "+0200", "10:00Z", "20261122T100000Z"); this shape check leaves it only full date-times with
    # seconds and a Z or ±HH:MM offset. It validates the digits and the calendar itself.
    if text[-1:] == "z":
        text = text[:-1] + "Z"  # RFC 3339 allows lower case; `fromisoformat` only "Z".
    if text[4:20:3] not in _SHAPES or not (text[-1] == "Z" or text[-6::3] in ("+:", "-:")):
        raise InvalidEvent("bad_timestamp", f"ts {text!r} is not an RFC 3339 date-time with an offset")
    try:
        parsed = datetime.fromisoformat(text)
        if parsed.tzinfo is not UTC:
            parsed = parsed.astimezone(UTC)
    except (ValueError, OverflowError) as e:
        raise InvalidEvent("bad_timestamp", f"ts {text!r} is not a valid date-time: {e}") from None
    if parsed < EPOCH:
        raise InvalidEvent("bad_timestamp", f"ts {text!r} is before 1970-01-01")
    return parsed


def json_text(value: Any) -> str:
    """The offending value as the producer wrote it (`true`, `"42"`, `4.2`), bounded."""
    # The offending value as the producer wrote it (`true`, `"42"`, `4.2`), bounded.
    return orjson.dumps(value).decode()[:DETAIL_LIMIT]
