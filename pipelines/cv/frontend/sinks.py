"""CREATE SINK and DROP SINK read with PostgreSQL's parser, checked without a database.

    CREATE SINK alerts FROM public.errors_per_minute WITH (
        topic = 'alerts', format = 'changes',
        where = '(new).errors >= 100 AND ((old) IS NULL OR (old).errors < 100)');
    CREATE SINK url_counts FROM public.url_counts WITH (topic = 'url_counts', format = 'upsert');
    DROP SINK [IF EXISTS] alerts;

A sink publishes a view's change stream to a Kafka topic (the relay, pipelines.cv.relay). Its options:

- `topic`: the topic (default: the sink's name), created when missing (compacted for `upsert`);
- `format`: `upsert` (key: the group key as JSON, value: the row, a tombstone when the group is
  gone: a compacted topic is the current view) or `changes` (each change: view, position, key,
  before, after, delta, committed_at); default `upsert`;
- `envelope = 'debezium'` (format `changes` only): Debezium's before/after/op/ts_ms/source instead;
- `where`: a condition on the change, `(old)` and `(new)` being its before and after as rows of the
  view (NULL for a new group, for a group gone); only changes that pass are published;
- `partitions`: of the topic when it is created (default PIPELINE_TOPIC_PARTITIONS).

Sink names are plain identifiers, like streams'. The condition is read here (one expression that
names only `old` and `new`, no subquery) and written back by pglast, so what the relay runs is that
expression and nothing else; PostgreSQL checks its columns and types when the sink is created.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from pglast import ast
from pglast.stream import RawStream

from pipelines.cv.frontend.streams import MAX_PARTITIONS, TOPIC_NAME
from pipelines.cv.model import DefinitionError
from pipelines.cv.sqltext.parsing import options_of, parse_rewritten, plain_identifier, walk

SinkFormat = Literal["upsert", "changes"]
FORMATS: tuple[SinkFormat, ...] = ("upsert", "changes")
ENVELOPES = ("debezium",)
SINK_OPTIONS = frozenset({"topic", "format", "envelope", "where", "partitions"})
# What the condition calls the change's two rows.
ROWS = ("old", "new")

_HEAD = re.compile(r"\s*(CREATE|DROP)\s+SINK\b", re.IGNORECASE)
_CREATE = re.compile(
    r"\s*CREATE\s+SINK\s+(?P<name>.*?)\s+FROM\s+(?P<source>.*?)(?:\s+WITH\s*\((?P<options>.*)\))?\s*;?\s*",
    re.IGNORECASE | re.DOTALL,
)
USAGE = "CREATE SINK name FROM schema.view WITH (topic = '...', format = 'upsert' | 'changes' [, where = '...'])"


@dataclass(frozen=True)
class SinkDef:
    """A sink as CREATE SINK declares it.

    Attributes:
        name: A plain identifier, unique among sinks.
        view: The view whose changes it publishes, schema-qualified.
        where: The condition as pglast writes it back, or None for every change.
        definition: The statement as given (what the catalog keeps).
    """

    name: str
    view: str
    topic: str
    format: SinkFormat
    envelope: str | None
    where: str | None
    partitions: int | None
    definition: str

    @property
    def reader(self) -> str:
        """Its name as a reader of the view's changes (cv.change_readers, migration 0023)."""
        return reader_name(self.name)

    @property
    def needs_images(self) -> bool:
        """False for an upsert sink whose filter names no (old): it publishes each changed group's current row.

        Its view may then record only the keys of its changes (migration 0046); any other sink
        needs each change's before and after as they were.
        """
        return self.format != "upsert" or (self.where is not None and _names_old(self.where))


@dataclass(frozen=True)
class DropSink:
    """DROP SINK [IF EXISTS] name, ..."""

    names: tuple[str, ...]
    if_exists: bool


def reader_name(sink: str) -> str:
    """Sink `alerts` reads its view's changes as the reader `sink alerts`."""
    return f"sink {sink}"


