"""Stream and continuous-view definitions: the model, parsed from SQL with PostgreSQL's own parser (pglast).

Two statements are understood, in the spirit of PipelineDB:

    CREATE STREAM likes (
        oid bigint NOT NULL CONSTRAINT id_out_of_range CHECK (oid > 0),
        uid bigint NOT NULL CONSTRAINT id_out_of_range CHECK (uid > 0),
        ts  timestamptz NOT NULL
    ) WITH (key = 'oid, uid', kafka_key = 'oid', action_field = 'action',
            insert_actions = 'like', delete_actions = 'unlike', timestamp_column = 'ts');
    CREATE CONTINUOUS VIEW social.object_likes [WITH (ttl = '30 days')] AS
        SELECT oid, count(*) AS like_count, array_agg(DISTINCT uid) AS likers
        FROM likes [WHERE ...] GROUP BY oid;

A stream with a `key` is a *set* of rows: an insert of a present key and a delete of an absent key
change nothing, and a delete retracts the row from every view. A stream without a key is
append-only. The parser checks everything it can without a database and raises `DefinitionError`
naming what is unsupported; the types of view expressions are resolved later, by PostgreSQL, when
the view is compiled.

`parse` reads one statement, `split_statements` a text of many. The statements themselves are read by
pipelines.cv.stream_definitions (CREATE STREAM and its WITH options; a column's type and constraints
in pipelines.cv.column_definitions) and pipelines.cv.view_definitions (CREATE CONTINUOUS VIEW).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

import pglast
from pglast import ast
from pglast.stream import RawStream

from pipelines.errors import StreamviewsError

AggregateKind = Literal["count", "count_distinct", "sum", "min", "max", "set", "hll", "tdigest", "topk", "state"]
# Aggregates that cannot forget a value: a retraction leaves them as they are.
MONOTONIC: frozenset[str] = frozenset({"hll", "tdigest", "topk", "state"})
DISTINCT_KINDS: frozenset[str] = frozenset({"count_distinct", "set"})
IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]*")  # whole names only (fullmatch: `$` would pass a final newline)
# C0 and C1 control characters and DEL: never in a name, a topic or an option's value.
CONTROL_CHARACTER = re.compile(r"[\x00-\x1f\x7f-\x9f]")


EXPECTED = "expected CREATE STREAM ... or CREATE CONTINUOUS VIEW ... AS SELECT ..."


class DefinitionError(StreamviewsError):
    """A stream or view definition is invalid or uses something the engine does not support."""


StreamFormat = Literal["json", "csv", "debezium"]
# The column types a stream can declare, by the name decoding knows them under (see column_definitions.TYPE_NAMES).
TypeKind = Literal[
    "smallint",
    "integer",
    "bigint",
    "numeric",
    "double",
    "real",
    "boolean",
    "text",
    "varchar",
    "timestamptz",
    "date",
    "uuid",
    "jsonb",
]


@dataclass(frozen=True)
class Check:
    """A CHECK constraint of a stream, enforced when events are decoded.

    Attributes:
        name: `CONSTRAINT <name> CHECK (...)`: the dead-letter reason of an event that fails it
            (default reason: `check_violation`).
        sql: The condition as PostgreSQL deparses it, e.g. `oid > 0`.
    """

    name: str | None
    sql: str


@dataclass(frozen=True)
class Column:
    """A stream column: its declared type and the constraints decoding enforces.

    Attributes:
        name: The column, also the JSON field name (json, debezium) of its value.
        type: The declared type as SQL text, used as is in DDL (`bigint`, `varchar(20)`).
        kind: The type as decoding knows it (`bigint`, `varchar`, `double`, ...).
        not_null: `NOT NULL`: an event without a value is rejected (key columns are always NOT NULL).
        default: `DEFAULT <expr>` as SQL text: a constant, or now() / current_timestamp / current_date.
        typmods: `varchar(n)` -> (n,), `numeric(p, s)` -> (p, s).
        checks: Column-level CHECK constraints.
    """

    name: str
    type: str
    kind: TypeKind = "text"
    not_null: bool = False
    default: str | None = None
    typmods: tuple[int, ...] = ()
    checks: tuple[Check, ...] = ()


# A view's storage and its reference counts (`<storage>__refs`) must fit PostgreSQL's 63-byte names.
MAX_VIEW_NAME = 63 - len("__") - len("__refs")


def storage_name(schema: str, view: str) -> str:
    """The storage table of view `schema.view`, in schema cv."""
    return f"{schema}__{view}"


def state_table_name(stream: str) -> str:
    """Where a keyed stream keeps its current rows: `cv.state_<stream>`."""
    return f"state_{stream}"


@dataclass(frozen=True)
class StreamDef:
    """A named stream: a Kafka topic whose events carry these columns."""

    name: str
    topic: str
    columns: tuple[Column, ...]
    key: tuple[str, ...] | None
    definition: str
    # How events are read (all from WITH (...); see the module docstring for each option).
    format: StreamFormat = "json"
    checks: tuple[Check, ...] = ()  # table-level CHECK constraints
    kafka_key: str | None = None  # the record key must be this column's value as text
    action_field: str | None = None  # json: the field that says insert or delete
    insert_actions: tuple[str, ...] = ()
    delete_actions: tuple[str, ...] = ()
    timestamp_column: str | None = None  # takes the record's timestamp when the event has no value
    unknown_fields: Literal["reject", "ignore"] = "reject"
    partitions: int | None = None  # of the topic when it is created (None: the runner's default)
    max_event_bytes: int = 65_536
    into: str | None = None  # feed the rows of this stream into that stream (its state and views)
    consumer_group: str | None = None  # the runner group consuming it (None: the supervised runner's)

    @property
    def column_names(self) -> tuple[str, ...]:
        """Column names in declaration order (the order of event values)."""
        return tuple(c.name for c in self.columns)

    @property
    def state_table(self) -> str:
        """The table holding a keyed stream's current rows (in schema cv)."""
        return state_table_name(self.name)


