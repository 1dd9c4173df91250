"""The FROM clause of a continuous view as PostgreSQL lets it be written, brought to one shape.

PipelineDB users write a stream's FROM every way PostgreSQL allows; the engine keeps one shape: the
stream, maybe enriched at ingest from tables joined in order (`Join`). This module reads each written
form into it:

- `FROM s`, `FROM public.s` (streams have no schema: `public`, PostgreSQL's default, names them as
  PipelineDB's did; any other schema is refused), `FROM s AS x` (then `x.url` is `url`);
- `FROM s [AS a] [LEFT] JOIN t [AS b] ON ... | USING (k, ...)`, `FROM s CROSS JOIN t`, and more
  tables after it (`... LEFT JOIN u ON ...`), each joined with what comes before it;
- `FROM t JOIN s ...` and `FROM t RIGHT JOIN s ...` (the stream on the preserved side) as the same;
- inner joins written in any order (`FROM t JOIN u ON ... JOIN s ON ...`): the stream first, the
  tables after it, every condition kept (inner joins commute);
- `FROM s, t [, u ...] WHERE s.k = t.k ...` (a comma join: the WHERE clause joins them, and
  PostgreSQL plans it as a join of the event's rows with the tables);
- `arrival_timestamp`, PipelineDB's arrival time, anywhere (an output, `s.arrival_timestamp`) is the
  stream's `timestamp_column`, unless the stream has a column of that name.

An outer join that keeps a table's rows (the stream on the nullable side) is refused: it would count
rows no event brought.
"""

from __future__ import annotations

from dataclasses import dataclass

import pglast
from pglast import ast
from pglast.enums import BoolExprType, JoinType
from pglast.stream import RawStream

from pipelines.cv.frontend.subselects import merge_subselects
from pipelines.cv.frontend.view_sources import refuse_feed_by_name, source_of
from pipelines.cv.model import DefinitionError, GroupColumn, Join, JoinedTable, Scope, StreamDef
from pipelines.cv.sqltext.parsing import walk

