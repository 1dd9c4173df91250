"""Stream and continuous-view definitions: parsed from SQL with PostgreSQL's own parser (pglast).

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

A stream's columns are declared like a table's and are what its events must carry (see
pipelines.cv.decoding for how each type is read):

- types: smallint, integer, bigint, numeric[(p[, s])], double precision, real, boolean, text,
  varchar[(n)], timestamptz, date, uuid, jsonb;
- constraints: NOT NULL, NULL, DEFAULT <constant | now() | current_timestamp | clock_timestamp() |
  current_date>, CHECK (<condition on this column>), each optionally named (`CONSTRAINT name`);
  table-level CHECK constraints may use every column. A named CHECK is the dead-letter reason of
  an event that fails it, and of a value outside its column type's range.

The options of WITH (...) (quoted strings, or plain integers for the numbers):

- `topic`: the Kafka topic (default: the stream's name).
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
- `into`: another stream that this one's rows are fed into (its state and views), e.g. Debezium
  changes of an application table into the stream its Kafka producers write. Such a stream has no
  `key` of its own; whether the two streams fit is checked when the catalog defines it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Literal

import pglast
from pglast import ast
from pglast.enums import ConstrType, OnCommitAction, SetOperation, SQLValueFunctionOp
from pglast.stream import RawStream

from pipelines.errors import StreamviewsError

AggregateKind = Literal["count", "count_distinct", "sum", "min", "max", "set", "hll"]
# Aggregates that cannot forget a value: a retraction leaves them as they are.
MONOTONIC: frozenset[str] = frozenset({"min", "max", "hll"})
DISTINCT_KINDS: frozenset[str] = frozenset({"count_distinct", "set"})
BUCKET_UNITS = ("second", "minute", "hour", "day", "week", "month", "year")
IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]*$")


class DefinitionError(StreamviewsError):
    """A stream or view definition is invalid or uses something the engine does not support."""


StreamFormat = Literal["json", "csv", "debezium"]
# The column types a stream can declare, by the name decoding knows them under (see TYPE_NAMES).
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
    """An aggregate output column."""

    name: str
    kind: AggregateKind
    arg_sql: str | None = None


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

    @property
    def qualified_name(self) -> str:
        """`schema.name` as stored in the catalog."""
        return f"{self.schema}.{self.name}"

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


def split_statements(text: str) -> list[str]:
    """Split a file of definitions into statements as written, leading comments dropped.

    pglast's scanner (not its parser, which does not know CREATE STREAM) finds the semicolons that end
    statements, so a semicolon inside a string or comment does not split.
    """
    statements = []
    for statement in pglast.split(text, with_parser=False):
        lines = statement.strip().splitlines()
        while lines and (not lines[0].strip() or lines[0].lstrip().startswith("--")):
            lines.pop(0)
        if lines:
            statements.append("\n".join(lines).strip())
    return statements


def parse(statement: str, streams: dict[str, StreamDef]) -> StreamDef | ViewDef:
    """Parse one CREATE STREAM or CREATE CONTINUOUS VIEW statement."""
    original = statement.strip().rstrip(";")
    if len(split_statements(original)) > 1:
        raise DefinitionError("give one statement at a time")
    head = re.match(r"\s*CREATE\s+(STREAM|CONTINUOUS\s+VIEW)\b", original, re.IGNORECASE)
    if head is None:
        raise DefinitionError("expected CREATE STREAM ... or CREATE CONTINUOUS VIEW ... AS SELECT ...")
    # The two PipelineDB statements map onto PostgreSQL ones that pglast parses: a stream is declared
    # like a table, a continuous view like a view. Only the leading keywords are rewritten.
    rewritten = ("CREATE TABLE" if head.group(1).upper() == "STREAM" else "CREATE VIEW") + original[head.end() :]
    try:
        nodes = pglast.parse_sql(rewritten)
    except pglast.parser.ParseError as e:
        raise DefinitionError(f"syntax error: {e}") from e
    if len(nodes) != 1:
        raise DefinitionError("give one statement at a time")
    node = nodes[0].stmt
    if isinstance(node, ast.CreateStmt):
        return _stream(node, original)
    if isinstance(node, ast.ViewStmt):
        return _view(node, original, streams)
    raise DefinitionError("expected CREATE STREAM ... or CREATE CONTINUOUS VIEW ... AS SELECT ...")


def _options(
    defs: tuple | None, allowed: set[str] | frozenset[str], what: str, integers: bool = False
) -> dict[str, str]:
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
        options[item.defname] = value
    return options


def _identifier(name: str, what: str) -> str:
    if not IDENTIFIER.match(name):
        raise DefinitionError(f"{what}: {name!r} is not a plain lower-case identifier")
    return name


# --- streams --------------------------------------------------------------------------------------

# The supported column types by PostgreSQL's internal name (what `TypeName.names[-1]` holds: `int` is
# int4, `double precision` float8, `timestamp with time zone` timestamptz).
TYPE_NAMES: dict[str, TypeKind] = {
    "int2": "smallint",
    "int4": "integer",
    "int8": "bigint",
    "numeric": "numeric",
    "float8": "double",
    "float4": "real",
    "bool": "boolean",
    "text": "text",
    "varchar": "varchar",
    "timestamptz": "timestamptz",
    "date": "date",
    "uuid": "uuid",
    "jsonb": "jsonb",
}
SUPPORTED_TYPES = (
    "smallint, integer, bigint, numeric[(p[, s])], double precision, real, boolean, text, varchar[(n)], "
    "timestamptz, date, uuid, jsonb"
)
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
    }
)
FORMATS: tuple[StreamFormat, ...] = ("json", "csv", "debezium")
MAX_IDENTIFIER_BYTES = 63  # PostgreSQL's NAMEDATALEN - 1: longer names are truncated, silently
MAX_PARTITIONS = 1000
MAX_EVENT_BYTES = 10 * 1024 * 1024
MAX_VARCHAR = 10_485_760
MAX_NUMERIC_PRECISION = 1000
# Kafka's own rule for topic names.
TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
# The kinds whose value has one text form a record key can be compared with (uuid: lower case).
KEY_KINDS = frozenset({"smallint", "integer", "bigint", "text", "varchar", "uuid"})
_CONSTRAINT_NAMES = {
    ConstrType.CONSTR_PRIMARY: "PRIMARY KEY",
    ConstrType.CONSTR_UNIQUE: "UNIQUE",
    ConstrType.CONSTR_FOREIGN: "REFERENCES",
    ConstrType.CONSTR_EXCLUSION: "EXCLUDE",
    ConstrType.CONSTR_GENERATED: "GENERATED ALWAYS AS (...)",
    ConstrType.CONSTR_IDENTITY: "GENERATED ... AS IDENTITY",
}
_DEFAULT_FUNCTIONS = frozenset({"now", "clock_timestamp"})
_DEFAULT_VALUE_FUNCTIONS = (SQLValueFunctionOp.SVFOP_CURRENT_TIMESTAMP, SQLValueFunctionOp.SVFOP_CURRENT_DATE)


def resolve_type(node: ast.TypeName, what: str) -> tuple[TypeKind, tuple[int, ...]]:
    """The kind and modifiers of a supported type name: `varchar(20)` -> ("varchar", (20,)).

    Raises:
        DefinitionError: The type is not one a stream supports (arrays, json, timestamp without time
            zone, domains, ...), or its modifiers are out of range.
    """
    label = RawStream()(node).removeprefix("pg_catalog.")
    names = [n.sval for n in node.names]
    kind = TYPE_NAMES.get(names[-1]) if len(names) == 1 or names[0] == "pg_catalog" else None
    if kind is None or node.setof or node.pct_type or node.arrayBounds:
        raise DefinitionError(f"{what}: type {label} is not supported; supported: {SUPPORTED_TYPES}")
    typmods = []
    for mod in node.typmods or ():
        if not isinstance(mod, ast.A_Const) or not isinstance(mod.val, ast.Integer):
            raise DefinitionError(f"{what}: type {label}: modifiers must be integers")
        typmods.append(mod.val.ival)
    if kind == "numeric":
        precision, scale = (*typmods, 0)[:2] if typmods else (1, 0)
        if len(typmods) > 2 or not 1 <= precision <= MAX_NUMERIC_PRECISION or not 0 <= scale <= precision:
            raise DefinitionError(
                f"{what}: type {label}: numeric(p, s) takes 1 <= p <= {MAX_NUMERIC_PRECISION} and 0 <= s <= p"
            )
    elif kind == "varchar":
        if len(typmods) > 1 or (typmods and not 1 <= typmods[0] <= MAX_VARCHAR):
            raise DefinitionError(f"{what}: type {label}: varchar(n) takes 1 <= n <= {MAX_VARCHAR}")
    elif typmods:
        raise DefinitionError(f"{what}: type {label}: {kind} takes no modifier")
    return kind, tuple(typmods)


def _stream(node: ast.CreateStmt, text: str) -> StreamDef:
    if node.relation.schemaname:
        raise DefinitionError("CREATE STREAM: stream names are not schema-qualified")
    _check_identifier_lengths(text, f"CREATE STREAM {node.relation.relname}")
    name = _identifier(node.relation.relname, "CREATE STREAM")
    what = f"CREATE STREAM {name}"
    for clause, label in (
        (node.inhRelations, "INHERITS"),
        (node.partspec, "PARTITION BY"),
        (node.partbound, "PARTITION OF"),
        (node.ofTypename, "OF <type>"),
        (node.tablespacename, "TABLESPACE"),
        (node.accessMethod, "USING"),
        (node.if_not_exists, "IF NOT EXISTS"),
        (node.oncommit != OnCommitAction.ONCOMMIT_NOOP, "ON COMMIT"),
    ):
        if clause:
            raise DefinitionError(f"{what}: {label} is not supported")
    columns: list[Column] = []
    table_checks = []
    for element in node.tableElts or ():
        if isinstance(element, ast.ColumnDef):
            columns.append(_column(element, what))
        elif isinstance(element, ast.Constraint) and element.contype == ConstrType.CONSTR_CHECK:
            table_checks.append(element)  # checked once every column is known
        elif isinstance(element, ast.Constraint):
            raise DefinitionError(f"{what}: {_constraint_label(element)} is not supported; a stream takes CHECK only")
        else:
            raise DefinitionError(f"{what}: only column definitions and CHECK constraints are allowed")
    if not columns:
        raise DefinitionError(f"{what}: no columns")
    names = [c.name for c in columns]
    if len(set(names)) != len(names):
        raise DefinitionError(f"{what}: a column is declared twice ({', '.join(names)})")
    checks = [_check(constraint, set(names), what, "table") for constraint in table_checks]
    options = _options(node.options, STREAM_OPTIONS, what, integers=True)
    by_name = {c.name: c for c in columns}

    topic = options.get("topic", name)
    if not TOPIC_NAME.match(topic) or topic in {".", ".."}:
        raise DefinitionError(f"{what}: topic {topic!r} is not a Kafka topic name ([A-Za-z0-9._-], 1 to 249)")
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
        into = _identifier(into, f"{what}: into")
        if into == name:
            raise DefinitionError(f"{what}: into names the stream itself")
        if key:
            raise DefinitionError(f"{what}: a stream with into has no key of its own (it takes {into}'s)")
    consumer_group = options.get("consumer_group")
    if consumer_group is not None and not re.fullmatch(r"[A-Za-z0-9._-]{1,200}", consumer_group):
        raise DefinitionError(f"{what}: consumer_group {consumer_group!r} is not a Kafka group name ([A-Za-z0-9._-])")
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
    )
    # Compiling the decoder evaluates every DEFAULT and compiles every CHECK: one it cannot evaluate
    # fails the definition now, not the first event. (Imported here: decoding imports this module.)
    from pipelines.cv.decoding import StreamDecoder

    StreamDecoder(stream)
    return stream


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


def _constraint_label(constraint: ast.Constraint) -> str:
    return _CONSTRAINT_NAMES.get(constraint.contype, constraint.contype.name.removeprefix("CONSTR_").replace("_", " "))


def _column(element: ast.ColumnDef, what: str) -> Column:
    name = _identifier(element.colname, f"{what}: column")
    where = f"{what}: column {name}"
    kind, typmods = resolve_type(element.typeName, where)
    for clause, label in (
        (element.collClause, "COLLATE"),
        (element.compression, "COMPRESSION"),
        (element.storage_name, "STORAGE"),
        (element.fdwoptions, "OPTIONS"),
        (element.raw_default, "DEFAULT"),
    ):
        if clause:
            raise DefinitionError(f"{where}: {label} is not supported")
    not_null: bool | None = None
    default = None
    checks = []
    for constraint in element.constraints or ():
        contype = constraint.contype
        if contype in (ConstrType.CONSTR_NULL, ConstrType.CONSTR_NOTNULL):
            if not_null is not None and not_null != (contype == ConstrType.CONSTR_NOTNULL):
                raise DefinitionError(f"{where}: NULL and NOT NULL contradict each other")
            not_null = contype == ConstrType.CONSTR_NOTNULL
        elif contype == ConstrType.CONSTR_DEFAULT:
            if default is not None:
                raise DefinitionError(f"{where}: DEFAULT is given twice")
            default = _default(constraint.raw_expr, where)
        elif contype == ConstrType.CONSTR_CHECK:
            checks.append(_check(constraint, {name}, where, "column"))
        else:
            raise DefinitionError(
                f"{where}: {_constraint_label(constraint)} is not supported; a stream column takes NOT NULL, NULL, "
                "DEFAULT and CHECK"
            )
    if not_null and default is not None and default.upper() == "NULL":
        raise DefinitionError(f"{where}: DEFAULT NULL on a NOT NULL column")
    return Column(name, RawStream()(element.typeName), kind, bool(not_null), default, typmods, tuple(checks))


def _check(constraint: ast.Constraint, columns: set[str], what: str, level: str) -> Check:
    label = f"CHECK ({RawStream()(constraint.raw_expr)})"
    if constraint.is_no_inherit or constraint.skip_validation or not constraint.is_enforced:
        raise DefinitionError(f"{what}: {label}: NO INHERIT, NOT VALID and NOT ENFORCED are not supported")
    name = _identifier(constraint.conname, f"{what}: constraint") if constraint.conname else None
    for child in _walk(constraint.raw_expr):
        if isinstance(child, ast.ColumnRef):
            ref = ".".join(f.sval if isinstance(f, ast.String) else "*" for f in child.fields)
            if ref not in columns:
                scope = (
                    f"a column CHECK may use only its own column ({next(iter(columns))}); write a table CHECK"
                    if level == "column"
                    else f"columns: {', '.join(sorted(columns))}"
                )
                raise DefinitionError(f"{what}: {label} uses {ref}, which it may not ({scope})")
    return Check(name, RawStream()(constraint.raw_expr))


def _default(node: ast.Node, what: str) -> str:
    """A DEFAULT's SQL text, when it is something decoding can evaluate without a database."""
    function = (
        isinstance(node, ast.FuncCall)
        and node.funcname[-1].sval in _DEFAULT_FUNCTIONS
        and (len(node.funcname) == 1 or node.funcname[0].sval == "pg_catalog")
        and not (node.args or node.agg_star or node.agg_distinct or node.over or node.agg_filter)
    )
    value_function = isinstance(node, ast.SQLValueFunction) and node.op in _DEFAULT_VALUE_FUNCTIONS
    if not (function or value_function or _is_constant(node)):
        raise DefinitionError(
            f"{what}: DEFAULT {RawStream()(node)} is not supported; a default is a constant (optionally cast), "
            "now(), current_timestamp, clock_timestamp() or current_date"
        )
    return RawStream()(node)


