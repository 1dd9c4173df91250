"""CREATE STREAM parsed: the stream's name, columns, table-level CHECKs and WITH (...) options, checked.

How a column's type and constraints are read is in pipelines.cv.frontend.columns.

The options of WITH (...) (quoted strings, or plain integers for the numbers):

- `topic`: the Kafka topic (default: the stream's name): Kafka's legal characters [A-Za-z0-9._-], at
  most 245 of them (its dead-letter topic `<topic>.dlq` must be a topic name too), not `.` or `..`.
- `key`: 'a, b': the columns identifying a row; the stream is then a set (key columns are NOT NULL).
- `format`: 'json' (default: one JSON object per record, fields named like the columns), 'csv' (one
  RFC 4180 record, fields in column order) or 'debezium' (a Debezium change event of a table with
  these columns: inserts and snapshot reads add the row, deletes remove it).
- `kafka_key`: a column whose value, as text, every record key must be (what routes a row's events
  to one partition, and so keeps them in order).
- `action_field`, `insert_actions`, `delete_actions` (json only, all three together): the event field
  (not a column) saying whether the event adds or removes its row, and its values for each, e.g.
  'like' and 'unlike'. An event without the field is an insert.
- `timestamp_column`: a timestamptz column that takes the Kafka record's timestamp when the event
  has no value for it (Debezium: the commit time first).
- `unknown_fields`: 'reject' (default: an event with a field that is not a column is dead-lettered)
  or 'ignore' (csv: extra trailing fields are ignored).
- `partitions`: the topic's partition count when it is created (1 .. 1000; default: the runner's).
- `max_event_bytes`: larger record values are dead-lettered unread (1 .. 10485760, default 65536).
- `consumer_group`: the runner group that consumes the stream (default: the supervised runner's,
  `streamviews-streams`). A stream with its own group runs only in `streamviews run --group <it>`:
  heavy streams isolated in processes of their own, benchmarks and tests that bring their runner.
- `start_offset`: where the stream's first consumption of its topic starts: 'earliest' (default,
  every retained event), 'latest' (events produced from then on), or a timestamp with its time zone
  ('2026-11-26 12:00:00+00': the first event whose Kafka timestamp is at or after it). Resolved once
  and stored with the offsets; restarts resume from those (pipelines/runtime/starts.py).
- `retention`, `retention_bytes`: the topic's retention.ms (an interval, '7 days') and retention.bytes
  per partition (a size, '10 GB'), applied by the runner when it creates the topic and when the
  stream is altered (ALTER STREAM s SET / RESET); checked by PostgreSQL when the stream is defined.
- `into`: another stream that this one's rows are fed into (its state and views), e.g. Debezium
  changes of an application table into the stream its Kafka producers write. Such a stream has no
  `key` of its own; whether the two streams fit is checked when the catalog defines it.
"""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import datetime

import pglast
from pglast import ast
from pglast.enums import ConstrType, OnCommitAction

from pipelines.cv.decoding.stream_decoder import StreamDecoder
from pipelines.cv.frontend.columns import constraint_label, parse_check, parse_column
from pipelines.cv.model import Column, DefinitionError, StreamDef, StreamFormat
from pipelines.cv.sqltext.parsing import options_of, plain_identifier, reject_unsupported
from pipelines.runtime.deadletter import dead_letter_topic

STREAM_OPTIONS = frozenset(
    {
        "topic",
        "key",
        "format",
        "kafka_key",
        "action_field",
        "insert_actions",
        "delete_actions",
        "timestamp_column",
        "unknown_fields",
        "partitions",
        "max_event_bytes",
        "into",
        "consumer_group",
        "start_offset",
        "retention",
        "retention_bytes",
    }
)
# The options ALTER STREAM SET / RESET may change: they decide nothing of the state or its views.
ALTERABLE_STREAM_OPTIONS = frozenset({"retention", "retention_bytes"})
FORMATS: tuple[StreamFormat, ...] = ("json", "csv", "debezium")
MAX_IDENTIFIER_BYTES = 63  # PostgreSQL's NAMEDATALEN - 1: longer names are truncated, silently
MAX_PARTITIONS = 1000
MAX_EVENT_BYTES = 10 * 1024 * 1024
# Kafka's own rule for topic names: these characters, at most 249 of them, not "." or "..". A stream's
# topic has 4 fewer, so that its dead-letter topic (`<topic>.dlq`) is a topic name too.
MAX_TOPIC_NAME = 249 - len(dead_letter_topic(""))
TOPIC_NAME = re.compile(rf"[A-Za-z0-9._-]{{1,{MAX_TOPIC_NAME}}}")
# The kinds whose value has one text form a record key can be compared with (uuid: lower case).
KEY_KINDS = frozenset({"smallint", "integer", "bigint", "text", "varchar", "uuid"})


