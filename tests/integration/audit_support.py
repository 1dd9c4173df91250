"""The audit log's integration tests' helpers: writers and pullers as processes, events, rows and documents."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import orjson
from elasticsearch import helpers

from pipelines.audit.events import AuditEvent
from pipelines.audit.puller import CtidPuller
from pipelines.audit.writer import AuditSink, CopyRow, encode_row
from pipelines.settings import AuditSettings, PostgresSettings
from tests.integration.conftest import pipeline_env

WORDS = [
    "login",
    "logout",
    "failed",
    "password",
    "reset",
    "token",
    "granted",
    "denied",
    "admin",
    "export",
    "delete",
    "upload",
]


def audit_env(stack, log: AuditSettings, role: str, **overrides: str) -> dict[str, str]:
    return pipeline_env(
        stack,
        PGUSER=role,
        AUDIT_SCHEMA=log.schema_name,
        AUDIT_INDEX_PREFIX=log.index_prefix,
        AUDIT_RETENTION_INTERVAL_S="0",
        **overrides,
    )


def start_writer(stack, log: AuditSettings, topic: str, group: str) -> subprocess.Popen:
    env = audit_env(stack, log, "sv_writer", PIPELINE_BATCH_MAX="500", PIPELINE_BATCH_WAIT_MS="20")
    return subprocess.Popen(
        [sys.executable, "-m", "pipelines.audit.writer", "--topic", topic, "--group", group],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def start_puller(stack, log: AuditSettings, logs: Path | None = None) -> subprocess.Popen:
    """A puller process; its JSON log lines appended to `logs` when given."""
    env = audit_env(stack, log, "sv_indexer", AUDIT_PULL_BLOCKS="8")  # small chunks: many checkpoints
    with open(logs or os.devnull, "a") as stderr:
        return subprocess.Popen(
            [sys.executable, "-m", "pipelines.audit.puller"], env=env, stdout=subprocess.DEVNULL, stderr=stderr
        )


def event(uid: int, ts: datetime, rng: random.Random, **extra: str) -> bytes:
    content = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 60)))
    return orjson.dumps({"uid": uid, "ts": ts.isoformat(), "content": content, **extra})


def rows_in_postgres(pg, log: AuditSettings) -> set[str]:
    """Every row of the log as its document id: `<schema>.<table>:<block>:<offset>`."""
    with pg("sv_reader") as conn:
        rows = conn.execute(
            "SELECT tableoid::regclass::text, audit.block_of(ctid), (ctid::text::point)[1]::int"
            f" FROM {log.schema_name}.events"
        ).fetchall()
    return {f"{table}:{block}:{offset}" for table, block, offset in rows}


def ids_in_elasticsearch(es, log: AuditSettings) -> list[str]:
    index = f"{log.index_prefix}-*"
    es.indices.refresh(index=index, allow_no_indices=True)
    return [hit["_id"] for hit in helpers.scan(es, index=index, query={"query": {"match_all": {}}}, _source=False)]


def pull_until_caught_up(puller: CtidPuller) -> None:
    while puller.pull_once():
        pass


def in_process_puller(pg_settings: PostgresSettings, es, log: AuditSettings) -> CtidPuller:
    return CtidPuller(pg_settings.conninfo(user="sv_indexer"), es, log)


def write(pg, log: AuditSettings, events: list[tuple[int, AuditEvent]]) -> None:
    """One writer batch, committed, as the audit pipeline writes it (without Kafka)."""
    with pg("sv_writer") as conn, conn.transaction():
        AuditSink(log.schema_name).apply(conn, encoded(events))


def encoded(events: list[tuple[int, AuditEvent]]) -> list[tuple[int, CopyRow]]:
    """(shard, event) pairs as the pipeline's decoder hands them to the sink."""
    return [(shard, encode_row(event)) for shard, event in events]


def events_at(day: date, n: int, uid: int = 7, shard: int = 0) -> list[tuple[int, AuditEvent]]:
    start = datetime(day.year, day.month, day.day, 12, tzinfo=UTC)
    return [(shard, AuditEvent.at(uid, start + timedelta(seconds=i), f"event {i} " + "x" * 500)) for i in range(n)]


# --- Writing -----------------------------------------------------------------------------------------
