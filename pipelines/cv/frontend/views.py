"""CREATE CONTINUOUS VIEW parsed: one SELECT over one stream, its groups, aggregates, filter and retention.

    CREATE CONTINUOUS VIEW social.object_likes [WITH (ttl = '30 days')] AS
        SELECT oid, count(*) AS like_count, array_agg(DISTINCT uid) AS likers
        FROM likes [WHERE ...] GROUP BY oid;

Everything is checked that can be without a database: the expressions may use only the stream's
columns, and every output column is a GROUP BY column or an expression over aggregate calls the
engine can keep (pipelines.cv.frontend.aggregate_calls turns each call into stored aggregates and a reader).
Types are resolved later, by PostgreSQL, when the view is compiled.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pglast import ast
from pglast.enums import SetOperation
from pglast.stream import RawStream

from pipelines.cv.frontend import combine
from pipelines.cv.frontend.aggregate_calls import Stored, is_aggregate_call, read_as_stored, translate
from pipelines.cv.frontend.backfill import check_backfill_option
from pipelines.cv.frontend.buckets import bucket_unit
from pipelines.cv.frontend.hypothetical import rewrite_hypothetical
from pipelines.cv.frontend.view_options import check_pk, ttl_column, view_options
from pipelines.cv.frontend.view_shapes import (
    EACH_ROW_GROUP,
    GLOBAL_GROUP,
    from_stream,
    hidden_group,
)
from pipelines.cv.frontend.windows import option_window, split_window, step_group
from pipelines.cv.model import (
    BOOLEAN_WORDS,
    MAX_VIEW_NAME,
    TRUE_WORDS,
    Aggregate,
    AggregateCall,
    DefinitionError,
    GroupColumn,
    Join,
    Output,
    Scope,
    StreamDef,
    ViewDef,
    call_placeholder,
)
from pipelines.cv.sqltext.parsing import figure_name, plain_identifier, reject_unsupported, replace_nodes, walk


def parse_view(node: ast.ViewStmt, text: str, scope: Scope) -> ViewDef:
    """The view a CREATE CONTINUOUS VIEW declares (parsed as CREATE VIEW) over one of the scope's streams.

    The scope's user aggregates are the aggregates defined in the database beyond the built-in ones
    (kept as their transition state; see pipelines.cv.frontend.aggregate_calls).
    """
    user_aggregates = scope.user_aggregates
    schema = plain_identifier(node.view.schemaname or "public", "CREATE CONTINUOUS VIEW")
    name = plain_identifier(node.view.relname, "CREATE CONTINUOUS VIEW")
    what = f"continuous view {schema}.{name}"
    if len(schema) + len(name) > MAX_VIEW_NAME:
        raise DefinitionError(f"{what}: schema and view names together may take {MAX_VIEW_NAME} characters")
    options = view_options(node.options, what)
    select = node.query
    if not isinstance(select, ast.SelectStmt) or select.op != SetOperation.SETOP_NONE:
        raise DefinitionError(f"{what}: the query must be a single SELECT (no UNION/INTERSECT/EXCEPT)")
    read_then = "apply it when reading the view: SELECT ... FROM <view>"
    reject_unsupported(
        (
            (select.withClause, "WITH (define its query as a continuous view or transform, and read that)"),
            (select.havingClause, f"HAVING ({read_then} WHERE ...)"),
            (select.sortClause, f"ORDER BY ({read_then} ORDER BY ...)"),
            (select.limitCount, f"LIMIT ({read_then} LIMIT ...)"),
            (select.limitOffset, f"OFFSET ({read_then} OFFSET ...)"),
            (select.windowClause, "WINDOW (window functions run when reading the view)"),
            (select.lockingClause, "FOR UPDATE/SHARE"),
            (node.aliases, "column aliases (name each output: expression AS name)"),
        ),
        what,
        " in a continuous view",
    )
    rewrite_hypothetical(select, what)  # rank(c) WITHIN GROUP (ORDER BY x): the counts it is
    _distinct_as_groups(select, what)
    combining = combine.uses_combine(select)  # reads its upstream's states feed (pipelines.cv.frontend.combine)
    stream, join = from_stream(select, combine.scope_for(scope) if combining else scope, what)
    if combining:
        stream = combine.states_source(stream, scope.streams, scope.views, what)
    columns = set(stream.column_names)
    names = _Names(columns, join)
    if join is not None:
        _check_expression(tuple(select.fromClause), names, what, user_aggregates)
    outputs: list[tuple[str, ast.ResTarget, bool]] = []  # (name, target, is an aggregate expression)
    plain = []
    for target in select.targetList:
        if isinstance(target.val, ast.ColumnRef) and isinstance(target.val.fields[-1], ast.A_Star):
            raise DefinitionError(f"{what}: SELECT * is not supported; name the columns")
        calls = _aggregate_calls(target.val, user_aggregates)
        if not calls:
            _check_expression((target.val,), names, what, user_aggregates)
            plain.append(target)
        out = _output_name(target, what, bool(calls), ANONYMOUS)
        if any(out == o for o, _, _ in outputs):
            raise DefinitionError(f"{what}: two output columns are named {out!r}")
        outputs.append((out, target, bool(calls)))
    # No aggregate and no GROUP BY: PipelineDB's non-aggregating view, the stream's rows (of its window).
    each_row = not any(is_aggregate for _, _, is_aggregate in outputs) and not select.groupClause
    if each_row:
        select.groupClause = tuple(ast.A_Const(val=ast.Integer(ival=i + 1)) for i in range(len(outputs)))
    elif not select.groupClause:  # one row: a constant output (`SELECT 1, count(*)`) is computed on read
        constant = [t for t in plain if not any(isinstance(c, ast.ColumnRef) for c in walk(t.val))]
        plain = [t for t in plain if t not in constant]
        outputs = [(o, t, is_aggregate or t in constant) for o, t, is_aggregate in outputs]
    window, where = split_window(select.whereClause, stream, what, join.stream_alias if join else None)
    window = option_window(options, window, stream, what)
    kept = _KeptCalls(
        what, names, user_aggregates, stream, windowed=window is not None, count_nulls=scope.count_distinct_nulls
    )
    expressions = {out: kept.replace(target.val, out) for out, target, is_aggregate in outputs if is_aggregate}
    groups = _groups(select, plain, names, set(expressions), what, window is not None, user_aggregates)
    if each_row:  # each distinct row a group, read back as many times as it was counted
        groups = (*groups, EACH_ROW_GROUP)
    if window is not None:
        if "ttl" in options:
            raise DefinitionError(f"{what}: a sliding window keeps only its width; ttl does not apply")
        groups = (*groups, step_group(window))
    groups = ttl_column(groups, options, stream, what)
    check_pk(options, groups, what)
    check_changes_option(options, window is not None, what)
    if where is not None:
        _check_expression((where,), names, what, user_aggregates)
    read: list[Output] = []
    group_names = {g.name for g in groups if not g.name.startswith("_cv_")}  # the storage's own are not shown
    for out, _, is_aggregate in outputs:
        if is_aggregate:
            _check_over_groups(expressions[out], group_names, out, what)
            read.append(Output(out, RawStream()(expressions[out])))
        else:
            read.append(Output(out, out, is_group=True))
    stored, calls = kept.stored, kept.calls
    aggregates = tuple(
        Aggregate(column, item.kind, item.arg_sql, item.filter_sql, item.params) for item, column in stored.items()
    )
    check_backfill_option(options, stream, aggregates, what)
    combine.check_combined(aggregates, what)
    view = ViewDef(
        schema=schema,
        name=name,
        stream=stream.name,
        groups=groups,
        aggregates=aggregates,
        where_sql=RawStream()(where) if where is not None else None,
        ttl=options.get("ttl"),
        definition=text,
        options=options,
        outputs=tuple(read),
        calls=tuple(calls),
        window=window,
        join=join,
    )
    _check_semantics(view, what)
    return view


def _distinct_as_groups(select: ast.SelectStmt, what: str) -> None:
    """`SELECT DISTINCT a, b FROM s` is `SELECT a, b FROM s GROUP BY a, b`: each distinct row a group."""
    if not select.distinctClause:
        return
    if select.distinctClause != (None,):
        raise DefinitionError(
            f"{what}: DISTINCT ON keeps the row first in an order, which a stream does not have; keep the "
            "value of the latest row with keyed_max(ts, x) ... GROUP BY <the DISTINCT ON expressions>"
        )
    if select.groupClause or any(_aggregate_calls(t.val, frozenset()) for t in select.targetList or ()):
        raise DefinitionError(f"{what}: SELECT DISTINCT over aggregates is not supported; drop DISTINCT")
    select.groupClause = tuple(ast.A_Const(val=ast.Integer(ival=i + 1)) for i in range(len(select.targetList or ())))


class _KeptCalls:
    """The aggregate calls of a view's outputs, translated: what each stores (once) and reads."""

    def __init__(
        self,
        what: str,
        names: _Names,
        user_aggregates: frozenset[str],
        stream: StreamDef,
        *,
        windowed: bool,
        count_nulls: bool,
    ) -> None:
        self.what, self.names, self.user_aggregates, self.stream = what, names, user_aggregates, stream
        self.windowed, self.count_nulls = windowed, count_nulls
        self.stored: dict[Stored, str] = {}  # each stored aggregate once, however many calls read it
        self.calls: list[AggregateCall] = []

    def replace(self, expression: ast.Node, out: str) -> ast.Node:
        """The output expression with each call replaced by its placeholder."""
        whole = isinstance(expression, ast.FuncCall)
        users = self.user_aggregates
        return replace_nodes(
            expression, lambda node: self.keep(node, out, whole) if is_aggregate_call(node, users) else None
        )

    def keep(self, call: ast.FuncCall, out: str, whole: bool) -> ast.ColumnRef:
        """Translate one call, record what it stores and reads; its placeholder takes its place."""
        what = self.what
        for child in (*(call.args or ()), call.agg_filter, *(s.node for s in call.agg_order or ())):
            if child is not None:
                _check_expression((child,), self.names, what, self.user_aggregates)
        never_null = frozenset(self.stream.key or ())
        call_sql = RawStream()(call)
        if call.funcname[-1].sval.lower() == combine.COMBINE:
            translation, call_sql = combine.translate_combine(call, self.stream, what, windowed=self.windowed)
        else:
            translation = translate(
                call, what, windowed=self.windowed, never_null=never_null, count_nulls=self.count_nulls
            )
        # kept: a retraction leaves the sketch as it is
        sketch = translation.function in {"hll_add_agg", "hll_union_agg", "hll_agg"}
        if self.stream.key is not None and not translation.retractable and not sketch:
            raise DefinitionError(_not_retractable(RawStream()(call), self.stream.name, what))
        names = []
        for item in translation.stored:
            if item not in self.stored:
                own = whole and translation.reader is read_as_stored and out not in self.stored.values()
                plain = "column" if out == ANONYMOUS else out
                self.stored[item] = out if own else f"_cv_{plain}_{len(self.stored)}"
            names.append(self.stored[item])
        self.calls.append(AggregateCall(translation.function, call_sql, tuple(names)))
        return ast.ColumnRef(fields=(ast.String(sval=call_placeholder(len(self.calls) - 1)),))