def _is_constant(node: object) -> bool:
    """A literal, maybe cast and negated: `5`, `'x'`, `NULL`, `'{}'::jsonb`, `-5::bigint`."""
    if isinstance(node, ast.A_Const):
        return True
    if isinstance(node, ast.TypeCast):
        return _is_constant(node.arg)
    return _is_negation(node) and _is_constant(node.rexpr)


def _is_negation(node: object) -> bool:
    return isinstance(node, ast.A_Expr) and node.lexpr is None and node.name[-1].sval == "-"


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


def _view(node: ast.ViewStmt, text: str, streams: dict[str, StreamDef]) -> ViewDef:
    schema = _identifier(node.view.schemaname or "public", "CREATE CONTINUOUS VIEW")
    name = _identifier(node.view.relname, "CREATE CONTINUOUS VIEW")
    what = f"continuous view {schema}.{name}"
    options = _options(node.options, {"ttl"}, what)
    select = node.query
    if not isinstance(select, ast.SelectStmt) or select.op != SetOperation.SETOP_NONE:
        raise DefinitionError(f"{what}: the query must be a single SELECT (no UNION/INTERSECT/EXCEPT)")
    for clause, label in (
        (select.withClause, "WITH"),
        (select.havingClause, "HAVING"),
        (select.sortClause, "ORDER BY"),
        (select.limitCount, "LIMIT"),
        (select.limitOffset, "OFFSET"),
        (select.windowClause, "WINDOW"),
        (select.distinctClause, "SELECT DISTINCT"),
        (select.lockingClause, "FOR UPDATE/SHARE"),
        (node.aliases, "column aliases"),
    ):
        if clause:
            raise DefinitionError(f"{what}: {label} is not supported in a continuous view")
    stream = _from_stream(select, streams, what)
    columns = set(stream.column_names)
    targets = {}
    aggregates, plain = [], []
    for target in select.targetList:
        if isinstance(target.val, ast.ColumnRef) and isinstance(target.val.fields[-1], ast.A_Star):
            raise DefinitionError(f"{what}: SELECT * is not supported; name the columns")
        aggregate = _aggregate(target, what)
        if aggregate:
            _check_expression(target.val.args or (), columns, what)
            aggregates.append(aggregate)
        else:
            _check_expression((target.val,), columns, what)
            plain.append(target)
        out = aggregate.name if aggregate else _output_name(target, what)
        if out in targets:
            raise DefinitionError(f"{what}: two output columns are named {out!r}")
        targets[out] = target
    if not aggregates:
        raise DefinitionError(f"{what}: no aggregate; a continuous view aggregates its stream")
    groups = _groups(select, plain, columns, what)
    if select.whereClause is not None:
        _check_expression((select.whereClause,), columns, what)
    view = ViewDef(
        schema=schema,
        name=name,
        stream=stream.name,
        groups=groups,
        aggregates=tuple(aggregates),
        where_sql=RawStream()(select.whereClause) if select.whereClause is not None else None,
        ttl=options.get("ttl"),
        definition=text,
        options=options,
    )
    _check_semantics(view, stream, what)
    return view


