"""The model: streams and continuous views as data, and the naming rules of what they store.

Every layer of the engine reads these dataclasses; this module imports nothing else of the package.
How a statement becomes one of them is the front end's (pipelines.cv.frontend); what PostgreSQL keeps
for them is the catalog's (pipelines.cv.catalog). Two statements are understood, in the spirit of
PipelineDB:

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
append-only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Literal

from pipelines.errors import StreamviewsError

AggregateKind = Literal[
    "count",
    "count_distinct",
    "sum",
    "min",
    "max",
    "set",
    "hll",
    "tdigest",
    "topk",
    "bucket",
    "state",
    "keyed",
    "first",
    "append",
    "bloom",
    "freq",
    "combined",  # combine() of an upstream view's summary, recomputed per group (pipelines.cv.views.combine)
]
# Aggregates that cannot forget a value: a retraction leaves them as they are.
MONOTONIC: frozenset[str] = frozenset(
    {"hll", "tdigest", "topk", "state", "keyed", "first", "append", "bloom", "freq", "bucket"}
)
DISTINCT_KINDS: frozenset[str] = frozenset({"count_distinct", "set"})
# How a boolean view option (`changes`) may be spelled, as PostgreSQL's reloptions take them.
TRUE_WORDS: frozenset[str] = frozenset({"true", "on", "yes", "1"})
BOOLEAN_WORDS: frozenset[str] = TRUE_WORDS | frozenset({"false", "off", "no", "0"})
IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]*")  # whole names only (fullmatch: `$` would pass a final newline)
# C0 and C1 control characters and DEL: never in a name, a topic or an option's value.
CONTROL_CHARACTER = re.compile(r"[\x00-\x1f\x7f-\x9f]")


class DefinitionError(StreamviewsError):
    """A stream or view definition is invalid or uses something the engine does not support."""


StreamFormat = Literal["json", "csv", "debezium"]
# The column types a stream can declare, by the name decoding knows them under
# (see pipelines.cv.sqltext.types.TYPE_NAMES).
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
    "input",  # any other type: the field's JSON text, typed by PostgreSQL's input (pipelines.cv.sqltext.types)
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


# How a column of a view whose rows only grow moves (StreamDef.grows, pipelines.cv.views.growth).
GROWS_UP = "up"  # never decreases: a count, a max
GROWS_DOWN = "down"  # never increases: a min
FIXED = "fixed"  # a group column: the row's key


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
    start_offset: str = "earliest"  # where its first consumption starts: earliest, latest or a timestamptz
    retention: str | None = None  # its topic's retention.ms, as an interval (None: the broker's default)
    retention_bytes: str | None = None  # its topic's retention.bytes per partition, as a size ('10 GB')
    # A view read as a stream (pipelines.cv.frontend.view_sources): the view whose change stream feeds
    # it; such a stream has no topic of its own, the runner's feeds (pipelines.cv.feeds) apply it.
    feed_of: str | None = None
    # A view's rows read as a stream whose rows only grow (pipelines.cv.views.growth): (column, way)
    # for each of its columns that moves one way only (GROWS_UP, GROWS_DOWN, FIXED); empty when the
    # upstream's rows may be deleted.
    grows: tuple[tuple[str, str], ...] = ()

    @property
    def is_feed(self) -> bool:
        """True for a view read as a stream: fed from PostgreSQL (cv.view_changes), never from Kafka."""
        return self.feed_of is not None

    @property
    def feeds_changes(self) -> bool:
        """True for `output_of(view)`: (old, new, delta) per change. Its feed's name says so (view_sources)."""
        return self.feed_of is not None and self.name.startswith("output_of(")

    @property
    def feeds_appends(self) -> bool:
        """True for a transform read as a stream: each change its new row, appended (no key, not output_of)."""
        return self.feed_of is not None and self.key is None and not self.feeds_changes

    @property
    def start_at(self) -> str | int:
        """The start rule as the runtime takes it: 'earliest', 'latest', or the timestamp in epoch ms."""
        if self.start_offset in ("earliest", "latest"):
            return self.start_offset
        return int(datetime.fromisoformat(self.start_offset).timestamp() * 1000)

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
class JoinedTable:
    """One table the stream's events are joined with, in the order written.

    Attributes:
        table: The table (or PostgreSQL view), schema-qualified as written (SQL text).
        alias: What the view's expressions call it (its alias, or its name).
        left: LEFT JOIN: events without a matching row count with NULLs; otherwise they are skipped.
        on_sql: The join condition (over the stream and the tables joined before it).
    """

    table: str
    alias: str
    left: bool
    on_sql: str


