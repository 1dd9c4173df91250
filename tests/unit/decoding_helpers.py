"""What the stream decoding tests share: declaring a stream, decoding one value, a record."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest

from pipelines.cv.decoding.stream_decoder import StreamDecoder
from pipelines.cv.frontend.statements import NO_SCOPE, parse
from pipelines.cv.model import StreamDef
from pipelines.runtime.events import DETAIL_LIMIT, InvalidEvent

KAFKA_TS_MS = 1_795_341_600_123  # 2026-11-22T10:00:00.123Z
KAFKA_TS = datetime(2026, 11, 22, 10, 0, 0, 123000, tzinfo=UTC)


def stream(columns: str, options: str = "", name: str = "s") -> StreamDef:
    return parse(f"CREATE STREAM {name} ({columns})" + (f" WITH ({options})" if options else ""), NO_SCOPE)


def decoder(columns: str, options: str = "", output: list[str] | None = None) -> StreamDecoder:
    return StreamDecoder(stream(columns, options), output)


def encoded(value: Any) -> bytes | None:
    return value if value is None or isinstance(value, bytes) else orjson.dumps(value)


def values(dec: StreamDecoder, value: Any, key: bytes | None = None, ts: int = KAFKA_TS_MS) -> tuple:
    decoded = dec.decode(key, encoded(value), ts)
    assert decoded is not None
    return decoded[1]


def one(dec: StreamDecoder, value: Any, **kwargs: Any) -> Any:
    (result,) = values(dec, value, **kwargs)
    return result


def rejection(dec: StreamDecoder, value: Any, key: bytes | None = None, ts: int = KAFKA_TS_MS) -> InvalidEvent:
    with pytest.raises(InvalidEvent) as caught:
        dec.decode(key, encoded(value), ts)
    assert caught.value.detail
    assert len(caught.value.detail) <= DETAIL_LIMIT
    return caught.value


class Record:
    """A Kafka record as confluent_kafka.Message shows it."""

    def __init__(self, value: bytes | None, key: bytes | None = None, ts: int = KAFKA_TS_MS) -> None:
        self._value, self._key, self._ts = value, key, ts

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def timestamp(self) -> tuple[int, int]:
        return (1 if self._ts >= 0 else 0, self._ts)


# A keyed stream whose events say add/put or remove in their `op` field.
ACTIONS = "a int NOT NULL", "key = 'a', action_field = 'op', insert_actions = 'add, put', delete_actions = 'remove'"

# A Debezium stream of an `items` table, feeding the stream `items`.
DEBEZIUM = (
    "id bigint NOT NULL CHECK (id > 0), name text, at timestamptz NOT NULL",
    "format = 'debezium', into = 'items', timestamp_column = 'at'",
)
COMMITTED_MS = 1_700_000_000_000
COMMITTED = datetime.fromtimestamp(COMMITTED_MS / 1000, UTC)


def change(op: str, before: Any = None, after: Any = None, **envelope: Any) -> bytes:
    event = {"before": before, "after": after, "op": op, "source": {"ts_ms": COMMITTED_MS}, "ts_ms": 1, **envelope}
    return json.dumps(event).encode()


DEBEZIUM_DECODER = decoder(*DEBEZIUM)