def _from_stream(select: ast.SelectStmt, streams: dict[str, StreamDef], what: str) -> StreamDef:
    if not select.fromClause or len(select.fromClause) != 1 or not isinstance(select.fromClause[0], ast.RangeVar):
        raise DefinitionError(f"{what}: FROM must name exactly one stream (no joins or subqueries)")
    relation = select.fromClause[0]
    if relation.alias is not None:
        raise DefinitionError(f"{what}: aliases on the stream are not supported")
    stream = streams.get(relation.relname)
    if relation.schemaname or stream is None:
        known = ", ".join(sorted(streams)) or "none"
        raise DefinitionError(f"{what}: {RawStream()(relation)} is not a stream (streams: {known})")
    return stream


SUPPORTED_AGGREGATES = (
    "count(*), count(x), count(DISTINCT x), sum(x), min(x), max(x), array_agg(DISTINCT x), hll_add_agg(x)"
)
MAINTAINED_AGGREGATES = frozenset({"count", "sum", "min", "max", "array_agg", "hll_add_agg"})
# PostgreSQL aggregates the engine cannot maintain incrementally: named so the error says "not supported".
OTHER_AGGREGATES = frozenset(
    {
        "avg",
        "bit_and",
        "bit_or",
        "bit_xor",
        "bool_and",
        "bool_or",
        "every",
        "json_agg",
        "jsonb_agg",
        "json_object_agg",
        "jsonb_object_agg",
        "string_agg",
        "xmlagg",
        "range_agg",
        "range_intersect_agg",
        "stddev",
        "stddev_pop",
        "stddev_samp",
        "variance",
        "var_pop",
        "var_samp",
        "corr",
        "covar_pop",
        "covar_samp",
        "regr_avgx",
        "regr_avgy",
        "regr_count",
        "regr_intercept",
        "regr_r2",
        "regr_slope",
        "regr_sxx",
        "regr_sxy",
        "regr_syy",
        "mode",
        "percentile_cont",
        "percentile_disc",
        "rank",
        "dense_rank",
        "percent_rank",
        "cume_dist",
        "hll_union_agg",
        "any_value",
    }
)