def parse_stream(node: ast.CreateStmt, text: str) -> StreamDef:
    """The stream a CREATE STREAM declares (parsed as CREATE TABLE); `text` is the statement as written."""
    if node.relation.schemaname:
        raise DefinitionError("CREATE STREAM: stream names are not schema-qualified")
    _check_identifier_lengths(text, f"CREATE STREAM {node.relation.relname}")
    name = plain_identifier(node.relation.relname, "CREATE STREAM")
    what = f"CREATE STREAM {name}"
    reject_unsupported(
        (
            (node.inhRelations, "INHERITS"),
            (node.partspec, "PARTITION BY"),
            (node.partbound, "PARTITION OF"),
            (node.ofTypename, "OF <type>"),
            (node.tablespacename, "TABLESPACE"),
            (node.accessMethod, "USING"),
            (node.if_not_exists, "IF NOT EXISTS"),
            (node.oncommit != OnCommitAction.ONCOMMIT_NOOP, "ON COMMIT"),
        ),
        what,
    )
    columns: list[Column] = []
    table_checks = []
    for element in node.tableElts or ():
        if isinstance(element, ast.ColumnDef):
            columns.append(parse_column(element, what))
        elif isinstance(element, ast.Constraint) and element.contype == ConstrType.CONSTR_CHECK:
            table_checks.append(element)  # checked once every column is known
        elif isinstance(element, ast.Constraint):
            raise DefinitionError(f"{what}: {constraint_label(element)} is not supported; a stream takes CHECK only")
        else:
            raise DefinitionError(f"{what}: only column definitions and CHECK constraints are allowed")
    if not columns:
        raise DefinitionError(f"{what}: no columns")
    names = [c.name for c in columns]
    if len(set(names)) != len(names):
        raise DefinitionError(f"{what}: a column is declared twice ({', '.join(names)})")
    checks = [parse_check(constraint, set(names), what, "table") for constraint in table_checks]
    options = options_of(node.options, STREAM_OPTIONS, what, integers=True)
    by_name = {c.name: c for c in columns}

    topic = options.get("topic", name)
    if not TOPIC_NAME.fullmatch(topic) or topic in {".", ".."}:
        raise DefinitionError(
            f"{what}: topic {topic!r} is not a Kafka topic name ([A-Za-z0-9._-], 1 to {MAX_TOPIC_NAME} characters "
            "leaving room for .dlq, not . or ..)"
        )
    stream_format = options.get("format", "json")
    if stream_format not in FORMATS:
        raise DefinitionError(f"{what}: format {stream_format!r} is not one of {', '.join(FORMATS)}")
    key = _key(options, by_name, what)
    if key:
        # A row is identified by its key: a key without a value identifies nothing.
        columns = [replace(c, not_null=True) if c.name in key else c for c in columns]
        by_name = {c.name: c for c in columns}
    kafka_key = _kafka_key(options, by_name, stream_format, what)
    action_field, insert_actions, delete_actions = _actions(options, by_name, stream_format, key, what)
    timestamp_column = options.get("timestamp_column")
    if timestamp_column is not None:
        column = _column_option(by_name, timestamp_column, "timestamp_column", what)
        if column.kind != "timestamptz":
            raise DefinitionError(f"{what}: timestamp_column {column.name} is {column.type}, not timestamptz")
        if column.default is not None:
            raise DefinitionError(
                f"{what}: timestamp_column {column.name} has a DEFAULT; a missing value takes one or the other"
            )
    unknown_fields = options.get("unknown_fields", "reject")
    if unknown_fields not in ("reject", "ignore"):
        raise DefinitionError(f"{what}: unknown_fields {unknown_fields!r} is not 'reject' or 'ignore'")
    partitions = _integer_option(options, "partitions", MAX_PARTITIONS, what)
    max_event_bytes = _integer_option(options, "max_event_bytes", MAX_EVENT_BYTES, what)
    into = options.get("into")
    if into is not None:
        into = plain_identifier(into, f"{what}: into")
        if into == name:
            raise DefinitionError(f"{what}: into names the stream itself")
        if key:
            raise DefinitionError(f"{what}: a stream with into has no key of its own (it takes {into}'s)")
    consumer_group = options.get("consumer_group")
    if consumer_group is not None and not re.fullmatch(r"[A-Za-z0-9._-]{1,200}", consumer_group):
        raise DefinitionError(f"{what}: consumer_group {consumer_group!r} is not a Kafka group name ([A-Za-z0-9._-])")
    start_offset = _start_offset(options.get("start_offset", "earliest"), what)
    stream = StreamDef(
        name,
        topic,
        tuple(columns),
        key,
        text,
        format=stream_format,  # type: ignore[arg-type]
        checks=tuple(checks),
        kafka_key=kafka_key,
        action_field=action_field,
        insert_actions=insert_actions,
        delete_actions=delete_actions,
        timestamp_column=timestamp_column,
        unknown_fields=unknown_fields,  # type: ignore[arg-type]
        partitions=partitions,
        max_event_bytes=65_536 if max_event_bytes is None else max_event_bytes,
        into=into,
        consumer_group=consumer_group,
        start_offset=start_offset,
        retention=options.get("retention"),
        retention_bytes=options.get("retention_bytes"),
    )
    # Compiling the decoder evaluates every DEFAULT and compiles every CHECK: one it cannot evaluate
    # fails the definition now, not the first event.
    StreamDecoder(stream)
    return stream