def _aggregate_calls(node: ast.Node, user_aggregates: frozenset[str]) -> list[ast.FuncCall]:
    """The aggregate calls of an expression (not looking inside them)."""
    if is_aggregate_call(node, user_aggregates):
        return [node]
    if isinstance(node, ast.Node):
        return [c for name in node for c in _aggregate_calls(getattr(node, name), user_aggregates)]
    if isinstance(node, tuple):
        return [c for item in node for c in _aggregate_calls(item, user_aggregates)]
    return []


def _check_over_groups(node: ast.Node, group_names: set[str], out: str, what: str) -> None:
    """Outside its aggregate calls, an output may use only group columns (by their output names)."""
    for child in walk(node):
        if isinstance(child, ast.ColumnRef):
            ref = ".".join(f.sval for f in child.fields if isinstance(f, ast.String))
            if ref.startswith("_cv_call_") or ref in group_names:
                continue
            raise DefinitionError(
                f"{what}: {out}: {ref} must be inside an aggregate or be a GROUP BY output column"
                f" ({', '.join(sorted(group_names))})"
            )
        if isinstance(child, (ast.SubLink, ast.RangeSubselect)):
            raise DefinitionError(_NO_SUBQUERY.format(what=what))


_NO_SUBQUERY = (
    "{what}: subqueries are not supported in a continuous view (EXISTS, IN (SELECT ...)); join the table "
    "instead: FROM stream JOIN table ON ..."
)


