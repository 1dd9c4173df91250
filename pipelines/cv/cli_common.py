"""What the `streamviews` commands share: their errors and exit statuses, connections, text tables.

Every failure becomes one line: CommandError carries its exit status (2: the input is wrong, 1: a
run-time failure), and the messages of PostgreSQL, libpq and Kafka are reduced to their reason.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from pipelines.errors import StreamviewsError
from pipelines.settings import ROLE_OWNER, KafkaSettings, PostgresSettings

# librdkafka's own log lines (a broker down, say) would be more lines on stderr: logged here, shown with -v.
kafka_log = logging.getLogger("cli.librdkafka")

# Kafka metadata and offset requests: a status or a define must not hang on a broker that is down.
KAFKA_TIMEOUT_S = 5.0
USAGE, FAILURE = 2, 1


class CommandError(StreamviewsError):
    """A command failed; `status` is the exit status (2: the input is wrong, 1: a run-time failure)."""

    def __init__(self, message: str, status: int = FAILURE) -> None:
        super().__init__(message)
        self.status = status


def one_line(text: object) -> str:
    """Any message as one line: whitespace (newlines, tabs) collapsed."""
    return " ".join(str(text).split())


def pg_message(error: psycopg.Error) -> str:
    """PostgreSQL's primary message for an error, or the driver's own when the server sent none."""
    return one_line(error.diag.message_primary or error)


def pg_status(error: psycopg.Error) -> int:
    """Exit status for a database error: 2 when the statement is at fault (SQLSTATE classes 22, 23, 3F, 42)."""
    return USAGE if isinstance(error, (psycopg.ProgrammingError, psycopg.DataError, psycopg.IntegrityError)) else 1


def connection_reason(error: psycopg.OperationalError) -> str:
    """The reason libpq gives for a failed connection, without the host and port (the caller names them)."""
    text = re.sub(r'^(connection failed: )?(connection to server at "[^"]*", port \d+ failed: )?', "", str(error))
    first = next((line for line in text.splitlines() if line.strip()), text)
    return one_line(first.removeprefix("FATAL:"))


def kafka_message(error: KafkaException) -> str:
    """The broker or client's reason, without the KafkaError{...} wrapping."""
    cause = error.args[0] if error.args else None
    return one_line(cause.str() if isinstance(cause, KafkaError) else error)


def definer(settings: PostgresSettings) -> str:
    """The role that defines and drops: sv_owner (it creates tables) unless PGUSER says otherwise."""
    return settings.user if "user" in settings.model_fields_set else ROLE_OWNER


@contextmanager
def database(settings: PostgresSettings, user: str) -> Iterator[psycopg.Connection]:
    """An autocommit connection, so `conn.transaction()` is the outer transaction and the catalog's are savepoints.

    Raises:
        CommandError: PostgreSQL cannot be reached or refuses the role, naming host, port and role.
    """
    conninfo = settings.conninfo() if user == settings.user else settings.conninfo(user=user)
    try:
        conn = psycopg.connect(conninfo, autocommit=True)
    except psycopg.OperationalError as e:
        where = f"{settings.host}:{settings.port}/{settings.database}"
        raise CommandError(f"cannot connect to PostgreSQL at {where} as {user}: {connection_reason(e)}") from e
    with conn:
        yield conn


def kafka_admin(kafka: KafkaSettings) -> AdminClient:
    """An admin client whose librdkafka logs go to logging (DEBUG with -v), not straight to stderr."""
    return AdminClient(
        {
            "bootstrap.servers": kafka.bootstrap_servers,
            "client.id": f"{kafka.client_id}-cli",
            "logger": kafka_log,
        }
    )


def kafka_topics(admin: AdminClient, kafka: KafkaSettings) -> dict[str, Any]:
    """The cluster's topics (name -> metadata).

    Raises:
        CommandError: The brokers did not answer within KAFKA_TIMEOUT_S.
    """
    try:
        return admin.list_topics(timeout=KAFKA_TIMEOUT_S).topics
    except KafkaException as e:
        raise CommandError(f"cannot reach Kafka at {kafka.bootstrap_servers}: {kafka_message(e)}") from e


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Rows under their headers in left-aligned columns, two spaces apart."""
    cells = [[str(h) for h in headers], *([str(c) for c in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells)