def _aggregate(target: ast.ResTarget, what: str) -> Aggregate | None:
    call = target.val
    if not isinstance(call, ast.FuncCall):
        return None
    fname = ".".join(n.sval for n in call.funcname).lower().removeprefix("pg_catalog.")
    label = RawStream()(call)
    if call.over is not None:
        raise DefinitionError(f"{what}: {label}: window functions are not supported")
    if fname in OTHER_AGGREGATES:
        raise DefinitionError(f"{what}: {label} is not supported; supported: {SUPPORTED_AGGREGATES}")
    if fname not in MAINTAINED_AGGREGATES:
        return None
    if call.over is not None or call.agg_filter is not None or call.agg_order or call.agg_within_group:
        raise DefinitionError(f"{what}: {label}: OVER, FILTER, ORDER BY and WITHIN GROUP are not supported")
    if not target.name:
        raise DefinitionError(f"{what}: {label} needs a name: {label} AS <column>")
    name = _identifier(target.name, what)
    args = call.args or ()
    if call.agg_star:
        if fname != "count":
            raise DefinitionError(f"{what}: {label}: only count takes *")
        return Aggregate(name, "count")
    if len(args) != 1:
        raise DefinitionError(f"{what}: {label} takes exactly one argument")
    arg = RawStream()(args[0])
    kinds = {
        ("count", False): "count",
        ("count", True): "count_distinct",
        ("sum", False): "sum",
        ("min", False): "min",
        ("max", False): "max",
        ("array_agg", True): "set",
        ("hll_add_agg", False): "hll",
    }
    kind = kinds.get((fname, bool(call.agg_distinct)))
    if kind is None:
        hint = " (only array_agg(DISTINCT x) keeps a set)" if fname == "array_agg" else ""
        raise DefinitionError(f"{what}: {label} is not supported{hint}; supported: {SUPPORTED_AGGREGATES}")
    if kind == "count":
        return Aggregate(name, "count", arg)
    return Aggregate(name, kind, arg)  # type: ignore[arg-type]


