"""CREATE CONTINUOUS VIEW parsed: one SELECT over one stream, its groups, aggregates, filter and retention.

    CREATE CONTINUOUS VIEW social.object_likes [WITH (ttl = '30 days')] AS
        SELECT oid, count(*) AS like_count, array_agg(DISTINCT uid) AS likers
        FROM likes [WHERE ...] GROUP BY oid;

Everything is checked that can be without a database: the expressions may use only the stream's
columns, and every output column is a GROUP BY column or an aggregate the engine maintains (see
SUPPORTED_AGGREGATES). Their types are resolved later, by PostgreSQL, when the view is compiled.
"""

from __future__ import annotations

from pglast import ast
from pglast.enums import SetOperation
from pglast.stream import RawStream

from pipelines.cv.definitions import (
    DISTINCT_KINDS,
    Aggregate,
    DefinitionError,
    GroupColumn,
    StreamDef,
    ViewDef,
    options_of,
    plain_identifier,
    reject_unsupported,
    walk,
)

BUCKET_UNITS = ("second", "minute", "hour", "day", "week", "month", "year")


def parse_view(node: ast.ViewStmt, text: str, streams: dict[str, StreamDef]) -> ViewDef:
    """The view a CREATE CONTINUOUS VIEW declares (parsed as CREATE VIEW) over one of `streams`."""
    schema = plain_identifier(node.view.schemaname or "public", "CREATE CONTINUOUS VIEW")
    name = plain_identifier(node.view.relname, "CREATE CONTINUOUS VIEW")
    what = f"continuous view {schema}.{name}"
    options = options_of(node.options, {"ttl"}, what)
    select = node.query
    if not isinstance(select, ast.SelectStmt) or select.op != SetOperation.SETOP_NONE:
        raise DefinitionError(f"{what}: the query must be a single SELECT (no UNION/INTERSECT/EXCEPT)")
    reject_unsupported(
        (
            (select.withClause, "WITH"),
            (select.havingClause, "HAVING"),
            (select.sortClause, "ORDER BY"),
            (select.limitCount, "LIMIT"),
            (select.limitOffset, "OFFSET"),
            (select.windowClause, "WINDOW"),
            (select.distinctClause, "SELECT DISTINCT"),
            (select.lockingClause, "FOR UPDATE/SHARE"),
            (node.aliases, "column aliases"),
        ),
        what,
        " in a continuous view",
    )
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
    name = plain_identifier(target.name, what)
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
        return plain_identifier(target.name, what)
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
        for child in walk(node):
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
