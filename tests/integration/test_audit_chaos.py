"""The audit log under chaos: exactly one document per row, whatever is killed or restarted meanwhile.

Producers run while the writer is killed, a batch aborts and VACUUM frees its space, the puller is
killed and Elasticsearch is restarted (tests/integration/audit_support.py holds the processes and
readers it shares with test_audit.py).
"""

from __future__ import annotations

import random
import signal
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
from confluent_kafka import Producer

from stack.supervisor import Supervisor
from tests.integration.audit_support import (
    WORDS,
    event,
    ids_in_elasticsearch,
    rows_in_postgres,
    start_puller,
    start_writer,
)
from tests.integration.conftest import unique, wait_for
from tests.integration.processes import stop_process


def test_chaos_leaves_exactly_one_document_per_row(stack, pg, es, kafka, topic_factory, audit_log, tmp_path):
    """Producers, a killed writer, an aborted batch with vacuum, a killed puller, Elasticsearch restarted."""
    topic = topic_factory("audit", partitions=3)
    group = unique("audit")
    supervisor = Supervisor(stack.paths)
    puller_logs = tmp_path / "puller.log"  # every puller's JSON lines, one after another
    writer = start_writer(stack, audit_log, topic, group)
    puller = start_puller(stack, audit_log, puller_logs)
    stop_producing = threading.Event()
    produced = []

    def produce(seed: int) -> None:
        rng = random.Random(seed)
        producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "linger.ms": 5})
        n = 0
        while not stop_producing.is_set():
            for _ in range(20):
                uid = rng.randint(1, 60)
                ts = datetime.now(UTC) - timedelta(days=rng.choice((0, 0, 0, 1)))
                producer.produce(topic, key=str(uid), value=event(uid, ts, rng, action=rng.choice(WORDS)))
                n += 1
            producer.poll(0)
            stop_producing.wait(0.1)  # a steady trickle until told to stop
        producer.flush(30)
        produced.append(n)

    producers = [threading.Thread(target=produce, args=(seed,)) for seed in range(3)]
    for thread in producers:
        thread.start()
    running = {"writer": writer, "puller": puller}

    def restart(name: str) -> None:
        stop_process(running[name], signal.SIGKILL)  # no chance to finish anything
        running[name] = (
            start_writer(stack, audit_log, topic, group)
            if name == "writer"
            else start_puller(stack, audit_log, puller_logs)
        )

    def rows_and_documents() -> tuple[int, int]:
        return len(rows_in_postgres(pg, audit_log)), len(ids_in_elasticsearch(es, audit_log))

    def elasticsearch_back() -> None:
        supervisor.start("elasticsearch")  # nothing when it is up
        wait_for(lambda: _es_healthy(es), timeout=180, what="Elasticsearch back")

    try:
        try:
            wait_for(lambda: len(rows_in_postgres(pg, audit_log)) > 1_000, timeout=60, what="first rows")
            restart("writer")  # its batch in flight aborts

            with pg("sv_owner") as conn:
                table = conn.execute(
                    "SELECT table_name FROM audit.tables WHERE log_schema = %s ORDER BY rows DESC LIMIT 1",
                    (audit_log.schema_name,),
                ).fetchone()[0]
            with pg("sv_writer") as conn, conn.transaction():  # an aborted batch, then vacuum frees its space
                conn.execute(
                    f"INSERT INTO {table} (shard, ts, uid, content)"
                    f" SELECT shard, ts, uid, content FROM (SELECT * FROM {table} LIMIT 1) r, generate_series(1, 500)"
                )
                raise psycopg.Rollback
            with pg("sv_owner") as conn:  # the aborted rows lie below the table's end
                blocks = conn.execute(
                    "SELECT pg_relation_size(%s::regclass) / current_setting('block_size')::int", (table,)
                ).fetchone()[0]
            restart("puller")
            wait_for(  # the space vacuum frees is then behind the checkpoint when later batches reuse it
                lambda: pulled_past(pg, table, blocks), what="the new puller to index past the aborted batch"
            )
            with pg("sv_owner", autocommit=True) as conn:
                conn.execute(f"VACUUM {table}")

            retried, rows = retries_logged(puller_logs), len(rows_in_postgres(pg, audit_log))
            supervisor.stop("elasticsearch")
            wait_for(
                lambda: retries_logged(puller_logs) > retried and len(rows_in_postgres(pg, audit_log)) > rows + 100,
                what="writes to go on while the puller backs off and retries",
            )
            restart("puller")
            elasticsearch_back()
            rows, documents = rows_and_documents()
            wait_for(  # with producers still running: the puller resumed, it did not only drain a backlog
                lambda: all(now > then for now, then in zip(rows_and_documents(), (rows, documents), strict=True)),
                what="events written and indexed after Elasticsearch came back",
            )
        finally:
            elasticsearch_back()
            stop_producing.set()
            for thread in producers:
                thread.join(60)
        total = sum(produced)
        wait_for(lambda: len(rows_in_postgres(pg, audit_log)) == total, timeout=120, what="every event in PostgreSQL")
        expected = rows_in_postgres(pg, audit_log)
        wait_for(
            lambda: len(ids_in_elasticsearch(es, audit_log)) >= len(expected),
            timeout=120,
            what="the puller catching up",
        )
    finally:
        for process in running.values():
            stop_process(process)

    ids = ids_in_elasticsearch(es, audit_log)
    assert len(ids) == len(set(ids)), "a row was indexed twice"
    assert set(ids) == expected


def pulled_past(pg, table: str, block: int) -> bool:
    """Whether the puller's checkpoint of `table` is at or past `block`."""
    with pg("sv_owner") as conn:
        row = conn.execute("SELECT next_block FROM audit.pull_checkpoints WHERE table_name = %s", (table,)).fetchone()
    return row is not None and row[0] >= block


def retries_logged(logs: Path) -> int:
    """How often the pullers logged a retry (a failed pass, an unacknowledged bulk, templates not yet applied)."""
    return logs.read_text().count('; retrying"') if logs.exists() else 0


def _es_healthy(es) -> bool:
    try:
        return es.cluster.health(timeout="1s")["status"] in ("yellow", "green")
    except Exception:
        return False
