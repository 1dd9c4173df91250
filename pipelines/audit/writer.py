"""The audit pipeline: topic `audit` into one PostgreSQL table per shard and UTC day, with COPY.

Run: `python -m pipelines.audit.writer` (supervised by `make up`). A shard is a Kafka partition of `audit`
(events are keyed by user id, so a user's events share one), and a table is `<schema>.shardNN_YYYYMMDD`.
Only the consumer that owns partition NN writes the tables of shard NN, and the checkpoint's lock on
the partition's offset row serialises even a rebalance's old and new owners: every table has a
single writer, its rows arrive in batches that fill the heap in order, and the ctid-block puller
(pipelines/audit/puller.py) can follow it block by block.

Each event is encoded as its binary COPY row as soon as it is decoded, in the consuming thread: the
committing thread, which waits on PostgreSQL, then only joins bytes, so the work that holds the GIL
is not split across two threads that wait for each other. Each batch, in the checkpoint's one
transaction with its Kafka offsets:
1. group the rows by (partition, UTC day of ts);
2. per group, `audit.ensure_table` (created on first use, by a SQL function: no SQL is built from
   event content), `COPY` the rows, and `audit.record_batch`, which records where they landed.
"""

from __future__ import annotations

import argparse
import struct
import sys
from collections import defaultdict
from datetime import date, timedelta

import orjson
import psycopg
from psycopg import sql

from pipelines.audit.events import AuditDecoder, AuditEvent
from pipelines.runtime.checkpoint import ApplyOutcome
from pipelines.runtime.consumer import BatchDecoder, per_record
from pipelines.runtime.single_topic import PipelineSpec, main
from pipelines.settings import AuditSettings

# The shard goes last: it is the table's, so it is appended to rows encoded before their shard is known.
COPY_COLUMNS = ("ts", "uid", "content", "fields", "shard")


# One event as (its UTC day in days since 1970-01-01, its binary COPY row without the trailing shard
# field). A plain tuple: it is built for every event, and a named tuple's constructor is a Python call.
CopyRow = tuple[int, bytes]
# A batch: each event's `CopyRow` with its Kafka partition (its shard), as `per_record` decodes it.
AuditBatch = list[tuple[int, CopyRow]]


class AuditSink:
    """COPYs each batch into the tables of its (shard, day) groups and records the extents written."""

    def __init__(self, log_schema: str) -> None:
        self.log_schema = log_schema
        self._tables: dict[tuple[int, date], str] = {}  # created and committed, as far as we know

    def apply(self, conn: psycopg.Connection, records: AuditBatch, outcome: ApplyOutcome | None = None) -> int:
        """Write the batch of `CopyRow`s: one COPY per (shard, day) table, in key order; returns the rows written.

        Nothing to isolate (`outcome`): the audit decoder admits only rows every table takes, and
        a failure is the database's, retried with the whole batch.
        """
        groups: dict[tuple[int, int], list[bytes]] = defaultdict(list)
        for partition, (day, row) in records:
            groups[(partition, day)].append(row)
        for key in sorted(groups):
            table = self._table(conn, key[0], _EPOCH_DAY + timedelta(days=key[1]))
            rows = groups[key]
            schema, name = table.split(".")
            statement = sql.SQL("COPY {}.{} ({}) FROM STDIN (FORMAT binary)").format(
                sql.Identifier(schema), sql.Identifier(name), sql.SQL(", ").join(map(sql.Identifier, COPY_COLUMNS))
            )
            with conn.cursor().copy(statement) as copy:
                copy.write(copy_rows(key[0], rows))
            conn.execute("SELECT audit.record_batch(%s, %s)", (table, len(rows)))
        return len(records)

    def _table(self, conn: psycopg.Connection, shard: int, day: date) -> str:
        table = self._tables.get((shard, day))
        if table is None:
            table = conn.execute("SELECT audit.ensure_table(%s, %s, %s)", (self.log_schema, shard, day)).fetchone()[0]
            self._tables[(shard, day)] = table
        return table

    def reset(self) -> None:
        """A rolled-back batch may have created tables that no longer exist; retention may drop others."""
        self._tables.clear()

    def housekeeping(self, conn: psycopg.Connection) -> None:
        """Nothing periodic: retention runs in the puller service, which also deletes the documents."""

    def __str__(self) -> str:
        return f"audit tables of schema {self.log_schema}"


# COPY's binary format: no escaping or date formatting on either side, which makes it the cheapest
# way in for Python and for PostgreSQL. A row is a field count, then per field its length (-1: NULL)
# and its bytes: timestamptz as microseconds since 2000-01-01 UTC, bigint, UTF-8 text, jsonb as a
# version byte (1) followed by JSON text, smallint.
COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)
COPY_TRAILER = struct.pack(">h", -1)
_ROW_START = struct.Struct(">hiqiqi")  # fields; ts; uid; the content's length
_JSONB_START = struct.Struct(">ib")  # length, version
_SHARD = struct.Struct(">ih")  # length, smallint
_NULL = struct.pack(">i", -1)
# PostgreSQL counts timestamps from 2000-01-01 UTC, 946,684,800 s after the Unix epoch.
_PG_EPOCH_MICROS = 946_684_800_000_000
_EPOCH_DAY = date(1970, 1, 1)


def encode_row(e: AuditEvent) -> CopyRow:
    """The event's day and COPY row up to its shard (columns as in `COPY_COLUMNS`)."""
    content = e.content.encode()
    start = _ROW_START.pack(len(COPY_COLUMNS), 8, e.micros - _PG_EPOCH_MICROS, 8, e.uid, len(content))
    if e.fields is None:
        return e.day, b"".join((start, content, _NULL))
    fields = orjson.dumps(e.fields)
    return e.day, b"".join((start, content, _JSONB_START.pack(len(fields) + 1, 1), fields))


def copy_rows(shard: int, rows: list[bytes]) -> bytes:
    """One table's rows (the bytes of `CopyRow`s) as a whole binary COPY stream."""
    return COPY_HEADER + copy_body(shard, rows) + COPY_TRAILER


def copy_body(shard: int, rows: list[bytes]) -> bytes:
    """The rows with their shard, without the stream's header and trailer (to send one stream in parts)."""
    if not rows:
        return b""
    shard_field = _SHARD.pack(2, shard)
    return shard_field.join(rows) + shard_field


class CopyRowDecoder:
    """The pipeline's decoder: `AuditDecoder`'s checks, then the event's COPY row (see the module)."""

    def __init__(self, decode: AuditDecoder) -> None:
        self._decode = decode

    def __call__(self, key: bytes | None, value: bytes | None, timestamp_ms: int) -> CopyRow:
        """Decode and check one record (`InvalidEvent` when it breaks the contract), then encode it."""
        return encode_row(self._decode(key, value, timestamp_ms))


def _build(args: argparse.Namespace) -> tuple[BatchDecoder[AuditBatch], AuditSink]:
    settings = AuditSettings()
    decode = AuditDecoder(max_age=timedelta(days=settings.retention_days))
    return per_record(CopyRowDecoder(decode)), AuditSink(settings.schema_name)


PIPELINE: PipelineSpec[AuditBatch] = PipelineSpec(
    "audit",
    "audit",
    "Consume audit events into per-shard, per-day PostgreSQL tables (AUDIT_SCHEMA), with COPY.",
    module="pipelines.audit.writer",
    build=_build,
)

if __name__ == "__main__":
    sys.exit(main(PIPELINE))
