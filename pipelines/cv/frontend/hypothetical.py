"""Hypothetical-set aggregates (`rank(7) WITHIN GROUP (ORDER BY x)`) written as the counts they are.

PostgreSQL's hypothetical-set aggregates place a hypothetical row among the group's rows: its rank is
one more than the rows sorting before it, `percent_rank` those rows over all of them, `cume_dist`
the rows sorting before or with it (plus itself) over all of them plus itself. Each is a count with a
filter, which a continuous view keeps like any count, over append-only and keyed streams alike:

    rank(c) WITHIN GROUP (ORDER BY x)         = count(*) FILTER (WHERE <x before c>) + 1
    percent_rank(c) WITHIN GROUP (ORDER BY x) = that count / count(*)  (0 without rows)
    cume_dist(c) WITHIN GROUP (ORDER BY x)    = (count(*) FILTER (WHERE <x before or with c>) + 1) / (count(*) + 1)

"Before" follows the ORDER BY as PostgreSQL sorts: key by key, each ASC or DESC, NULLS LAST for
ASC and FIRST for DESC unless written. `dense_rank` counts distinct rows, not rows: it is refused
saying what to write.
"""

from __future__ import annotations

import pglast
from pglast import ast
from pglast.enums import SortByDir, SortByNulls
from pglast.stream import RawStream

from pipelines.cv.model import DefinitionError
from pipelines.cv.sqltext.parsing import figure_name, replace_nodes

KINDS = frozenset({"rank", "percent_rank", "cume_dist", "dense_rank"})


def rewrite_hypothetical(select: ast.SelectStmt, what: str) -> None:
    """Replace each hypothetical-set aggregate in the select list by its counts, in place (names kept)."""
    for target in select.targetList or ():
        if target.name is None and _is_hypothetical(target.val):
            target.name = figure_name(target.val)
        target.val = replace_nodes(
            target.val, lambda node: _counts(node, what) if _is_hypothetical(node) else None, into_subqueries=False
        )


def _is_hypothetical(node: object) -> bool:
    return (
        isinstance(node, ast.FuncCall)
        and bool(node.agg_within_group)
        and node.funcname[-1].sval.lower() in KINDS
        and node.over is None
    )


def _counts(call: ast.Node, what: str) -> ast.Node:
    assert isinstance(call, ast.FuncCall)
    kind = call.funcname[-1].sval.lower()
    text = RawStream()(call)
    if kind == "dense_rank":
        raise DefinitionError(
            f"{what}: {text}: dense_rank counts the distinct rows before the hypothetical one, which a "
            "stream's view keeps only as a set; write count(DISTINCT x) FILTER (WHERE x < c) + 1"
        )
    values, keys = list(call.args or ()), list(call.agg_order or ())
    if len(values) != len(keys):
        raise DefinitionError(f"{what}: {text}: give one value per ORDER BY key ({len(keys)})")
    if call.agg_filter is not None or call.agg_distinct:
        raise DefinitionError(f"{what}: {text}: FILTER and DISTINCT do not apply to a hypothetical-set aggregate")
    before = " OR ".join(
        "(" + " AND ".join([*(_peer(keys[j], values[j]) for j in range(i)), _sorts_before(keys[i], values[i])]) + ")"
        for i in range(len(keys))
    )
    peer = " AND ".join(_peer(k, v) for k, v in zip(keys, values, strict=True))
    if kind == "rank":
        sql = f"(count(*) FILTER (WHERE {before}) + 1)"
    elif kind == "percent_rank":
        sql = (
            f"(CASE WHEN count(*) = 0 THEN 0::float8 ELSE "
            f"count(*) FILTER (WHERE {before})::float8 / count(*)::float8 END)"
        )
    else:  # cume_dist
        sql = f"((count(*) FILTER (WHERE ({before}) OR ({peer})) + 1)::float8 / (count(*) + 1)::float8)"
    return pglast.parse_sql(f"SELECT {sql}")[0].stmt.targetList[0].val


def _peer(key: ast.SortBy, value: ast.Node) -> str:
    return f"({RawStream()(key.node)}) IS NOT DISTINCT FROM ({RawStream()(value)})"


def _sorts_before(key: ast.SortBy, value: ast.Node) -> str:
    """SQL: the row's key sorts strictly before the hypothetical value, as the ORDER BY key sorts."""
    if key.useOp:
        raise DefinitionError(f"{RawStream()(key)}: ORDER BY ... USING is not supported here")
    x, c = f"({RawStream()(key.node)})", f"({RawStream()(value)})"
    descending = key.sortby_dir == SortByDir.SORTBY_DESC
    nulls_first = key.sortby_nulls == SortByNulls.SORTBY_NULLS_FIRST or (
        key.sortby_nulls == SortByNulls.SORTBY_NULLS_DEFAULT and descending
    )
    compare = f"{x} > {c}" if descending else f"{x} < {c}"
    null_side = f"({x} IS NULL AND {c} IS NOT NULL)" if nulls_first else f"({x} IS NOT NULL AND {c} IS NULL)"
    return f"(({compare}) IS TRUE OR {null_side})"
