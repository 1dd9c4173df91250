"""Decoding Debezium change events of the `app.likes` and `app.follows` tables into stream changes.

The connector (connectors/app-social.json) writes schemaless JSON envelopes to `cdc.app.likes` and
`cdc.app.follows`: `{"before": ..., "after": ..., "op": ..., "source": {...}, "ts_ms": ...}`.

- `c` (insert) and `r` (a snapshot read) add the row: a like or a follow. A snapshot that overlaps
  what was already streamed adds rows already present, which the stream's set semantics ignore.
- `d` (delete) removes it. With REPLICA IDENTITY DEFAULT, `before` carries only the key columns,
  which is all a removal needs: the stream state holds the rest.
- `u` (update of a non-key column) re-adds a present row: nothing changes. A change of the key
  arrives from Debezium as a delete followed by an insert.
- A null value (tombstone) carries nothing to apply. A truncate cannot be expressed as per-row
  changes and goes to the dead-letter topic, like any malformed event.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pipelines.events import (
    DELETE,
    INSERT,
    Change,
    InvalidEvent,
    from_epoch_ms,
    load_object,
    parse_rfc3339,
    read_id,
)

# Debezium envelopes carry source metadata and both row images: larger than a contract event.
MAX_CHANGE_EVENT_BYTES = 64 * 1024
OPS = {"c": INSERT, "r": INSERT, "u": INSERT, "d": DELETE}


def _created_at(row: dict[str, Any], event: dict[str, Any], timestamp_ms: int) -> datetime:
    created = row.get("created_at")
    if type(created) is str:
        return parse_rfc3339(created)
    # A delete's row image has only the key: the commit time stands in (the stream keeps the stored value).
    source = event.get("source")
    committed = source.get("ts_ms") if isinstance(source, dict) else None
    return from_epoch_ms(committed if type(committed) is int else timestamp_ms, "commit time")


def _decoder(first: str, second: str):
    def decode(key: bytes | None, value: bytes | None, timestamp_ms: int) -> Change | None:
        if not value:
            return None
        event = load_object(value, MAX_CHANGE_EVENT_BYTES)
        op = OPS.get(event.get("op"))
        if op is None:
            raise InvalidEvent("unknown_action", f"change op {event.get('op')!r} cannot be applied row by row")
        row = event.get("before" if op == DELETE else "after")
        if type(row) is not dict:
            raise InvalidEvent(
                "missing_field", f"op {event['op']!r} needs the {'before' if op == DELETE else 'after'} row"
            )
        return Change(op, (read_id(row, first), read_id(row, second), _created_at(row, event, timestamp_ms)))

    return decode


decode_app_like = _decoder("oid", "uid")
decode_app_like.__doc__ = "A change of `app.likes` as a change of the `likes` stream (oid, uid, ts)."
decode_app_follow = _decoder("uid", "target")
decode_app_follow.__doc__ = "A change of `app.follows` as a change of the `follows` stream (uid, target, ts)."