def _not_retractable(label: str, stream: str, what: str) -> str:
    return (
        f"{what}: {label} cannot forget a retracted row, and {stream} has a key (its rows can be retracted); "
        "use it over an append-only stream"
    )


ANONYMOUS = "?column?"  # what PostgreSQL names an output it cannot name otherwise (`1`, `count(*) + 1`)


def _output_name(target: ast.ResTarget, what: str, is_aggregate: bool = False, anonymous: str | None = None) -> str:
    """The column's name: its alias, a column's own name, or (as PostgreSQL names it) the function's.

    An output PostgreSQL names `?column?` takes `anonymous`; None (a transform): it needs a name.
    """
    if target.name:
        if target.name.startswith("_cv_"):
            raise DefinitionError(f"{what}: names starting with _cv_ are the engine's")
        return plain_identifier(target.name, what)
    name = figure_name(target.val)  # `p.section` is named section, `k::text` k, `lower(url)` lower
    if name is not None or anonymous is not None:
        return name or anonymous
    raise DefinitionError(f"{what}: {RawStream()(target.val)} needs a name: ... AS <column>")


def _by_position(item: ast.Node, select: ast.SelectStmt, plain: list[ast.ResTarget], what: str) -> ast.ResTarget | None:
    """`GROUP BY 1`: the first output, as in PostgreSQL (None when `item` is not a position)."""
    if not (isinstance(item, ast.A_Const) and isinstance(item.val, ast.Integer)):
        return None
    targets = select.targetList or ()
    if not 1 <= item.val.ival <= len(targets):
        raise DefinitionError(f"{what}: GROUP BY position {item.val.ival} is not in the select list")
    target = targets[item.val.ival - 1]
    if target not in plain:
        raise DefinitionError(f"{what}: GROUP BY {item.val.ival}: that output is an aggregate")
    return target


