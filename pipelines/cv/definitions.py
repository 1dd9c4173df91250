"""Stream and continuous-view definitions: parsed from SQL with PostgreSQL's own parser (pglast).

Two statements are understood, in the spirit of PipelineDB:

    CREATE STREAM likes (oid bigint, uid bigint, ts timestamptz)
        WITH (topic = 'likes', key = 'oid, uid');
    CREATE CONTINUOUS VIEW social.object_likes [WITH (ttl = '30 days')] AS
        SELECT oid, count(*) AS like_count, array_agg(DISTINCT uid) AS likers
        FROM likes [WHERE ...] GROUP BY oid;

A stream with a `key` is a *set* of rows: an insert of a present key and a delete of an absent key
change nothing, and a delete retracts the row from every view. A stream without a key is
append-only. The parser checks everything it can without a database and raises `DefinitionError`
naming what is unsupported; types are resolved later, by PostgreSQL, when the view is compiled.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

import pglast
from pglast import ast
from pglast.enums import SetOperation
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


@dataclass(frozen=True)
class Column:
    """A stream column."""

    name: str
    type: str


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


def _options(defs: tuple | None, allowed: set[str], what: str) -> dict[str, str]:
    options = {}
    for item in defs or ():
        if item.defname not in allowed:
            raise DefinitionError(f"{what}: unknown option {item.defname!r}; known: {', '.join(sorted(allowed))}")
        if not isinstance(item.arg, ast.String):
            raise DefinitionError(f"{what}: option {item.defname} takes a quoted string")
        if item.defname in options:
            raise DefinitionError(f"{what}: option {item.defname} is given twice")
        options[item.defname] = item.arg.sval
    return options


def _identifier(name: str, what: str) -> str:
    if not IDENTIFIER.match(name):
        raise DefinitionError(f"{what}: {name!r} is not a plain lower-case identifier")
    return name


def _stream(node: ast.CreateStmt, text: str) -> StreamDef:
    if node.relation.schemaname:
        raise DefinitionError("CREATE STREAM: stream names are not schema-qualified")
    name = _identifier(node.relation.relname, "CREATE STREAM")
    columns = []
    for element in node.tableElts or ():
        if not isinstance(element, ast.ColumnDef):
            raise DefinitionError(f"CREATE STREAM {name}: only column definitions are allowed")
        if element.constraints:
            raise DefinitionError(f"CREATE STREAM {name}: column {element.colname} has a constraint; streams take none")
        columns.append(Column(_identifier(element.colname, f"stream {name}"), RawStream()(element.typeName)))
    if not columns:
        raise DefinitionError(f"CREATE STREAM {name}: no columns")
    names = [c.name for c in columns]
    if len(set(names)) != len(names):
        raise DefinitionError(f"CREATE STREAM {name}: a column is declared twice ({', '.join(names)})")
    options = _options(node.options, {"topic", "key"}, f"CREATE STREAM {name}")
    if "topic" not in options:
        raise DefinitionError(f"CREATE STREAM {name}: WITH (topic = '...') is required")
    key = None
    if "key" in options:
        key = tuple(part.strip() for part in options["key"].split(",") if part.strip())
        unknown = [k for k in key if k not in {c.name for c in columns}]
        if not key or unknown:
            raise DefinitionError(f"CREATE STREAM {name}: key names unknown columns {unknown or options['key']!r}")
        if len(set(key)) != len(key):
            raise DefinitionError(f"CREATE STREAM {name}: key names a column twice ({options['key']})")
    return StreamDef(name, options["topic"], tuple(columns), key, text)


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
