"""Decode and validate the Kafka events of the contracts `likes`, `follows` and `audit`.

This runs once per event, so it is plain checks on what `orjson` returns (a few µs per event), not a
validation library. Nothing is coerced or guessed: an event that breaks its contract raises
`InvalidEvent` with a stable `reason` code, and the pipeline sends it to the dead-letter topic and
counts it, so what reaches PostgreSQL is exactly what the producer meant.

The contracts (users rely on them; change them only with a new topic):

- `likes`, keyed by the object id as text (`b"42"`):
  `{"oid": int64, "uid": int64, "ts": RFC 3339 | epoch ms, "action": "like" | "unlike"}`
- `follows`, keyed by the follower id as text:
  `{"uid": int64, "target": int64, "ts": RFC 3339 | epoch ms, "action": "follow" | "unfollow"}`

- `audit`, keyed by the user id as text:
  `{"uid": int64, "ts": RFC 3339 | epoch ms, "content": string}` plus optional string fields (`action`,
  `source`, `ip`, ...) kept as they are.

`action` defaults to the insert (`like`, `follow`) and `ts` to the Kafka record timestamp when the
field is absent; a JSON `null` is not absent, it is the wrong type.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

import orjson

from pipelines.errors import StreamviewsError

INSERT, DELETE = 1, -1

MAX_EVENT_BYTES = 4096
MAX_ID = 2**63 - 1  # PostgreSQL bigint; ids start at 1.

# Every `InvalidEvent.reason`, e.g. to create metric labels up front.
REASONS = (
    "oversized",
    "empty",
    "malformed_json",
    "missing_field",
    "wrong_type",
    "unknown_field",
    "unknown_action",
    "id_out_of_range",
    "bad_timestamp",
    "key_mismatch",
    "self_follow",
    "invalid_text",
    "ts_out_of_range",
)

DETAIL_LIMIT = 200

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MAX_EPOCH_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z, the last millisecond `datetime` holds.
# Below 2**32 s (year 2106) `ms / 1000` is a double close enough to round back to the exact millisecond,
# and `fromtimestamp` is twice as fast as adding a timedelta; beyond it only the integer path is exact.
_FLOAT_EXACT_MS = 2**32 * 1000

# The separators of an RFC 3339 date-time, every third character from the fifth:
# "2026-11-22T10:00:00.123+02:00"[4:20:3] == "--T::." (the last one opens the fraction or the offset).
_SHAPES = frozenset(f"--{sep}::{after}" for sep in "Tt " for after in "Z+-.")

_LIKE_FIELDS = frozenset(("oid", "uid", "ts", "action"))
_FOLLOW_FIELDS = frozenset(("uid", "target", "ts", "action"))
_LIKE_ACTIONS = {"like": INSERT, "unlike": DELETE}
_FOLLOW_ACTIONS = {"follow": INSERT, "unfollow": DELETE}


# Audit events: the content is free text, so they may be larger; extras are bounded in number and
# size, named like SQL identifiers (no dots: Elasticsearch would read them as object paths), and
# may not take the names of the document's own metadata.
MAX_AUDIT_BYTES = 65_536
MAX_AUDIT_EXTRAS = 32
MAX_EXTRA_CHARS = 1024
_AUDIT_REQUIRED = ("uid", "content")
_AUDIT_RESERVED = frozenset(("uid", "ts", "content", "pg_table", "pg_ctid", "index_error", "shard", "fields"))
_EXTRA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_CHECKED_NAMES: set[str] = set()  # optional field names already found valid (bounded)


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


class Change(NamedTuple):
    """One decoded event as a change to a keyed stream: op INSERT (like/follow) or DELETE (unlike/unfollow).

    A named tuple, like AuditEvent below, because it is built for every event.

    Attributes:
        op: `INSERT` or `DELETE`, so that aggregates can add `op` rather than branch on the action.
        values: The stream's columns in order: likes `(oid, uid, ts)`, follows `(uid, target, ts)`;
            `ts` is a timezone-aware UTC datetime.
    """

    op: int
    values: tuple[int, int, datetime]


def decode_like(key: bytes | None, value: bytes | None, timestamp_ms: int) -> Change:
    """Decode one record of the `likes` topic into `(oid, uid, ts)`.

    Args:
        key: The record key, which must be `str(oid)`: it routes every event of an object to one
            partition, which keeps like/unlike of a pair in order and gives each row one writer.
        value: The record value, a JSON object.
        timestamp_ms: The Kafka record timestamp, used when the event has no `ts`.

    Returns:
        The change, `INSERT` for "like" (the default) and `DELETE` for "unlike".

    Raises:
        InvalidEvent: The record breaks the contract; `reason` says how.
    """
    event = _load(value, _LIKE_FIELDS, "likes")
    oid = read_id(event, "oid")
    uid = read_id(event, "uid")
    _check_key(key, "oid", oid)
    op = _op(event, _LIKE_ACTIONS, "like")
    return Change(op, (oid, uid, _timestamp(event, timestamp_ms)))


def decode_follow(key: bytes | None, value: bytes | None, timestamp_ms: int) -> Change:
    """Decode one record of the `follows` topic into `(uid, target, ts)`.

    Args:
        key: The record key, which must be `str(uid)`, the follower: one partition per follower keeps
            follow/unfollow of a pair in order and gives each row one writer.
        value: The record value, a JSON object.
        timestamp_ms: The Kafka record timestamp, used when the event has no `ts`.

    Returns:
        The change, `INSERT` for "follow" (the default) and `DELETE` for "unfollow".

    Raises:
        InvalidEvent: The record breaks the contract; `reason` says how.
    """
    event = _load(value, _FOLLOW_FIELDS, "follows")
    uid = read_id(event, "uid")
    target = read_id(event, "target")
    _check_key(key, "uid", uid)
    if uid == target:
        raise InvalidEvent("self_follow", f"uid and target are both {uid}")
    op = _op(event, _FOLLOW_ACTIONS, "follow")
    return Change(op, (uid, target, _timestamp(event, timestamp_ms)))


class AuditEvent(NamedTuple):
    """One audit event: who, when, what, and its optional string fields (None when it has none).

    The time is kept as integer microseconds since 1970-01-01 UTC: the writer groups by day and
    sends it to PostgreSQL as an integer, and building a datetime per event would cost as much as
    parsing its JSON. A named tuple rather than a frozen dataclass: as immutable, and built in a
    quarter of the time (a frozen dataclass sets each field through `object.__setattr__`), which
    was a quarter of the writer's decoding.
    """

    uid: int
    micros: int
    content: str
    fields: dict[str, str] | None

    @classmethod
    def at(cls, uid: int, ts: datetime, content: str, fields: dict[str, str] | None = None) -> AuditEvent:
        """An event at a timezone-aware datetime."""
        return cls(uid, _micros(ts), content, fields)

    @property
    def ts(self) -> datetime:
        """The time as a UTC datetime."""
        return _EPOCH + timedelta(microseconds=self.micros)

    @property
    def day(self) -> int:
        """The UTC day, as days since 1970-01-01."""
        return self.micros // _MICROS_PER_DAY


_MICROS_PER_DAY = 86_400_000_000


def _micros(ts: datetime) -> int:
    since = ts - _EPOCH
    return (since.days * 86_400 + since.seconds) * 1_000_000 + since.microseconds


class AuditDecoder:
    """Decodes the `audit` topic, rejecting timestamps outside the window the tables keep.

    Args:
        max_age: Events older than this are past retention: storing them would recreate a dropped
            day's table. They go to the dead-letter topic instead (`ts_out_of_range`).
        max_ahead: Events further in the future than this are a producer's clock or unit error
            (seconds for milliseconds), not tomorrow's audit.
    """

    def __init__(self, max_age: timedelta, max_ahead: timedelta = timedelta(days=1)) -> None:
        self.max_age, self.max_ahead = max_age, max_ahead
        self._window = (0, 0)
        self._window_until = 0.0

    def __call__(self, key: bytes | None, value: bytes | None, timestamp_ms: int) -> AuditEvent:
        """Decode one record (see `decode_audit`) and check its timestamp against now."""
        event = decode_audit(key, value, timestamp_ms)
        low, high = self._current_window()
        if not low <= event.micros <= high:
            raise InvalidEvent(
                "ts_out_of_range",
                f"ts {event.ts.isoformat()} is outside the kept window ({self.max_age.days} days back, "
                f"{self.max_ahead} ahead)",
            )
        return event

    def _current_window(self) -> tuple[int, int]:
        # Recomputed once a second: a second's slack on a window of days, for a clock read per event saved.
        if time.monotonic() >= self._window_until:
            now = datetime.now(UTC)
            self._window = (_micros(now - self.max_age), _micros(now + self.max_ahead))
            self._window_until = time.monotonic() + 1.0
        return self._window


def decode_audit(key: bytes | None, value: bytes | None, timestamp_ms: int) -> AuditEvent:
    """Decode one record of the `audit` topic.

    Args:
        key: The record key, which must be `str(uid)`: it routes a user's events to one partition,
            and so to one writer and one shard's tables.
        value: The record value, a JSON object of at most `MAX_AUDIT_BYTES`.
        timestamp_ms: The Kafka record timestamp, used when the event has no `ts`.

    Returns:
        The event; `fields` holds the optional string fields, None when there are none.

    Raises:
        InvalidEvent: The record breaks the contract; `reason` says how.
    """
    if not value:
        raise InvalidEvent("empty", "value is empty" if value is not None else "value is null (a tombstone?)")
    event = load_object(value, MAX_AUDIT_BYTES)
    uid = read_id(event, "uid")
    _check_key(key, "uid", uid)
    content = event.get("content")
    if type(content) is not str:
        if content is None and "content" not in event:
            raise InvalidEvent("missing_field", "content is missing")
        raise InvalidEvent("wrong_type", f"content must be a JSON string, got {_json(content)}")
    _check_text("content", content)
    micros = _timestamp_micros(event, timestamp_ms)
    fields = _audit_extras(event) if len(event) > len(_AUDIT_REQUIRED) + ("ts" in event) else None
    return AuditEvent(uid, micros, content, fields)


def _audit_extras(event: dict[str, Any]) -> dict[str, str] | None:
    # Runs for nearly every audit event, so the core fields are deleted from the parsed object (no
    # copy) and the few field names producers use are checked once each, then remembered.
    del event["uid"], event["content"]
    event.pop("ts", None)
    if len(event) > MAX_AUDIT_EXTRAS:
        raise InvalidEvent("unknown_field", f"{len(event)} optional fields, at most {MAX_AUDIT_EXTRAS}")
    for name, value in event.items():
        if name not in _CHECKED_NAMES:
            if name in _AUDIT_RESERVED or not _EXTRA_NAME.fullmatch(name):
                raise InvalidEvent(
                    "unknown_field",
                    f"field {name[:64]!r}: optional fields are named [a-z_][a-z0-9_]* (max 63) and not "
                    f"{', '.join(sorted(_AUDIT_RESERVED - {'uid', 'ts', 'content'}))}",
                )
            if len(_CHECKED_NAMES) < 4096:
                _CHECKED_NAMES.add(name)
        if type(value) is not str:
            raise InvalidEvent("wrong_type", f"{name} must be a JSON string, got {_json(value)}")
        if len(value) > MAX_EXTRA_CHARS:
            raise InvalidEvent("oversized", f"{name} is {len(value)} characters, over {MAX_EXTRA_CHARS}")
        _check_text(name, value)
    return event or None


def _check_text(name: str, text: str) -> None:
    # PostgreSQL text cannot hold NUL: one such event would fail its whole batch, again and again.
    if "\x00" in text:
        raise InvalidEvent("invalid_text", f"{name} contains a NUL character (\\u0000); PostgreSQL text cannot hold it")


Decoder = Callable[[bytes | None, bytes | None, int], Change]

# By contract name, which is also the topic name.
DECODERS: dict[str, Decoder] = {"likes": decode_like, "follows": decode_follow}


def load_object(value: bytes, limit: int) -> dict[str, Any]:
    """A record value as a JSON object, at most `limit` bytes (checked before parsing)."""
    if len(value) > limit:
        # Before parsing: the limit also bounds the work a hostile record can cause.
        raise InvalidEvent("oversized", f"value is {len(value)} bytes, over the {limit}-byte limit")
    try:
        event = orjson.loads(value)
    except orjson.JSONDecodeError as e:
        raise InvalidEvent("malformed_json", f"value is not JSON: {e}") from None
    if type(event) is not dict:
        raise InvalidEvent("malformed_json", f"value must be a JSON object, got {_json(event)}")
    return event


def _load(value: bytes | None, fields: frozenset[str], contract: str) -> dict[str, Any]:
    if not value:
        raise InvalidEvent("empty", "value is empty" if value is not None else "value is null (a tombstone?)")
    event = load_object(value, MAX_EVENT_BYTES)
    if not fields.issuperset(event):
        unknown = ", ".join(sorted(map(repr, event.keys() - fields)))
        raise InvalidEvent("unknown_field", f"unknown field {unknown}; {contract} has {', '.join(sorted(fields))}")
    return event


def read_id(event: dict[str, Any], name: str) -> int:
    """An id field: a JSON integer in 1 .. 2**63-1 (rejections name the field and the value)."""
    value = event.get(name)
    if type(value) is int and 0 < value <= MAX_ID:
        return value
    if value is None and name not in event:
        raise InvalidEvent("missing_field", f"{name} is missing")
    if type(value) is not int:
        # Also bools (True is an int in Python), floats like 42.0, and strings like "42".
        raise InvalidEvent("wrong_type", f"{name} must be a JSON integer, got {_json(value)}")
    raise InvalidEvent("id_out_of_range", f"{name} must be between 1 and 2**63-1, got {value}")


def _check_key(key: bytes | None, name: str, expected: int) -> None:
    # A wrong key means the event may sit on another partition than the rest of its row's events, so
    # its order relative to them is lost: reject rather than apply it out of order.
    if key != str(expected).encode():
        if key is None:
            raise InvalidEvent("key_mismatch", f"key is missing, must be the {name} as text: {expected}")
        raise InvalidEvent("key_mismatch", f"key {key!r} does not match {name} {expected}")


def _op(event: dict[str, Any], actions: dict[str, int], default: str) -> int:
    action = event.get("action", default)
    if type(action) is not str:
        raise InvalidEvent("wrong_type", f"action must be a JSON string, got {_json(action)}")
    op = actions.get(action)
    if op is None:
        raise InvalidEvent("unknown_action", f"action must be {' or '.join(map(repr, actions))}, got {action!r}")
    return op


def _timestamp(event: dict[str, Any], timestamp_ms: int) -> datetime:
    ts = event.get("ts")
    if type(ts) is str:
        return parse_rfc3339(ts)
    if type(ts) is int:
        return from_epoch_ms(ts, "ts")
    if ts is None and "ts" not in event:
        return from_epoch_ms(timestamp_ms, "ts is missing and the record timestamp")
    raise InvalidEvent("wrong_type", f"ts must be an RFC 3339 string or epoch milliseconds, got {_json(ts)}")


def _timestamp_micros(event: dict[str, Any], timestamp_ms: int) -> int:
    # As _timestamp, without building a datetime for the common epoch-milliseconds case.
    ts = event.get("ts")
    if type(ts) is int and 0 <= ts <= _MAX_EPOCH_MS:
        return ts * 1000
    if ts is None and "ts" not in event and 0 <= timestamp_ms <= _MAX_EPOCH_MS:
        return timestamp_ms * 1000
    return _micros(_timestamp(event, timestamp_ms))  # RFC 3339, or an error with its reason


def from_epoch_ms(ms: int, what: str) -> datetime:
    """Epoch milliseconds as a UTC datetime, exact to the millisecond over 1970 .. 9999."""
    if 0 <= ms < _FLOAT_EXACT_MS:
        return datetime.fromtimestamp(ms / 1000, UTC)
    if 0 <= ms <= _MAX_EPOCH_MS:
        return _EPOCH + timedelta(milliseconds=ms)
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
    if parsed < _EPOCH:
        raise InvalidEvent("bad_timestamp", f"ts {text!r} is before 1970-01-01")
    return parsed


def _json(value: Any) -> str:
    # The offending value as the producer wrote it (`true`, `"42"`, `4.2`), bounded.
    return orjson.dumps(value).decode()[:DETAIL_LIMIT]
