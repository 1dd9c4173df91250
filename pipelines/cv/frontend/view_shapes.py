"""The FROM clause of a continuous view as PostgreSQL lets it be written, brought to one shape.

PipelineDB users write a stream's FROM every way PostgreSQL allows; the engine keeps one shape: the
stream, maybe enriched at ingest from one table (`Join`). This module reads each written form into it:

- `FROM s`, `FROM public.s` (streams have no schema: `public`, PostgreSQL's default, names them as
  PipelineDB's did; any other schema is refused), `FROM s AS x` (then `x.url` is `url`);
- `FROM s [AS a] [LEFT] JOIN t [AS b] ON ... | USING (k, ...)`, `FROM s CROSS JOIN t`;
- `FROM t JOIN s ...` and `FROM t RIGHT JOIN s ...` (the stream on the preserved side) as the same;
- `FROM s, t WHERE s.k = t.k` (a comma join: the WHERE clause joins them, and PostgreSQL plans it
  as a join of the event's rows with the table);
- `arrival_timestamp`, PipelineDB's arrival time, anywhere (an output, `s.arrival_timestamp`) is the
  stream's `timestamp_column`, unless the stream has a column of that name.

A stream joined with two or more tables is refused with what to write instead: a PostgreSQL view of
the joined tables, joined with the stream.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pglast import ast
from pglast.enums import JoinType
from pglast.stream import RawStream

from pipelines.cv.frontend.view_sources import refuse_feed_by_name, source_of
from pipelines.cv.model import DefinitionError, GroupColumn, Join, Scope, StreamDef
from pipelines.cv.sqltext.parsing import walk

ARRIVAL = "arrival_timestamp"
# A view without GROUP BY keeps its one row under a constant group key no output shows.
GLOBAL_COLUMN = "_cv_all"
GLOBAL_GROUP = GroupColumn(GLOBAL_COLUMN, "true")
# A view without aggregates or GROUP BY keeps its rows: each distinct row a group, marked by this
# constant group and read back as many times as it was counted (pipelines.cv.views.read_views).
EACH_ROW_GROUP = GroupColumn("_cv_each_row", "true")
HIDDEN_GROUP_PREFIX = "_cv_by_"  # GROUP BY expressions that are not outputs: _cv_by_0, _cv_by_1, ...
_ONE_TABLE = (
    "a stream joins one table; for more, join the tables in a PostgreSQL view (CREATE VIEW t AS SELECT ... "
    "FROM t1 JOIN t2 ...) and join the stream with that view"
)


def hidden_group(index: int, node: ast.Node) -> GroupColumn:
    """A GROUP BY expression that is no output: stored as a group column no output shows."""
    return GroupColumn(f"{HIDDEN_GROUP_PREFIX}{index}", RawStream()(node))


@dataclass(frozen=True)
class _Side:
    relation: ast.RangeVar
    stream: StreamDef | None


def from_stream(select: ast.SelectStmt, scope: Scope, what: str) -> tuple[StreamDef, Join | None]:
    """The stream a view reads (a declared one, or a view read as one), and the table it joins each event with.

    The select's column references are rewritten in place to the one shape the engine compiles:
    no qualifier without a join, the stream's alias on USING columns, the timestamp column for
    `arrival_timestamp`.
    """
    items = select.fromClause or ()
    feed = source_of(items[0], scope.streams, scope.views, what) if len(items) == 1 else None
    if feed is not None and not set(feed.key or ()) <= set(feed.column_names):
        raise DefinitionError(
            f"{what}: {feed.feed_of} keeps groups it does not show (no GROUP BY, GROUP BY what is no output, or a "
            f"window): read its changes with output_of('{feed.feed_of}'), or show its group columns as outputs"
        )
    if feed is not None:
        return feed, None
    if len(items) == 2 and all(isinstance(i, ast.RangeVar) for i in items):  # FROM s, t WHERE ...
        item = ast.JoinExpr(jointype=JoinType.JOIN_INNER, larg=items[0], rarg=items[1], quals=_TRUE)
    elif len(items) == 1 and isinstance(items[0], (ast.RangeVar, ast.JoinExpr)):
        item = items[0]
    elif len(items) > 2 and all(isinstance(i, ast.RangeVar) for i in items):
        raise DefinitionError(f"{what}: {_ONE_TABLE}")
    else:
        raise DefinitionError(
            f"{what}: FROM must name one stream, maybe joined with one table (no subqueries: define the inner "
            "query as its own continuous view or transform and read that)"
        )
    if isinstance(item, ast.RangeVar):
        stream = _side(item, scope, what).stream
        if stream is None:
            raise _not_a_stream(item, scope, what)
        _rewrite_refs(select, stream, _alias(item, stream), None, what)
        return stream, None
    stream, join, using = _join(item, scope, what)
    _rewrite_refs(select, stream, join.stream_alias, join, what, using)
    if not join.on_sql:  # after the rewrite: the condition may name arrival_timestamp
        join = replace(join, on_sql=RawStream()(item.quals if item.quals is not None else _TRUE))
    return stream, join


_TRUE = ast.A_Const(val=ast.Boolean(boolval=True))


def _join(item: ast.JoinExpr, scope: Scope, what: str) -> tuple[StreamDef, Join, tuple[str, ...]]:
    """`stream JOIN table` written any way: the stream first, its table; the condition (USING's only)."""
    if not isinstance(item.larg, ast.RangeVar) or not isinstance(item.rarg, ast.RangeVar):
        raise DefinitionError(f"{what}: {_ONE_TABLE} (no subqueries)")
    left, right = _side(item.larg, scope, what), _side(item.rarg, scope, what)
    if left.stream is not None and right.stream is not None:
        raise DefinitionError(f"{what}: a view reads one stream: two streams cannot be joined (it joins a table)")
    if left.stream is None and right.stream is None:
        raise _not_a_stream(item.larg, scope, what)
    kind = item.jointype
    if item.isNatural:
        raise DefinitionError(f"{what}: NATURAL JOIN is not supported; name the columns: JOIN t USING (k)")
    if kind == JoinType.JOIN_FULL:
        raise DefinitionError(
            f"{what}: FULL JOIN would count the table's rows no event matched; write FROM stream LEFT JOIN table"
        )
    stream_side, table_side = (left, right) if left.stream is not None else (right, left)
    preserved_table = (kind == JoinType.JOIN_LEFT and stream_side is right) or (
        kind == JoinType.JOIN_RIGHT and stream_side is left
    )
    if preserved_table:
        raise DefinitionError(
            f"{what}: an outer join that keeps the table's rows would count rows no event brought; keep the "
            "stream's side: FROM stream LEFT JOIN table (or FROM table RIGHT JOIN stream)"
        )
    stream = stream_side.stream
    assert stream is not None
    if stream.is_feed:
        raise DefinitionError(f"{what}: a continuous view read by another view is not joined with a table")
    if stream.key is not None:
        raise DefinitionError(
            f"{what}: {stream.name} has a key: a retraction would be joined with the table's rows of now, not "
            "those its row was counted with; join an append-only stream"
        )
    table = table_side.relation
    alias = _alias(stream_side.relation, stream)
    table_alias = table.alias.aliasname if table.alias is not None else table.relname
    if table_alias == alias:
        raise DefinitionError(f"{what}: the stream and the table need different names (aliases)")
    using = tuple(n.sval for n in item.usingClause or ())
    # JOIN ... USING (k): k is the stream's (its side is always kept), and the condition is k = k.
    on_sql = " AND ".join(f"{alias}.{k} = {table_alias}.{k}" for k in using)  # "": ON, read once rewritten
    relation = ast.RangeVar(schemaname=table.schemaname, relname=table.relname, inh=True)
    join = Join(alias, RawStream()(relation), table_alias, kind != JoinType.JOIN_INNER, on_sql)
    return stream, join, using


def _side(relation: ast.RangeVar, scope: Scope, what: str) -> _Side:
    """A FROM relation: a stream (by its name, or `public.` its name), or a table (stream None)."""
    named = scope.streams.get(relation.relname)
    if named is None or relation.schemaname not in (None, "public"):
        return _Side(relation, None)
    if named.is_feed:
        refuse_feed_by_name(named, what)
    if relation.catalogname:
        raise DefinitionError(f"{what}: {RawStream()(relation)}: name the stream as {named.name}")
    return _Side(relation, named)


def _alias(relation: ast.RangeVar, stream: StreamDef) -> str:
    return relation.alias.aliasname if relation.alias is not None else stream.name


def _not_a_stream(relation: ast.RangeVar, scope: Scope, what: str) -> DefinitionError:
    known = ", ".join(sorted(s.name for s in scope.streams.values() if not s.is_feed)) or "none"
    hint = ""
    if relation.schemaname and relation.schemaname != "public" and relation.relname in scope.streams:
        hint = f"; streams have no schema: write {relation.relname} or public.{relation.relname}"
    return DefinitionError(
        f"{what}: {RawStream()(relation)} is not a stream (streams: {known}) nor a continuous view{hint}"
    )


def _rewrite_refs(
    select: ast.SelectStmt, stream: StreamDef, alias: str, join: Join | None, what: str, using: tuple[str, ...] = ()
) -> None:
    """Column references in the one shape the engine compiles (see from_stream), in place."""
    arrival = stream.timestamp_column if ARRIVAL not in stream.column_names else ARRIVAL
    for target in select.targetList or ():
        ref = target.val
        if target.name is None and isinstance(ref, ast.ColumnRef) and _names(ref)[-1:] == [ARRIVAL]:
            target.name = ARRIVAL  # an output keeps the name it was written with
    nodes = (select.targetList, select.whereClause, select.groupClause, select.fromClause)
    for node in walk(tuple(n for n in nodes if n is not None)):
        if not isinstance(node, ast.ColumnRef):
            continue
        names = _names(node)
        if len(names) != len(node.fields):
            continue  # x.* and the like: refused where they are checked
        if len(names) == 2 and names[0] == alias and join is None:
            names = names[1:]  # `x.url` with FROM s AS x: there is one relation
        if names[-1] == ARRIVAL and arrival != ARRIVAL and (len(names) == 1 or names[0] == alias):
            if arrival is None:
                raise DefinitionError(f"{what}: {ARRIVAL} is the timestamp_column, and {stream.name} declares none")
            names = [*names[:-1], arrival]
        if join is not None and len(names) == 1 and names[0] in using:
            names = [alias, names[0]]  # JOIN ... USING (k): k is the stream's (its side is kept)
        node.fields = tuple(ast.String(sval=n) for n in names)


def figure_name(node: ast.Node) -> str | None:
    """The name PostgreSQL gives an output written without one (its FigureColname); None: `?column?`."""
    if isinstance(node, ast.ColumnRef):
        last = node.fields[-1]
        return last.sval if isinstance(last, ast.String) else None
    if isinstance(node, ast.A_Indirection):  # (new).g: g
        last = node.indirection[-1]
        return last.sval if isinstance(last, ast.String) else figure_name(node.arg)
    if isinstance(node, ast.FuncCall):
        return node.funcname[-1].sval.lower()
    if isinstance(node, ast.TypeCast):  # k::text is k; '1'::int is int4
        return figure_name(node.arg) or node.typeName.names[-1].sval
    if isinstance(node, ast.CoalesceExpr):
        return "coalesce"
    if isinstance(node, ast.CaseExpr):
        return "case"
    if isinstance(node, ast.MinMaxExpr):
        return "greatest" if node.op == 0 else "least"
    return None


def _names(ref: ast.ColumnRef) -> list[str]:
    return [f.sval for f in ref.fields if isinstance(f, ast.String)]


def plain_join(item: ast.JoinExpr, stream: StreamDef, alias: str, what: str) -> Join:
    """A transform's join (pipelines.cv.frontend.transforms): `stream [LEFT] JOIN table ON <condition>`."""
    table = item.rarg
    if not isinstance(table, ast.RangeVar):
        raise DefinitionError(f"{what}: a stream joins one table (no subqueries or second joins)")
    if item.jointype not in (JoinType.JOIN_INNER, JoinType.JOIN_LEFT) or item.isNatural or item.usingClause:
        raise DefinitionError(f"{what}: a stream joins a table with JOIN or LEFT JOIN ... ON <condition>")
    if item.quals is None:
        raise DefinitionError(f"{what}: JOIN needs ON <condition>")
    if stream.key is not None:
        raise DefinitionError(
            f"{what}: {stream.name} has a key: a retraction would be joined with the table's rows of now, not "
            "those its row was counted with; join an append-only stream"
        )
    table_alias = table.alias.aliasname if table.alias is not None else table.relname
    if table_alias == alias:
        raise DefinitionError(f"{what}: the stream and the table need different names (aliases)")
    return Join(
        stream_alias=alias,
        table=RawStream()(ast.RangeVar(schemaname=table.schemaname, relname=table.relname, inh=True)),
        table_alias=table_alias,
        left=item.jointype == JoinType.JOIN_LEFT,
        on_sql=RawStream()(item.quals),
    )