@dataclass(frozen=True)
class GroupColumn:
    """A GROUP BY output column: an expression over stream columns, maybe a time bucket."""

    name: str
    sql: str
    source_column: str | None = None
    bucket_unit: str | None = None


@dataclass(frozen=True)
class Aggregate:
    """A stored aggregate: a column of the view's storage that every batch is merged into.

    Attributes:
        name: The storage column (the output's name when the output is this aggregate itself).
        kind: How it is computed and merged (see pipelines.cv.views.aggregates).
        arg_sql: Its argument over stream columns (None: count(*)).
        filter_sql: FILTER (WHERE ...): only rows passing it count.
        params: Kind-specific constants: a t-digest's compression, a top-K summary's capacity, the
            aggregate function kept as its state.
    """

    name: str
    kind: AggregateKind
    arg_sql: str | None = None
    filter_sql: str | None = None
    params: tuple[str, ...] = ()


@dataclass(frozen=True)
class AggregateCall:
    """An aggregate call of the select list, e.g. `avg(latency)`, read from stored aggregates.

    Attributes:
        function: The function as the engine knows it (`avg`, `var_samp`, `percentile_cont`, ...).
        sql: The call as written: PostgreSQL resolves its result type from it.
        stored: The names of the stored aggregates it reads, in the order its reader takes them.
    """

    function: str
    sql: str
    stored: tuple[str, ...]


@dataclass(frozen=True)
class Output:
    """A column of the read view, in select-list order.

    `sql` is a group column's name, or an expression over aggregate calls in which call i appears
    as the placeholder `call_placeholder(i)` (the compiler puts each call's reader there).
    """

    name: str
    sql: str
    is_group: bool = False


def call_placeholder(index: int) -> str:
    """The stand-in for aggregate call `index` in an output expression (no stream column can be named so)."""
    return f"_cv_call_{index}_"


@dataclass(frozen=True)
class Window:
    """A sliding window: the view reads as its aggregates over the rows of the last `width`.

    Attributes:
        column: The stream's timestamptz column the window slides over.
        width: The window as PostgreSQL interval text, e.g. `5 minutes`.
    """

    column: str
    width: str


