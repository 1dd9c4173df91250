"""combine() of summaries that cannot forget a row: recomputed per changed group from the feed's current rows.

A HyperLogLog, a t-digest, a top-k summary, a Bloom filter or a count-min sketch cannot take a
retraction away,
so over `FROM public.pv` (whose changes retract the old row) combine() of one is kept as kind
`combined` (pipelines.cv.frontend.combine): each batch recomputes the groups it touches as the merge
of the states of the feed's rows in the group, read from the feed's state table (which the feed
brings to the upstream's current rows before the views run: pipelines.cv.views.stream_sql). The
merge is the one a sliding window uses to merge its steps (`window_merge`): hll_union_agg(),
tdigest(), the top-k merge, ...

Its cost per changed group is a scan of the feed's rows in the group: by an index when a group is
one of the feed's key columns (`url`), of every row otherwise (the rollup's expressions, like
date_trunc over timestamptz, are not immutable: no index on them): suited to rollups whose upstream
keeps a ttl; docs/results.md says so.
"""

from __future__ import annotations

from collections.abc import Mapping

import pglast
from pglast import ast
from pglast.stream import RawStream
from psycopg import sql

from pipelines.cv.frontend.combine import DISTINCT
from pipelines.cv.model import Aggregate, ViewDef, state_table_name
from pipelines.cv.sqltext.parsing import walk
from pipelines.cv.views.general import StateFunctions
from pipelines.cv.views.sql_text import CV_SCHEMA, ident, raw


def qualified(expression: str, alias: str) -> str:
    """`expression` with each unqualified column reference qualified by `alias` (a view over a feed joins nothing)."""
    select = pglast.parse_sql(f"SELECT {expression}")[0].stmt
    for node in walk(select.targetList):
        if isinstance(node, ast.ColumnRef) and len(node.fields) == 1 and isinstance(node.fields[0], ast.String):
            node.fields = (ast.String(sval=alias), node.fields[0])
    return RawStream()(select.targetList[0].val)


def _same_group(expression: str) -> str:
    """A feed row `st` in the group whose value `d`'s rows have: an index condition when it is a plain column.

    The feed's state table has an index on each of its key columns (pipelines.cv.catalog.view_feeds),
    so `hourly ... GROUP BY hour, url` reads a url's rows, not every row, per changed group.
    """
    value = f"(array_agg({qualified(expression, 'd')}))[1]"
    row = qualified(expression, "st")
    select = pglast.parse_sql(f"SELECT {expression}")[0].stmt
    if isinstance(select.targetList[0].val, ast.ColumnRef):
        return f"({row} = {value} OR ({row} IS NULL AND {value} IS NULL))"
    return f"({row}) IS NOT DISTINCT FROM {value}"


def recombined(
    view: ViewDef, aggregate: Aggregate, merge_of, states: Mapping[str, StateFunctions] | None
) -> tuple[sql.Composable, sql.Composable]:
    """A `combined` column's batch (its group recomputed from the feed's rows) and merge (the batch replaces it).

    `merge_of(aggregate, column, type, states)` is the merge of a summary's states (aggregates.window_merge).
    The batch is a subquery in the upsert's grouped SELECT over the deltas `d`: the group's value reaches
    it as an aggregate of the outer level, `(array_agg(<group over d>))[1]`.
    """
    upstream = Aggregate(aggregate.name, aggregate.params[0], params=aggregate.params[1:])  # type: ignore[arg-type]
    column = f"st.{aggregate.arg_sql}"
    conditions = [_same_group(g.sql) for g in view.groups]
    if view.where_sql:
        conditions.append(f"({qualified(view.where_sql, 'st')})")
    if upstream.kind == DISTINCT:  # an exact distinct count's set: the union of the rows' sets
        merge, rows = "array_agg(DISTINCT u.v ORDER BY u.v)", f" CROSS JOIN LATERAL unnest({column}) AS u(v)"
    else:
        merge, rows = merge_of(upstream, column, "", states or {}), ""
    batch = sql.SQL("(SELECT {} FROM {} AS st{} WHERE {})").format(
        raw(merge),
        ident(CV_SCHEMA, state_table_name(view.stream)),
        raw(rows),
        raw(" AND ".join(conditions) or "true"),
    )
    return batch, sql.SQL("excluded.{}").format(ident(aggregate.name))
