"""The `audit` contract: decoding and validating audit events (the writer's own decoder).

`audit`, keyed by the user id as text:
`{"uid": int64, "ts": RFC 3339 | epoch ms, "content": string}` plus optional string fields (`action`,
`source`, `ip`, ...) kept as they are. `ts` defaults to the Kafka record timestamp when absent; a JSON
`null` is not absent, it is the wrong type.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from pipelines.runtime.events import (
    EPOCH,
    MAX_EPOCH_MS,
    InvalidEvent,
    RepeatedFields,
    check_text,
    from_epoch_ms,
    json_text,
    load_object,
    parse_rfc3339,
)

MAX_ID = 2**63 - 1  # PostgreSQL bigint; ids start at 1.

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
_REPEATED = RepeatedFields(("uid", "ts", "content"))  # the contract's fields may not be given twice


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
        return EPOCH + timedelta(microseconds=self.micros)

    @property
    def day(self) -> int:
        """The UTC day, as days since 1970-01-01."""
        return self.micros // _MICROS_PER_DAY


_MICROS_PER_DAY = 86_400_000_000


def _micros(ts: datetime) -> int:
    since = ts - EPOCH
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
    event = load_object(value, MAX_AUDIT_BYTES, _REPEATED)
    uid = read_id(event, "uid")
    _check_key(key, "uid", uid)
    content = event.get("content")
    if type(content) is not str:
        if content is None and "content" not in event:
            raise InvalidEvent("missing_field", "content is missing")
        raise InvalidEvent("wrong_type", f"content must be a JSON string, got {json_text(content)}")
    check_text("content", content)
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
            raise InvalidEvent("wrong_type", f"{name} must be a JSON string, got {json_text(value)}")
        if len(value) > MAX_EXTRA_CHARS:
            raise InvalidEvent("oversized", f"{name} is {len(value)} characters, over {MAX_EXTRA_CHARS}")
        check_text(name, value)
    return event or None


def read_id(event: dict[str, Any], name: str) -> int:
    """An id field: a JSON integer in 1 .. 2**63-1 (rejections name the field and the value)."""
    value = event.get(name)
    if type(value) is int and 0 < value <= MAX_ID:
        return value
    if value is None and name not in event:
        raise InvalidEvent("missing_field", f"{name} is missing")
    if type(value) is not int:
        # Also bools (True is an int in Python), floats like 42.0, and strings like "42".
        raise InvalidEvent("wrong_type", f"{name} must be a JSON integer, got {json_text(value)}")
    raise InvalidEvent("id_out_of_range", f"{name} must be between 1 and 2**63-1, got {value}")


def _check_key(key: bytes | None, name: str, expected: int) -> None:
    # A wrong key means the event may sit on another partition than the rest of its row's events, so
    # its order relative to them is lost: reject rather than apply it out of order.
    if key != str(expected).encode():
        if key is None:
            raise InvalidEvent("key_mismatch", f"key is missing, must be the {name} as text: {expected}")
        raise InvalidEvent("key_mismatch", f"key {key!r} does not match {name} {expected}")


def _timestamp(event: dict[str, Any], timestamp_ms: int) -> datetime:
    ts = event.get("ts")
    if type(ts) is str:
        return parse_rfc3339(ts)
    if type(ts) is int:
        return from_epoch_ms(ts, "ts")
    if ts is None and "ts" not in event:
        return from_epoch_ms(timestamp_ms, "ts is missing and the record timestamp")
    raise InvalidEvent("wrong_type", f"ts must be an RFC 3339 string or epoch milliseconds, got {json_text(ts)}")


def _timestamp_micros(event: dict[str, Any], timestamp_ms: int) -> int:
    # As _timestamp, without building a datetime for the common epoch-milliseconds case.
    ts = event.get("ts")
    if type(ts) is int and 0 <= ts <= MAX_EPOCH_MS:
        return ts * 1000
    if ts is None and "ts" not in event and 0 <= timestamp_ms <= MAX_EPOCH_MS:
        return timestamp_ms * 1000
    return _micros(_timestamp(event, timestamp_ms))  # RFC 3339, or an error with its reason