@dataclass(frozen=True)
class Join:
    """`FROM stream [AS s] [LEFT] JOIN t1 ON ... [LEFT] JOIN t2 ON ...`: each event enriched at ingest from tables.

    Attributes:
        stream_alias: What the view's expressions call the stream (its alias, or its name).
        tables: The tables, joined in this order after the stream.
    """

    stream_alias: str
    tables: tuple[JoinedTable, ...]

    @property
    def aliases(self) -> tuple[str, ...]:
        """The tables' names in the view's expressions."""
        return tuple(t.alias for t in self.tables)

    @property
    def conditions(self) -> list[str]:
        """Every join condition (SQL text), in order."""
        return [t.on_sql for t in self.tables]


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
    def records_changes(self) -> bool:
        """True when the view keeps a change stream (`WITH (changes = true)`; see migration 0020)."""
        return self.options.get("changes", "false").lower() in TRUE_WORDS

    @property
    def bucket(self) -> GroupColumn | None:
        """The time-bucket group column, if any (what a TTL applies to)."""
        return next((g for g in self.groups if g.bucket_unit), None)

    @property
    def distinct_arg(self) -> str | None:
        """The first expression a DISTINCT aggregate of this view is over (see `distinct_args`)."""
        return next((a.arg_sql for a in self.aggregates if a.kind in DISTINCT_KINDS), None)

    @property
    def distinct_args(self) -> tuple[str, ...]:
        """Every expression this view's DISTINCT aggregates are over, in order of first use.

        Each keeps reference counts of its own (`<storage>__refs`, `__refs2`, ...): one value column a table.
        """
        return tuple(dict.fromkeys(a.arg_sql or "" for a in self.aggregates if a.kind in DISTINCT_KINDS))

    @property
    def is_monotonic(self) -> bool:
        """True when a group must be kept even after all its rows are retracted."""
        return any(a.kind in MONOTONIC for a in self.aggregates)


@dataclass(frozen=True)
class Scope:
    """What a statement is read against: the streams defined so far and the database's own aggregates.

    Both are facts of the database, so both are required: a view read without the user aggregates
    would refuse one of them. The catalog builds it (pipelines.cv.catalog.store.scope); a test or a
    tool that has no database names both itself.

    Attributes:
        streams: The streams a view may read, by name.
        user_aggregates: Aggregates the database defines beyond the built-in ones, bare and
            schema-qualified (`mode_of`, `public.mode_of`).
        count_distinct_nulls: False to read a view stored before array_agg(DISTINCT x) counted the
            rows whose x is NULL: its storage has no column for them, and keeps none.
    """

    streams: Mapping[str, StreamDef]
    user_aggregates: frozenset[str]
    count_distinct_nulls: bool = True
    # Every continuous view as another view may read it (`FROM schema.view`), by name: the keyed
    # feed stream of its current rows (pipelines.cv.frontend.view_sources). Empty: no view is read.
    views: Mapping[str, StreamDef] = field(default_factory=dict)

    def with_stream(self, stream: StreamDef) -> Scope:
        """This scope once `stream` is defined (or redefined)."""
        return replace(self, streams={**self.streams, stream.name: stream})

    def without_stream(self, name: str) -> Scope:
        """This scope once stream `name` is dropped."""
        return replace(self, streams={k: v for k, v in self.streams.items() if k != name})


@dataclass(frozen=True)
class TransformDef:
    """A continuous transform: each event of an append-only stream that passes, projected, as a change stream.

    Its output is recorded in cv.view_changes under its name (before NULL, after the projected row),
    where sinks and views read it as they read a view's changes (migration 0026).

    Attributes:
        outputs: The projected columns, in select-list order: `Output(name, expression)`.
        where_sql: The filter over the stream's (and the joined table's) columns.
        join: The table each event is enriched from, at ingest.
        key: The output columns a change's key is made of (`WITH (key = 'a, b')`); None: its position.
        into: PipelineDB's `outputfunc = pipelinedb.insert_into_stream('s')`: the stream each output
            row is also written into, with its columns in the outputs' order; None: none.
    """

    schema: str
    name: str
    stream: str
    outputs: tuple[Output, ...]
    where_sql: str | None
    definition: str
    join: Join | None = None
    key: tuple[str, ...] | None = None
    into: tuple[str, tuple[str, ...]] | None = None  # (stream, its columns)

    @property
    def qualified_name(self) -> str:
        """`schema.name` as stored in the catalog (and as its change stream is named)."""
        return f"{self.schema}.{self.name}"