@dataclass(frozen=True)
class Join:
    """`FROM stream [AS s] [LEFT] JOIN table [AS t] ON ...`: each event enriched at ingest from the table.

    Attributes:
        stream_alias: What the view's expressions call the stream (its alias, or its name).
        table: The table, schema-qualified as written (SQL text).
        table_alias: What they call the table (its alias, or its name).
        left: LEFT JOIN: events without a matching row count with NULLs; otherwise they are skipped.
        on_sql: The join condition.
    """

    stream_alias: str
    table: str
    table_alias: str
    left: bool
    on_sql: str


@dataclass(frozen=True)
class ViewDef:
    """A continuous view: its table name, stream, groups, aggregates, filter and retention."""

    schema: str
    name: str
    stream: str
    groups: tuple[GroupColumn, ...]
    aggregates: tuple[Aggregate, ...]
    where_sql: str | None
    ttl: str | None
    definition: str
    options: dict[str, str] = field(default_factory=dict)
    outputs: tuple[Output, ...] = ()
    calls: tuple[AggregateCall, ...] = ()
    window: Window | None = None  # WHERE ts > now() - interval '...': a sliding window
    join: Join | None = None  # FROM stream JOIN table ON ...
    replace: bool = False  # CREATE OR REPLACE: rebuild the view if it exists with another definition

    @property
    def qualified_name(self) -> str:
        """`schema.name` as stored in the catalog."""
        return f"{self.schema}.{self.name}"

    @property
    def storage_name(self) -> str:
        """Its storage table in schema cv: `<schema>__<name>` (users read the view `<schema>.<name>`)."""
        return storage_name(self.schema, self.name)

    @property
    def bucket(self) -> GroupColumn | None:
        """The time-bucket group column, if any (what a TTL applies to)."""
        return next((g for g in self.groups if g.bucket_unit), None)

    @property
    def distinct_arg(self) -> str | None:
        """The one expression every DISTINCT aggregate of this view is over."""
        return next((a.arg_sql for a in self.aggregates if a.kind in DISTINCT_KINDS), None)

    @property
    def is_monotonic(self) -> bool:
        """True when a group must be kept even after all its rows are retracted."""
        return any(a.kind in MONOTONIC for a in self.aggregates)


def parse(
    statement: str, streams: dict[str, StreamDef], user_aggregates: frozenset[str] = frozenset()
) -> StreamDef | ViewDef:
    """Parse one CREATE STREAM or CREATE CONTINUOUS VIEW statement (comments before it are skipped).

    Args:
        statement: The statement, optionally ending with a semicolon.
        streams: The streams defined so far, by name (what a view may read).
        user_aggregates: Aggregates the database defines beyond the built-in ones (by name).

    Raises:
        DefinitionError: The statement is not one of the two, not valid, or not supported; the
            message names what.
    """
    from pipelines.cv.statement_text import split_with_stray

    statements, _ = split_with_stray(statement)  # text in no statement: PostgreSQL's parser names the error below
    if len(statements) > 1:
        raise DefinitionError("give one statement at a time")
    return _parse_one(statement, streams, user_aggregates)