def parse_sink(statement: str) -> SinkDef | DropSink | None:
    """The CREATE SINK or DROP SINK a statement is; None for any other statement.

    Raises:
        DefinitionError: A malformed sink statement or option, naming what.
    """
    head = _HEAD.match(statement)
    if head is None:
        return None
    text = statement.strip().rstrip(";").strip()
    if head.group(1).upper() == "DROP":
        return _parse_drop(text[_HEAD.match(text).end() :])  # type: ignore[union-attr]
    match = _CREATE.fullmatch(text)
    if match is None:
        raise DefinitionError(f"CREATE SINK: expected {USAGE}")
    # Read as a view named like the sink, over the source view, with the options as its WITH (...):
    # PostgreSQL's own rules for names (quoting, case) and option values.
    with_clause = f" WITH ({match.group('options')})" if match.group("options") is not None else ""
    node = parse_rewritten(
        f"CREATE VIEW {match.group('name')}{with_clause} AS SELECT FROM {match.group('source')}", "CREATE SINK"
    )
    if not isinstance(node, ast.ViewStmt) or len(node.query.fromClause or ()) != 1:
        raise DefinitionError(f"CREATE SINK: expected {USAGE}")
    if node.view.schemaname:
        raise DefinitionError("CREATE SINK: a sink's name has no schema")
    name = plain_identifier(node.view.relname, "CREATE SINK")
    what = f"CREATE SINK {name}"
    source = node.query.fromClause[0]
    if not isinstance(source, ast.RangeVar):
        raise DefinitionError(f"{what}: FROM names a continuous view (schema.view)")
    view = f"{plain_identifier(source.schemaname or 'public', what)}.{plain_identifier(source.relname, what)}"
    options = options_of(node.options, SINK_OPTIONS, what, integers=True)
    topic = options.get("topic", name)
    if not TOPIC_NAME.fullmatch(topic) or topic in {".", ".."}:
        raise DefinitionError(f"{what}: topic {topic!r} is not a Kafka topic name ([A-Za-z0-9._-], not . or ..)")
    sink_format = options.get("format", "upsert")
    if sink_format not in FORMATS:
        raise DefinitionError(f"{what}: format {sink_format!r} is not one of {', '.join(FORMATS)}")
    envelope = options.get("envelope")
    if envelope is not None and envelope not in ENVELOPES:
        raise DefinitionError(f"{what}: envelope {envelope!r} is not one of {', '.join(ENVELOPES)}")
    if envelope is not None and sink_format != "changes":
        raise DefinitionError(f"{what}: envelope = '{envelope}' goes with format = 'changes'")
    where = _condition(options["where"], what) if "where" in options else None
    partitions = None
    if "partitions" in options:
        text_value = options["partitions"].strip()
        if not re.fullmatch(r"[0-9]+", text_value) or not 1 <= int(text_value) <= MAX_PARTITIONS:
            raise DefinitionError(
                f"{what}: partitions {options['partitions']!r} is not an integer in 1 .. {MAX_PARTITIONS}"
            )
        partitions = int(text_value)
    return SinkDef(name, view, topic, sink_format, envelope, where, partitions, text)  # type: ignore[arg-type]


def _parse_drop(rest: str) -> DropSink:
    """DROP SINK's names (read as DROP VIEW's); CASCADE has nothing to cascade to."""
    node = parse_rewritten(f"DROP VIEW {rest}", "DROP SINK")
    if not isinstance(node, ast.DropStmt):
        raise DefinitionError("DROP SINK: expected DROP SINK [IF EXISTS] name")
    if node.behavior.name != "DROP_RESTRICT":
        raise DefinitionError("DROP SINK: CASCADE is not supported (nothing depends on a sink)")
    names = []
    for parts in node.objects:
        if len(parts) != 1:
            raise DefinitionError("DROP SINK: a sink's name has no schema")
        names.append(plain_identifier(parts[0].sval, "DROP SINK"))
    return DropSink(tuple(names), bool(node.missing_ok))


def _names_old(where: str) -> bool:
    """True when the condition (as `_condition` wrote it) reads the change's old row."""
    node = parse_rewritten(f"SELECT WHERE {where}", "where")
    return any(
        isinstance(item, ast.ColumnRef) and getattr(item.fields[0], "sval", None) == "old" for item in walk(node)
    )


def _condition(text: str, what: str) -> str:
    """The `where` option as one expression over (old) and (new), written back by pglast.

    Raises:
        DefinitionError: Not one expression, a subquery, or a name other than old and new.
    """
    node = parse_rewritten(f"SELECT WHERE {text}", f"{what}: where")
    clauses = (
        node.targetList,
        node.fromClause,
        node.groupClause,
        node.havingClause,
        node.sortClause,
        node.limitCount,
        node.limitOffset,
        node.windowClause,
        node.withClause,
        node.lockingClause,
    )
    if not isinstance(node, ast.SelectStmt) or node.whereClause is None or any(clauses) or node.op.name != "SETOP_NONE":
        raise DefinitionError(f"{what}: where takes one condition on (old) and (new), e.g. '(new).n > 100'")
    for item in walk(node.whereClause):
        if isinstance(item, ast.SubLink):
            raise DefinitionError(f"{what}: where: a subquery is not supported; the condition is on the change alone")
        if isinstance(item, ast.ColumnRef):
            first = item.fields[0]
            if not isinstance(first, ast.String) or first.sval not in ROWS:
                shown = ".".join(getattr(f, "sval", "*") for f in item.fields)
                raise DefinitionError(
                    f"{what}: where names {shown!r}; name the change's rows as (old).column and (new).column"
                )
    return RawStream()(node.whereClause)