def _groups(
    select: ast.SelectStmt,
    plain: list[ast.ResTarget],
    names: _Names,
    aggregated: set[str],
    what: str,
    windowed: bool = False,
    user_aggregates: frozenset[str] = frozenset(),
) -> tuple[GroupColumn, ...]:
    """The view's group columns: its GROUP BY outputs, then the GROUP BY expressions no output shows.

    Without GROUP BY, a view is one row, kept under a constant group (GLOBAL_GROUP); a sliding
    window's steps are groups of their own.
    """
    columns = names.columns
    by_name = {_output_name(t, what, anonymous=ANONYMOUS): t for t in plain}
    by_text = {RawStream()(t.val): t for t in plain}
    grouped: list[ast.ResTarget] = []
    hidden: list[GroupColumn] = []
    grouped_columns: set[str] = set()
    for item in select.groupClause or ():
        if not isinstance(item, ast.Node) or isinstance(item, ast.GroupingSet):
            raise DefinitionError(
                f"{what}: GROUPING SETS, ROLLUP and CUBE are not supported; define one view per grouping"
            )
        text = RawStream()(item)
        if isinstance(item, ast.ColumnRef):
            grouped_columns.add(text)
        target = by_text.get(text) or _by_position(item, select, plain, what)
        is_name = isinstance(item, ast.ColumnRef) and len(item.fields) == 1
        if target is None and is_name and item.fields[0].sval not in columns:
            # As in PostgreSQL, a name is a stream column first and only otherwise an output alias.
            target = by_name.get(item.fields[0].sval)
        if target is None and is_name and item.fields[0].sval in aggregated:
            raise DefinitionError(f"{what}: GROUP BY {text}: {text} is an aggregate")
        if target is None:  # grouped by, but not shown: a group column of the storage only
            _check_expression((item,), names, what, user_aggregates)
            if any(g.sql == text for g in hidden):
                raise DefinitionError(f"{what}: GROUP BY names {text} twice")
            hidden.append(hidden_group(len(hidden), item))
            continue
        if target in grouped:
            raise DefinitionError(f"{what}: GROUP BY names {text} twice")
        grouped.append(target)
    # An output over grouped columns only (`k::text` with GROUP BY k) is a group of its own: the same groups.
    dependent = [t for t in plain if t not in grouped and _over_columns(t.val, grouped_columns)]
    grouped += dependent
    missing = [RawStream()(t.val) for t in plain if t not in grouped]
    if missing:
        raise DefinitionError(f"{what}: {', '.join(missing)} must appear in GROUP BY or be aggregated")
    result = []
    for target in grouped:
        name = _output_name(target, what, anonymous=ANONYMOUS)
        source = target.val.fields[0].sval if isinstance(target.val, ast.ColumnRef) else None
        text = RawStream()(target.val)
        if isinstance(target.val, ast.A_Const) and isinstance(target.val.val, ast.String):
            text = f"CAST({text} AS text)"  # a string constant is text, as PostgreSQL's CREATE VIEW reads it
        result.append(GroupColumn(name, text, source, bucket_unit(target.val, columns)))
    result += hidden
    if not result and not windowed:
        return (GLOBAL_GROUP,)
    return tuple(result)


