"""A subquery in FROM that only projects and filters its stream, merged into the query that reads it.

PipelineDB users write `SELECT x, sum(y) FROM (SELECT x::integer, y::integer FROM s) _ GROUP BY x`,
and nest such subqueries to rename columns level by level. A subquery that keeps every event (no
GROUP BY, aggregate, DISTINCT, ORDER BY, LIMIT or window) is a projection and a filter of the
stream: the outer query's references to its outputs are replaced by their expressions, and its
WHERE joins the outer WHERE (PostgreSQL's planner merges such subqueries the same way). What is
left is a query over the stream, read like any other (pipelines.cv.frontend.view_shapes).

A subquery that does more than project and filter is refused saying what to write instead: its own
continuous view (or transform), which the outer view then reads.
"""

from __future__ import annotations

import copy

from pglast import ast
from pglast.enums import BoolExprType
from pglast.stream import RawStream

from pipelines.cv.model import DefinitionError
from pipelines.cv.sqltext.parsing import figure_name, replace_nodes, walk

_ONLY_PROJECTS = (
    "a subquery in FROM may only project and filter its stream (no {what}); define it as a continuous view or "
    "transform of its own and read that"
)
_AGGREGATE_NAMES = frozenset({"count", "sum", "avg", "min", "max"})  # the common ones: the rest fail when resolved


def merge_subselects(select: ast.SelectStmt, what: str) -> None:
    """Replace `FROM (SELECT ... FROM s ...) AS a` by its stream in `select`, in place, innermost first."""
    items = select.fromClause or ()
    if len(items) != 1 or not isinstance(items[0], ast.RangeSubselect):
        return
    sub = items[0]
    inner = sub.subquery
    if sub.lateral or not isinstance(inner, ast.SelectStmt) or inner.op != 0:  # SETOP_NONE
        raise DefinitionError(f"{what}: {_ONLY_PROJECTS.format(what='UNION, LATERAL or VALUES')}")
    merge_subselects(inner, what)
    _only_projects(inner, what)
    alias = sub.alias.aliasname if sub.alias is not None else None
    renamed = [c.sval for c in sub.alias.colnames or ()] if sub.alias is not None else []
    outputs: dict[str, ast.Node] = {}
    for index, target in enumerate(inner.targetList or ()):
        if isinstance(target.val, ast.ColumnRef) and isinstance(target.val.fields[-1], ast.A_Star):
            raise DefinitionError(f"{what}: SELECT * in a subquery is not supported; name the columns")
        name = renamed[index] if index < len(renamed) else target.name or figure_name(target.val)
        if name is not None:
            outputs[name] = target.val
    for target in select.targetList or ():  # an output named after the column it reads keeps that name
        if target.name is None and isinstance(target.val, ast.ColumnRef) and _local(target.val, alias) in outputs:
            target.name = _local(target.val, alias)
    for clause in ("targetList", "whereClause", "groupClause", "havingClause", "sortClause"):
        merged = replace_nodes(  # a subquery in an expression is refused where expressions are checked
            getattr(select, clause), lambda node: _output_of(node, outputs, alias, what), into_subqueries=False
        )
        setattr(select, clause, merged)
    select.fromClause = inner.fromClause
    conjuncts = [c for w in (inner.whereClause, select.whereClause) if w is not None for c in _conjuncts(w)]
    if len(conjuncts) == 1:
        select.whereClause = conjuncts[0]
    elif conjuncts:
        select.whereClause = ast.BoolExpr(BoolExprType.AND_EXPR, tuple(conjuncts))


def _conjuncts(node: ast.Node) -> tuple[ast.Node, ...]:
    if isinstance(node, ast.BoolExpr) and node.boolop == BoolExprType.AND_EXPR:
        return tuple(node.args)
    return (node,)


def _only_projects(inner: ast.SelectStmt, what: str) -> None:
    for clause, name in (
        (inner.groupClause, "GROUP BY"),
        (inner.havingClause, "HAVING"),
        (inner.distinctClause, "DISTINCT"),
        (inner.sortClause, "ORDER BY"),
        (inner.limitCount, "LIMIT"),
        (inner.limitOffset, "OFFSET"),
        (inner.windowClause, "WINDOW"),
        (inner.withClause, "WITH"),
    ):
        if clause:
            raise DefinitionError(f"{what}: {_ONLY_PROJECTS.format(what=name)}")
    for target in inner.targetList or ():
        for node in walk(target.val):
            if isinstance(node, ast.FuncCall) and (
                node.over is not None or node.agg_star or node.funcname[-1].sval.lower() in _AGGREGATE_NAMES
            ):
                raise DefinitionError(f"{what}: {_ONLY_PROJECTS.format(what='aggregates or window functions')}")


def _local(ref: ast.ColumnRef, alias: str | None) -> str | None:
    """The subquery's output a reference names (`x`, or `alias.x`); None for anything else."""
    names = [f.sval for f in ref.fields if isinstance(f, ast.String)]
    if len(names) != len(ref.fields):
        return None
    if len(names) == 1:
        return names[0]
    if len(names) == 2 and alias is not None and names[0] == alias:
        return names[1]
    return None


def _output_of(node: ast.Node, outputs: dict[str, ast.Node], alias: str | None, what: str) -> ast.Node | None:
    """A reference to a subquery output: (a copy of) its expression; None for any other node."""
    if not isinstance(node, ast.ColumnRef):
        return None
    name = _local(node, alias)
    if name is None or name not in outputs:
        raise DefinitionError(f"{what}: {RawStream()(node)} is not a column of the subquery in FROM")
    return copy.deepcopy(outputs[name])
