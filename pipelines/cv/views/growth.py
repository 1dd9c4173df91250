"""Views whose rows only grow: a min or max over such rows needs no value counts.

A view over a keyed stream keeps, for each min/max, a count of every (group, value)
(pipelines.cv.views.extremes), since a retraction may take a group's extreme away. A view over a
view's rows (`FROM public.per_minute`) reads a keyed stream: each change of an upstream row retracts
the old row and adds the new one. But when the upstream's rows are never deleted and the column a
`max` reads never decreases (a `min`'s never increases), the new row's value is at least the old
one's: the retraction can never take the extreme away, and `greatest` of the stored and the batch's
is exact, as over an append-only stream. The value counts, and reading the extreme back from them,
were about a third of what each level of the rollup benchmark's chain cost PostgreSQL
(docs/performance.md).

A view's rows are never deleted, and its columns move one way only, when:

- it reads an append-only stream (every batch only adds events), or the rows of a view that only
  grow with its groups and filter over the feed's key columns alone (so an upstream row stays in
  one group, and in or out of the view, for good);
- and it has no ttl (retention deletes rows).

Then its group columns are fixed, its `count`s and `max`es only go up, its `min`s only down (over a
view's rows: of a column that moves their way). What a feed knows is stated with it (the rows feed's
`grows`, pipelines.cv.frontend.view_sources), written when the feed is made and whenever its
upstream changes (pipelines.cv.catalog.view_feeds.follow_growth, which rebuilds the readers that
relied on more). A replay of the upstream, or anything else that makes a row shrink, is caught when
the feed applies it (`guarded_columns`: the feed's statement counts the changes that break it) and
the views relying on it are rebuilt from the feed's state (pipelines.cv.engine).
"""

from __future__ import annotations

from collections.abc import Mapping

import pglast
from pglast import ast

from pipelines.cv.model import FIXED, GROWS_DOWN, GROWS_UP, Aggregate, StreamDef, ViewDef, call_placeholder
from pipelines.cv.views.stream_sql import referenced_names

# The way each aggregate kind moves when rows are only added, and the way its argument must move.
_WAYS = {"max": GROWS_UP, "min": GROWS_DOWN}


def directions(view: ViewDef, stream: StreamDef) -> dict[str, str]:
    """How each output column of `view` (read by `stream`) moves while its rows are never deleted.

    Empty when its rows may be deleted (a ttl, a keyed stream's retractions, an upstream that may
    shrink); otherwise every group column is FIXED and each count, max and min that only moves one
    way says which.
    """
    if view.ttl or view.window is not None:
        return {}
    if stream.key is not None and not (stream.grows and over_keys(view, stream)):
        return {}
    grows = dict(stream.grows)
    stored = {a.name: a for a in view.aggregates}
    ways: dict[str, str] = {}
    for output in view.outputs:
        if output.is_group:
            ways[output.name] = FIXED
            continue
        call = next((c for i, c in enumerate(view.calls) if output.sql == call_placeholder(i)), None)
        if call is None or len(call.stored) != 1 or call.function not in {"count", *_WAYS}:
            continue
        aggregate = stored[call.stored[0]]
        if aggregate.kind != call.function:
            continue
        if aggregate.kind == "count":
            if stream.key is None or _counts_rows(aggregate, stream):
                ways[output.name] = GROWS_UP
        elif stream.key is None or _reads_one_way(aggregate, stream, grows):
            ways[output.name] = _WAYS[aggregate.kind]
    return ways


def grown_extremes(view: ViewDef, stream: StreamDef) -> dict[str, tuple[str, str]]:
    """The min/max aggregates of `view` that need no value counts: stored name -> (the column read, its way).

    Only over a rows feed that states how its rows grow, with the view's groups and filter over
    the feed's key; each of them reads one column that moves its way (or a key column).
    """
    if stream.key is None or not stream.grows or not over_keys(view, stream):
        return {}
    grows = dict(stream.grows)
    return {
        a.name: (column, grows[column])
        for a in view.aggregates
        if a.kind in _WAYS and _reads_one_way(a, stream, grows) and (column := plain_column(a.arg_sql)) is not None
    }


def guarded_columns(views: list[ViewDef], stream: StreamDef) -> dict[str, str]:
    """The feed's columns whose way some of `views` relies on: a change against it must be caught."""
    return {column: way for view in views for column, way in grown_extremes(view, stream).values()}


def over_keys(view: ViewDef, stream: StreamDef) -> bool:
    """True when `view`'s groups, filter and aggregate filters read only `stream`'s key columns (no join)."""
    if view.join is not None or stream.key is None:
        return False
    expressions = [g.sql for g in view.groups] + ([view.where_sql] if view.where_sql else [])
    expressions += [a.filter_sql for a in view.aggregates if a.filter_sql]
    return referenced_names(expressions) <= set(stream.key)


def _reads_one_way(aggregate: Aggregate, stream: StreamDef, grows: Mapping[str, str]) -> bool:
    column = plain_column(aggregate.arg_sql)
    return column is not None and grows.get(column) in {_WAYS[aggregate.kind], FIXED} and _keys_only(aggregate, stream)


def _counts_rows(aggregate: Aggregate, stream: StreamDef) -> bool:
    """count(*), or count of a key column: over rows never deleted, it never decreases."""
    keys = set(stream.key or ())
    return (aggregate.arg_sql is None or plain_column(aggregate.arg_sql) in keys) and _keys_only(aggregate, stream)


def _keys_only(aggregate: Aggregate, stream: StreamDef) -> bool:
    return not aggregate.filter_sql or referenced_names([aggregate.filter_sql]) <= set(stream.key or ())


def plain_column(expression: str | None) -> str | None:
    """The column an expression is, when it is one column and nothing else (`peak`, `"peak"`)."""
    if expression is None:
        return None
    target = pglast.parse_sql(f"SELECT {expression}")[0].stmt.targetList[0].val
    if isinstance(target, ast.ColumnRef) and len(target.fields) == 1 and isinstance(target.fields[0], ast.String):
        return target.fields[0].sval
    return None