def _parse_one(
    statement: str, streams: dict[str, StreamDef], user_aggregates: frozenset[str] = frozenset()
) -> StreamDef | ViewDef:
    # Imported here: the two parsers import this module's model and helpers.
    from pipelines.cv.statement_text import significant_tokens
    from pipelines.cv.stream_definitions import parse_stream
    from pipelines.cv.view_definitions import parse_view

    tokens = significant_tokens(statement)
    original = statement[tokens[0].start :].strip().rstrip(";") if tokens else ""
    head = re.match(r"\s*CREATE\s+(OR\s+REPLACE\s+)?(STREAM|CONTINUOUS\s+VIEW)\b", original, re.IGNORECASE)
    if head is None:
        raise DefinitionError(EXPECTED)
    is_stream = head.group(2).upper() == "STREAM"
    replace = head.group(1) is not None
    if replace and is_stream:
        raise DefinitionError("CREATE OR REPLACE STREAM: define the stream again; how its events are read may change")
    if replace:  # kept without OR REPLACE: the catalog holds what the view is, not how it came to be
        original = "CREATE CONTINUOUS VIEW" + original[head.end() :]
        head = re.match(r"\s*CREATE\s+()(CONTINUOUS\s+VIEW)\b", original, re.IGNORECASE)
        assert head is not None
    # The two PipelineDB statements map onto PostgreSQL ones that pglast parses: a stream is declared
    # like a table, a continuous view like a view. Only the leading keywords are rewritten.
    node = parse_rewritten(("CREATE TABLE" if is_stream else "CREATE VIEW") + original[head.end() :])
    if isinstance(node, ast.CreateStmt):
        return parse_stream(node, original)
    if isinstance(node, ast.ViewStmt):
        view = parse_view(node, original, streams, user_aggregates)
        return dataclasses.replace(view, replace=True) if replace else view
    raise DefinitionError(EXPECTED)


# --- what both parsers use ---------------------------------------------------------------------------


def parse_rewritten(rewritten: str, what: str = "") -> ast.Node:
    """The one statement of a PipelineDB statement rewritten into PostgreSQL's grammar, parsed by pglast."""
    try:
        nodes = pglast.parse_sql(rewritten)
    except pglast.parser.ParseError as e:
        raise DefinitionError(f"{what}{': ' if what else ''}syntax error: {e}") from e
    if len(nodes) != 1:
        raise DefinitionError("give one statement at a time")
    return nodes[0].stmt


def options_of(
    defs: tuple | None, allowed: set[str] | frozenset[str], what: str, integers: bool = False
) -> dict[str, str]:
    """The options of WITH (...) by name, each a quoted string (or, with `integers`, an integer)."""
    options = {}
    for item in defs or ():
        if item.defname not in allowed:
            raise DefinitionError(f"{what}: unknown option {item.defname!r}; known: {', '.join(sorted(allowed))}")
        arg = item.arg
        if isinstance(arg, ast.String):
            value = arg.sval
        elif integers and isinstance(arg, ast.Integer):
            value = str(arg.ival)
        elif integers and isinstance(arg, ast.Float) and re.fullmatch(r"-?[0-9]+", arg.fval):
            value = arg.fval  # an integer beyond 32 bits
        else:
            takes = "a quoted string or an integer" if integers else "a quoted string"
            raise DefinitionError(f"{what}: option {item.defname} takes {takes}")
        if item.defname in options:
            raise DefinitionError(f"{what}: option {item.defname} is given twice")
        if CONTROL_CHARACTER.search(value):
            raise DefinitionError(f"{what}: option {item.defname} {value!r} has a control character")
        options[item.defname] = value
    return options


def plain_identifier(name: str, what: str) -> str:
    """The name, when it is a plain lower-case identifier (what needs no quoting in SQL)."""
    if not IDENTIFIER.fullmatch(name):
        raise DefinitionError(f"{what}: {name!r} is not a plain lower-case identifier")
    return name


def reject_unsupported(clauses: tuple[tuple[object, str], ...], what: str, where: str = "") -> None:
    """Fail on the first clause given (truthy): `<what>: <label> is not supported<where>`."""
    for clause, label in clauses:
        if clause:
            raise DefinitionError(f"{what}: {label} is not supported{where}")


def split_arguments(text: str) -> list[str]:
    """The argument expressions of an argument list's text, `a, f(b, c)` -> [`a`, `f(b, c)`]."""
    call = pglast.parse_sql(f"SELECT f({text})")[0].stmt.targetList[0].val
    return [RawStream()(a) for a in call.args or ()]


def walk(node: object) -> Iterator[ast.Node]:
    """The node and every node below it."""
    if isinstance(node, ast.Node):
        yield node
        for name in node:
            yield from walk(getattr(node, name))
    elif isinstance(node, tuple):
        for item in node:
            yield from walk(item)
