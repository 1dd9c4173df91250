"""The throwaway objects of a benchmark run: a schema of stream and view definitions, topics, a consumer group.

Benchmarks never touch the real streams, views, topics or groups. They create their own under unique
names (`unique_name`) and drop them afterwards, also on failure:

- `throwaway_definitions`: a schema with streams and views defined through the catalog, dropped
  through the catalog so `cv.streams`/`cv.views` keep no trace (`drop_definitions`);
- `create_topic` / `delete_topic`: a bench topic;
- `forget_group`: what a bench pipeline's consumer group leaves outside its schema (offset rows,
  dead-letter rows and topic).

Cleanup steps log their failures and never raise: they must not mask the run's own outcome.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

import psycopg
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic
from psycopg import sql

from loadgen.common.postgres import owner_conninfo
from pipelines.cv import catalog
from pipelines.logs import get_logger
from pipelines.runtime.deadletter import dead_letter_topic
from pipelines.settings import ROLE_READER, ROLE_WRITER, KafkaSettings, PostgresSettings

log = get_logger("loadgen.common.throwaway")


def unique_name(prefix: str, sep: str = "_") -> str:
    """A name no earlier run used, e.g. `bench_3f9a0c1d2e` (schemas) or `bench-likes-...` (topics)."""
    return f"{prefix}{sep}{uuid.uuid4().hex[:10]}"


@contextmanager
def throwaway_definitions(
    schema: str, statements: Iterable[str], streams: Sequence[str], settings: PostgresSettings
) -> Iterator[list[str]]:
    """Create `schema`, define `statements` (streams and views) in it; yield the views' names; drop it all after.

    The schema is owned by `sv_owner` and usable by `sv_writer` and `sv_reader`. Definitions go
    through `catalog.define` (all or nothing) on an autocommit owner connection, as `python -m pipelines.cv
    define` does. Cleanup is `drop_definitions`.
    """
    conninfo = owner_conninfo(settings)
    ident = sql.Identifier(schema)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(ident))
    try:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(
                sql.SQL("GRANT USAGE ON SCHEMA {} TO {}, {}").format(
                    ident, sql.Identifier(ROLE_WRITER), sql.Identifier(ROLE_READER)
                )
            )
            for outcome in catalog.define(conn, ";\n".join(statements)):
                log.info("bench definition", outcome=outcome)
            views = [
                name
                for (name,) in conn.execute(
                    "SELECT name FROM cv.views WHERE stream = ANY(%s) ORDER BY name", (list(streams),)
                )
            ]
        yield views
    finally:
        drop_definitions(schema, streams, settings)


def drop_definitions(schema: str, streams: Sequence[str], settings: PostgresSettings) -> None:
    """Drop every view of `schema` or of `streams`, each of `streams`, then `schema` with CASCADE.

    Views and streams go through the catalog, so `cv.views`/`cv.streams` keep no trace; a failed
    step is logged and the rest still runs. A view read by another is refused until its readers are
    gone, so the views are dropped in passes until a pass drops none.
    """
    ident = sql.Identifier(schema)
    with psycopg.connect(owner_conninfo(settings), autocommit=True) as conn:
        views = conn.execute(
            "SELECT name FROM cv.views WHERE name LIKE %s OR stream = ANY(%s) ORDER BY name",
            (f"{schema}.%", list(streams)),
        ).fetchall()
        pending = [name for (name,) in views]
        while pending:
            refused: dict[str, Exception] = {}
            for name in pending:
                try:
                    catalog.drop(conn, [name], "view")
                except Exception as e:  # read by a view not dropped yet, or a real failure: the next pass tells
                    refused[name] = e
            if len(refused) == len(pending):
                for name, error in refused.items():
                    log.error("could not drop bench view", view=name, error=str(error))
                break
            pending = list(refused)
        for stream in streams:
            if conn.execute("SELECT 1 FROM cv.streams WHERE name = %s", (stream,)).fetchone():
                try:
                    catalog.drop(conn, [stream], "stream")
                except Exception:
                    log.exception("could not drop bench stream", stream=stream)
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(ident))


def create_topic(admin: AdminClient, name: str, partitions: int) -> None:
    """Create a bench topic (the stack never auto-creates topics)."""
    admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])[name].result(30)


def forget_group(owner: str, group: str, topic: str, kafka: KafkaSettings) -> None:
    """Delete what a bench pipeline leaves outside its schema: offset rows, dead-letter topic. Never raises."""
    try:
        with psycopg.connect(owner, autocommit=True) as conn:
            conn.execute("DELETE FROM ops.kafka_offsets WHERE group_id = %s", (group,))
            conn.execute("DELETE FROM ops.dead_letters WHERE group_id = %s", (group,))
    except psycopg.Error:
        log.exception("could not delete the bench group's offset rows", group=group)
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    dlq = dead_letter_topic(topic)
    if dlq in admin.list_topics(timeout=10).topics:
        delete_topic(admin, dlq)


def delete_topic(admin: AdminClient, topic: str) -> None:
    """Delete a bench topic and wait for it; a failure is logged, never raised (it must not mask the run's own).

    A topic that does not exist is already what was wanted (a sink's `.dlq` is made only for a dead letter).
    """
    try:
        admin.delete_topics([topic])[topic].result(30)
    except KafkaException as e:
        if e.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
            log.warning("could not delete a bench topic", topic=topic, error=e.args[0].str())
    except Exception as e:  # whatever it is, the run's own outcome matters more
        log.warning("could not delete a bench topic", topic=topic, error=str(e))