def _start_offset(text: str, what: str) -> str:
    """'earliest', 'latest', or a timestamp with its time zone (a stream's start must not hang on a session's zone)."""
    if text in ("earliest", "latest"):
        return text
    try:
        at = datetime.fromisoformat(text.strip())
    except ValueError:
        at = None
    if at is None or at.tzinfo is None:
        raise DefinitionError(
            f"{what}: start_offset {text!r} is not 'earliest', 'latest' or a timestamp with its time zone, "
            "e.g. '2026-11-26 12:00:00+00'"
        )
    return text.strip()


def _check_identifier_lengths(text: str, what: str) -> None:
    """Reject a name PostgreSQL would truncate to 63 bytes (the parser has already truncated it)."""
    for token in pglast.parser.scan(text):
        if token.name == "IDENT":
            raw = text[token.start : token.end + 1]
            name = raw[1:-1].replace('""', '"') if raw.startswith('"') else raw.lower()
            if len(name.encode()) > MAX_IDENTIFIER_BYTES:
                raise DefinitionError(
                    f"{what}: the name {name[:32]!r}... is {len(name.encode())} bytes; PostgreSQL allows "
                    f"{MAX_IDENTIFIER_BYTES} and would truncate it"
                )


def _column_option(by_name: dict[str, Column], name: str, option: str, what: str) -> Column:
    if name not in by_name:
        raise DefinitionError(f"{what}: {option} {name!r} is not a column ({', '.join(by_name)})")
    return by_name[name]


def _key(options: dict[str, str], by_name: dict[str, Column], what: str) -> tuple[str, ...] | None:
    if "key" not in options:
        return None
    key = tuple(part.strip() for part in options["key"].split(",") if part.strip())
    unknown = [k for k in key if k not in by_name]
    if not key or unknown:
        raise DefinitionError(f"{what}: key names unknown columns {unknown or options['key']!r}")
    if len(set(key)) != len(key):
        raise DefinitionError(f"{what}: key names a column twice ({options['key']})")
    for name in key:
        if by_name[name].kind == "jsonb":
            raise DefinitionError(f"{what}: key column {name} is jsonb, which has no equality to key rows by")
    return key


def _kafka_key(options: dict[str, str], by_name: dict[str, Column], stream_format: str, what: str) -> str | None:
    if "kafka_key" not in options:
        return None
    if stream_format == "debezium":
        raise DefinitionError(f"{what}: kafka_key does not apply to format debezium (its keys are the table's key)")
    column = _column_option(by_name, options["kafka_key"], "kafka_key", what)
    if column.kind not in KEY_KINDS:
        raise DefinitionError(
            f"{what}: kafka_key {column.name} is {column.type}; a record key is compared with an integer, text or "
            "uuid column"
        )
    if not column.not_null:
        raise DefinitionError(f"{what}: kafka_key {column.name} must be NOT NULL (or a key column)")
    return column.name


def _actions(
    options: dict[str, str],
    by_name: dict[str, Column],
    stream_format: str,
    key: tuple[str, ...] | None,
    what: str,
) -> tuple[str | None, tuple[str, ...], tuple[str, ...]]:
    field_name = options.get("action_field")
    given = [o for o in ("insert_actions", "delete_actions") if o in options]
    if field_name is None:
        if given:
            raise DefinitionError(f"{what}: {' and '.join(given)} need action_field")
        return None, (), ()
    if stream_format != "json":
        raise DefinitionError(f"{what}: action_field applies to format json only, not {stream_format}")
    if not field_name:
        raise DefinitionError(f"{what}: action_field is empty")
    if field_name in by_name:
        raise DefinitionError(f"{what}: action_field {field_name!r} is a column; it must be a field of its own")
    if len(given) < 2:
        raise DefinitionError(f"{what}: action_field needs both insert_actions and delete_actions")
    inserts, deletes = (_names(options[o], o, what) for o in ("insert_actions", "delete_actions"))
    both = sorted(set(inserts) & set(deletes))
    if both:
        raise DefinitionError(f"{what}: {', '.join(map(repr, both))} is both an insert and a delete action")
    if key is None and "into" not in options:
        raise DefinitionError(f"{what}: delete actions need a key (or into a keyed stream); this stream is append-only")
    return field_name, inserts, deletes


def _names(text: str, option: str, what: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in text.split(","))
    if not all(names):
        raise DefinitionError(f"{what}: {option} {text!r} has an empty name")
    if len(set(names)) != len(names):
        raise DefinitionError(f"{what}: {option} {text!r} names a value twice")
    return names


def _integer_option(options: dict[str, str], option: str, limit: int, what: str) -> int | None:
    if option not in options:
        return None
    text = options[option].strip()
    if not re.fullmatch(r"[0-9]+", text) or not 1 <= int(text) <= limit:
        raise DefinitionError(f"{what}: {option} {options[option]!r} is not an integer in 1 .. {limit}")
    return int(text)