def _over_columns(node: ast.Node, columns: set[str]) -> bool:
    """True when every column `node` reads is one of `columns` (the bare columns of GROUP BY)."""
    return all(RawStream()(c) in columns for c in walk(node) if isinstance(c, ast.ColumnRef))


@dataclass(frozen=True)
class _Names:
    """The names a view's expressions may use: the stream's columns, and with a join the table's."""

    columns: set[str]
    join: Join | None

    def check(self, ref: ast.ColumnRef, what: str) -> None:
        names = [f.sval for f in ref.fields if isinstance(f, ast.String)]
        text = ".".join(names)
        known = f"{what}: {text} is not a column of the stream ({', '.join(sorted(self.columns))})"
        if self.join is None:
            if len(ref.fields) != 1 or text not in self.columns:
                raise DefinitionError(known)
            return
        # With a join, PostgreSQL checks the table's columns (and ambiguous names) when the view is defined.
        if len(names) != len(ref.fields) or len(names) > 2:
            raise DefinitionError(f"{what}: {text}: name a column as column, alias.column")
        if len(names) == 2 and names[0] == self.join.stream_alias and names[1] not in self.columns:
            raise DefinitionError(known)
        if len(names) == 2 and names[0] not in (self.join.stream_alias, *self.join.aliases):
            raise DefinitionError(f"{what}: {text}: {names[0]} is neither the stream nor a joined table")


def _check_expression(nodes: tuple, names: _Names, what: str, user_aggregates: frozenset[str]) -> None:
    """Only the stream's (or joined table's) columns, constants, operators and non-aggregate calls may appear."""
    for node in nodes:
        for child in walk(node):
            if isinstance(child, ast.ColumnRef):
                names.check(child, what)
            elif isinstance(child, (ast.SubLink, ast.RangeSubselect)):
                raise DefinitionError(_NO_SUBQUERY.format(what=what))
            elif isinstance(child, ast.FuncCall) and child.over is not None:
                raise DefinitionError(f"{what}: window functions are not supported")
            elif is_aggregate_call(child, user_aggregates):
                raise DefinitionError(
                    f"{what}: {RawStream()(child)}: aggregates are not allowed in WHERE, GROUP BY, FILTER or "
                    "another aggregate's arguments"
                )
            elif isinstance(child, ast.ParamRef):
                raise DefinitionError(f"{what}: parameters ($n) are not supported")


def _check_semantics(view: ViewDef, what: str) -> None:
    # DISTINCT aggregates over several expressions keep reference counts each (pipelines.cv.views.compiler).
    if view.ttl is not None and view.bucket is None:
        raise DefinitionError(f"{what}: ttl needs a time bucket in GROUP BY, e.g. date_trunc('hour', ts) or hour(ts)")


def check_changes_option(options: Mapping[str, str], windowed: bool, what: str) -> None:
    """The `changes` option: a boolean, and not on a sliding window (its rows change as time passes)."""
    value = options.get("changes")
    if value is None:
        return
    if value.lower() not in BOOLEAN_WORDS:
        raise DefinitionError(f"{what}: option changes takes true or false, not {value!r}")
    if windowed and value.lower() in TRUE_WORDS:
        raise DefinitionError(
            f"{what}: a sliding window's rows change as time passes, with no batch to record: changes = true is "
            "not supported on it"
        )