ARRIVAL = "arrival_timestamp"
# A view without GROUP BY keeps its one row under a constant group key no output shows.
GLOBAL_COLUMN = "_cv_all"
GLOBAL_GROUP = GroupColumn(GLOBAL_COLUMN, "true")
# A view without aggregates or GROUP BY keeps its rows: each distinct row a group, marked by this
# constant group and read back as many times as it was counted (pipelines.cv.views.read_views).
EACH_ROW_GROUP = GroupColumn("_cv_each_row", "true")
HIDDEN_GROUP_PREFIX = "_cv_by_"  # GROUP BY expressions that are not outputs: _cv_by_0, _cv_by_1, ...
_JOIN_SHAPE = (
    "write the stream and then its tables, each joined with what comes before it: FROM stream [LEFT] JOIN t1 "
    "ON ... [LEFT] JOIN t2 ON ... (no subqueries or parenthesized joins: a PostgreSQL view of the tables "
    "can be joined like a table)"
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
    merge_subselects(select, what)  # FROM (SELECT ... FROM s WHERE ...) AS a: the query over s itself
    items = select.fromClause or ()
    feed = source_of(items[0], scope.streams, scope.views, what) if len(items) == 1 else None
    if feed is not None and not set(feed.key or ()) <= set(feed.column_names):
        raise DefinitionError(
            f"{what}: {feed.feed_of} keeps groups it does not show (no GROUP BY, GROUP BY what is no output, or a "
            f"window): read its changes with output_of('{feed.feed_of}'), or show its group columns as outputs"
        )
    if feed is not None:
        return feed, None
    if len(items) >= 2 and all(isinstance(i, (ast.RangeVar, ast.JoinExpr)) for i in items):  # FROM s, t ... WHERE
        item = items[0]
        for other in items[1:]:
            item = _cross(item, other, what)
    elif len(items) == 1 and isinstance(items[0], (ast.RangeVar, ast.JoinExpr)):
        item = items[0]
    else:
        raise DefinitionError(
            f"{what}: FROM must name one stream, maybe joined with tables (no subqueries: define the inner "
            "query as its own continuous view or transform and read that)"
        )
    if isinstance(item, ast.RangeVar):
        stream = _side(item, scope, what).stream
        if stream is None:
            raise _not_a_stream(item, scope, what)
        _rewrite_refs(select, stream, _alias(item, stream), None, what)
        return stream, None
    stream, alias, steps = _joins(item, scope, what)
    using = tuple(k for step in steps for k in step.using)
    names = Join(alias, tuple(JoinedTable("", _table_alias(step.relation), step.left, "") for step in steps))
    _rewrite_refs(select, stream, alias, names, what, using)
    tables = []
    for step in steps:  # after the rewrite: a condition may name arrival_timestamp
        table_alias = _table_alias(step.relation)
        if step.using:  # JOIN ... USING (k): k is the stream's (its side is always kept), the condition k = k
            on_sql = " AND ".join(f"{alias}.{k} = {table_alias}.{k}" for k in step.using)
        else:
            on_sql = RawStream()(step.quals if step.quals is not None else _TRUE)
        relation = ast.RangeVar(schemaname=step.relation.schemaname, relname=step.relation.relname, inh=True)
        tables.append(JoinedTable(RawStream()(relation), table_alias, step.left, on_sql))
    return stream, Join(alias, tuple(tables))


_TRUE = ast.A_Const(val=ast.Boolean(boolval=True))


def _cross(left: ast.Node, right: ast.Node, what: str) -> ast.JoinExpr:
    """`left, right` as one left-deep join: `right`'s own joins follow, its USING written as conditions.

    A comma is a cross join, and a cross join followed by a join of the right side's relations is
    the same join (`s, t JOIN u USING (k)` is `s CROSS JOIN t JOIN u ON t.k = u.k`).
    """
    chain: list[ast.JoinExpr] = []
    base = right
    while isinstance(base, ast.JoinExpr):
        chain.insert(0, base)
        base = base.larg
    joined = ast.JoinExpr(jointype=JoinType.JOIN_INNER, larg=left, rarg=base, quals=_TRUE)
    before = base
    for join in chain:
        quals = join.quals
        if join.usingClause and isinstance(before, ast.RangeVar) and isinstance(join.rarg, ast.RangeVar):
            a, b = _table_alias(before), _table_alias(join.rarg)
            pairs = " AND ".join(f'"{a}"."{k.sval}" = "{b}"."{k.sval}"' for k in join.usingClause)
            quals = pglast.parse_sql(f"SELECT {pairs}")[0].stmt.targetList[0].val
        elif join.usingClause:
            raise DefinitionError(f"{what}: {_JOIN_SHAPE}")
        joined = ast.JoinExpr(
            jointype=join.jointype, larg=joined, rarg=join.rarg, quals=quals, isNatural=join.isNatural
        )
        before = join.rarg
    return joined


@dataclass(frozen=True)
class _Step:
    """A table joined after the stream: its relation, LEFT or not, its ON condition or USING columns."""

    relation: ast.RangeVar
    left: bool
    quals: ast.Node | None
    using: tuple[str, ...] = ()


def _table_alias(relation: ast.RangeVar) -> str:
    return relation.alias.aliasname if relation.alias is not None else relation.relname


def _joins(item: ast.JoinExpr, scope: Scope, what: str) -> tuple[StreamDef, str, list[_Step]]:
    """A stream joined with tables, written any way: the stream, its alias, and its tables in join order."""
    chain: list[ast.JoinExpr] = []
    node: ast.Node = item
    while isinstance(node, ast.JoinExpr):  # ((base J1 r1) J2 r2) ...: the first join first
        chain.insert(0, node)
        node = node.larg
    relations = [node, *(j.rarg for j in chain)]
    if not all(isinstance(r, ast.RangeVar) for r in relations):
        raise DefinitionError(f"{what}: {_JOIN_SHAPE}")
    for join in chain:
        if join.isNatural:
            raise DefinitionError(f"{what}: NATURAL JOIN is not supported; name the columns: JOIN t USING (k)")
        if join.jointype == JoinType.JOIN_FULL:
            raise DefinitionError(
                f"{what}: FULL JOIN would count the table's rows no event matched; write FROM stream LEFT JOIN table"
            )
    sides = [_side(r, scope, what) for r in relations]
    at = [i for i, side in enumerate(sides) if side.stream is not None]
    if len(at) > 1:
        raise DefinitionError(f"{what}: a view reads one stream: two streams cannot be joined (it joins tables)")
    if not at:
        raise _not_a_stream(relations[0], scope, what)
    stream = sides[at[0]].stream
    assert stream is not None
    _joinable(stream, what)
    alias = _alias(relations[at[0]], stream)
    if at[0] >= 2:  # the tables first: inner joins only, which commute
        if any(j.jointype != JoinType.JOIN_INNER or j.usingClause for j in chain):
            raise DefinitionError(f"{what}: {_JOIN_SHAPE}")
        conditions = [j.quals for j in chain if j.quals is not None]
        quals = _conjunction(conditions)
        tables = [r for i, r in enumerate(relations) if i != at[0]]
        steps = [_Step(t, False, quals if i == len(tables) - 1 else None) for i, t in enumerate(tables)]
        return stream, alias, _checked(steps, alias, what)
    first = chain[0]
    table = relations[1 - at[0]]
    stream_first = at[0] == 0
    if (first.jointype == JoinType.JOIN_LEFT and not stream_first) or (
        first.jointype == JoinType.JOIN_RIGHT and stream_first
    ):
        raise _keeps_table_rows(what)
    left = first.jointype != JoinType.JOIN_INNER
    steps = [_Step(table, left, first.quals, tuple(n.sval for n in first.usingClause or ()))]
    for join in chain[1:]:
        if join.jointype not in (JoinType.JOIN_INNER, JoinType.JOIN_LEFT):
            raise _keeps_table_rows(what)
        using = tuple(n.sval for n in join.usingClause or ())
        missing = [k for k in using if k not in stream.column_names]
        if missing:
            raise DefinitionError(
                f"{what}: JOIN {RawStream()(join.rarg)} USING ({', '.join(missing)}): a later table joins the stream's "
                "columns by USING; for the tables' own, write ON"
            )
        steps.append(_Step(join.rarg, join.jointype == JoinType.JOIN_LEFT, join.quals, using))
    return stream, alias, _checked(steps, alias, what)


def _joinable(stream: StreamDef, what: str) -> None:
    if stream.is_feed:
        raise DefinitionError(f"{what}: a continuous view read by another view is not joined with a table")
    if stream.key is not None:
        raise DefinitionError(
            f"{what}: {stream.name} has a key: a retraction would be joined with the table's rows of now, not "
            "those its row was counted with; join an append-only stream"
        )


def _keeps_table_rows(what: str) -> DefinitionError:
    return DefinitionError(
        f"{what}: an outer join that keeps the table's rows would count rows no event brought; keep the "
        "stream's side: FROM stream LEFT JOIN table (or FROM table RIGHT JOIN stream)"
    )


def _conjunction(conditions: list[ast.Node]) -> ast.Node | None:
    if not conditions:
        return None
    if len(conditions) == 1:
        return conditions[0]
    return ast.BoolExpr(boolop=BoolExprType.AND_EXPR, args=tuple(conditions))


def _checked(steps: list[_Step], alias: str, what: str) -> list[_Step]:
    """Each table's name differs from the stream's and from the others'."""
    names = [alias]
    for step in steps:
        name = _table_alias(step.relation)
        if name in names:
            raise DefinitionError(f"{what}: the stream and its tables need different names (aliases): {name}")
        names.append(name)
    return steps


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


def _names(ref: ast.ColumnRef) -> list[str]:
    return [f.sval for f in ref.fields if isinstance(f, ast.String)]