def _output_name(target: ast.ResTarget, what: str) -> str:
    if target.name:
        return _identifier(target.name, what)
    if isinstance(target.val, ast.ColumnRef) and len(target.val.fields) == 1:
        return target.val.fields[0].sval
    raise DefinitionError(f"{what}: {RawStream()(target.val)} needs a name: ... AS <column>")


def _groups(
    select: ast.SelectStmt, plain: list[ast.ResTarget], columns: set[str], what: str
) -> tuple[GroupColumn, ...]:
    by_name = {_output_name(t, what): t for t in plain}
    by_text = {RawStream()(t.val): t for t in plain}
    grouped = []
    for item in select.groupClause or ():
        if not isinstance(item, ast.Node) or isinstance(item, ast.GroupingSet):
            raise DefinitionError(f"{what}: GROUPING SETS, ROLLUP and CUBE are not supported")
        text = RawStream()(item)
        target = by_text.get(text)
        is_name = isinstance(item, ast.ColumnRef) and len(item.fields) == 1
        if target is None and is_name and item.fields[0].sval not in columns:
            # As in PostgreSQL, a name is a stream column first and only otherwise an output alias.
            target = by_name.get(item.fields[0].sval)
        if target is None:
            raise DefinitionError(f"{what}: GROUP BY {text} must also be an output column")
        if target in grouped:
            raise DefinitionError(f"{what}: GROUP BY names {text} twice")
        grouped.append(target)
    missing = [RawStream()(t.val) for t in plain if t not in grouped]
    if missing:
        raise DefinitionError(f"{what}: {', '.join(missing)} must appear in GROUP BY or be aggregated")
    if not grouped:
        raise DefinitionError(f"{what}: GROUP BY is required (a view is keyed by its groups)")
    result = []
    for target in grouped:
        name = _output_name(target, what)
        source = target.val.fields[0].sval if isinstance(target.val, ast.ColumnRef) else None
        result.append(GroupColumn(name, RawStream()(target.val), source, _bucket_unit(target.val, columns)))
    return tuple(result)


def _bucket_unit(node: ast.Node, columns: set[str]) -> str | None:
    """`date_trunc('hour', ts)` over a stream column is a time bucket of unit 'hour'."""
    if not isinstance(node, ast.FuncCall) or [n.sval for n in node.funcname][-1] != "date_trunc":
        return None
    args = node.args or ()
    if len(args) == 2 and isinstance(args[0], ast.A_Const) and isinstance(args[0].val, ast.String):
        unit = args[0].val.sval.lower()
        if unit in BUCKET_UNITS and isinstance(args[1], ast.ColumnRef) and args[1].fields[-1].sval in columns:
            return unit
    return None


def _check_expression(nodes: tuple, columns: set[str], what: str) -> None:
    """Only stream columns, constants, operators and non-aggregate function calls may appear."""
    for node in nodes:
        for child in _walk(node):
            if isinstance(child, ast.ColumnRef):
                ref = ".".join(f.sval for f in child.fields if isinstance(f, ast.String))
                if len(child.fields) != 1 or ref not in columns:
                    raise DefinitionError(f"{what}: {ref} is not a column of the stream ({', '.join(sorted(columns))})")
            elif isinstance(child, (ast.SubLink, ast.RangeSubselect)):
                raise DefinitionError(f"{what}: subqueries are not supported in a continuous view")
            elif isinstance(child, ast.FuncCall) and child.over is not None:
                raise DefinitionError(f"{what}: window functions are not supported")
            elif isinstance(child, ast.FuncCall) and child.funcname[-1].sval.lower() in (
                MAINTAINED_AGGREGATES | OTHER_AGGREGATES
            ):
                raise DefinitionError(
                    f"{what}: {RawStream()(child)}: an aggregate must be a whole output column, not part of an "
                    "expression, a WHERE clause or another aggregate's argument"
                )
            elif isinstance(child, ast.ParamRef):
                raise DefinitionError(f"{what}: parameters ($n) are not supported")


def _walk(node: object):
    if isinstance(node, ast.Node):
        yield node
        for name in node:
            yield from _walk(getattr(node, name))
    elif isinstance(node, tuple):
        for item in node:
            yield from _walk(item)


def _check_semantics(view: ViewDef, stream: StreamDef, what: str) -> None:
    keyed = stream.key is not None
    for aggregate in view.aggregates:
        if aggregate.kind in {"min", "max"} and keyed:
            raise DefinitionError(
                f"{what}: {aggregate.kind}() needs an append-only stream; {stream.name} has a key, "
                "so rows can be retracted and the old extreme would be unknown"
            )
    distinct_args = {a.arg_sql for a in view.aggregates if a.kind in DISTINCT_KINDS}
    if len(distinct_args) > 1:
        raise DefinitionError(
            f"{what}: DISTINCT aggregates over different expressions ({', '.join(sorted(distinct_args))}) in one "
            "view are not supported; define one view per expression"
        )
    if view.ttl is not None and view.bucket is None:
        raise DefinitionError(f"{what}: ttl needs a time bucket in GROUP BY, e.g. date_trunc('hour', ts)")
