"""Compiling view definitions into maintenance SQL: set-based, batched, with retractions.

A batch of stream changes becomes *deltas* (sign +1 for a row entering the stream's state, -1 for a
row leaving it; see pipelines.cv.views.stream_sql). Each view then applies the deltas in one
`INSERT ... ON CONFLICT DO UPDATE` whose rows are sorted by the view's group key, so every writer
takes row locks in the same order (views in name order, groups in key order): several pipeline
processes can never deadlock.

How each aggregate is computed over a batch and merged is in pipelines.cv.views.aggregates.

DISTINCT aggregates need to know when a value enters or leaves a group. When the stream's key is
covered by the group columns plus x, the batch's deltas netted per (group, x) are exactly those
transitions. Otherwise a reference-count table `<view>__refs(groups, value, n)` counts the rows behind
each value and reports them. Each DISTINCT expression of a view (ViewDef.distinct_args, by index) goes
its own way by the same statements: the first keeps `__refs`, the others `__refs2`, `__refs3`, ...
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from psycopg import sql

from pipelines.cv.model import Aggregate, StreamDef, TransformDef, ViewDef, storage_name
from pipelines.cv.sqltext.parsing import split_arguments
from pipelines.cv.views import extremes, stream_sql, windows
from pipelines.cv.views.aggregates import ROWS, removed_column, removed_indexes, stored_columns
from pipelines.cv.views.general import StateFunctions
from pipelines.cv.views.refs import (
    distinct_is_covered,
    refs_indexes,
    refs_table,
    suffix,
    transitions_table,
)
from pipelines.cv.views.sql_text import CV_SCHEMA, comma_list, ident, raw
from pipelines.cv.views.view_types import ViewTypes


def storage_table(view: ViewDef) -> sql.Identifier:
    """Where a view's groups and stored aggregates live: `cv.<schema>__<view>`, apart from what users read."""
    return storage_table_of(view.schema, view.name)


def storage_table_of(schema: str, view: str) -> sql.Identifier:
    """The storage table of a view given by name."""
    return ident(CV_SCHEMA, storage_name(schema, view))


# --- views ----------------------------------------------------------------------------------------


def create_view_tables(view: ViewDef, stream: StreamDef, types: ViewTypes) -> list[sql.Composed]:
    """DDL: the view's storage table in schema cv (plus its reference counts when DISTINCT needs them)."""
    columns = _group_columns(view, types)
    for aggregate, type_ in zip(view.aggregates, types.aggregates, strict=True):
        default = {"count": "0", "count_distinct": "0", "set": "'{}'"}.get(aggregate.kind)
        columns.append(
            sql.SQL("{} {}{}").format(
                ident(aggregate.name), raw(type_), sql.SQL(f" NOT NULL DEFAULT {default}" if default else "")
            )
        )
    columns.append(sql.SQL("{} bigint NOT NULL DEFAULT 0").format(ident(ROWS)))
    for index in removed_indexes(view):
        columns.append(sql.SQL("{} {}[]").format(ident(removed_column(index)), raw(types.distinct_type(index))))
    groups = comma_list([ident(g.name) for g in view.groups])
    statements = [
        # fillfactor leaves room on each page so that updates of a group can stay on its page (HOT).
        sql.SQL("CREATE TABLE {} ({}, UNIQUE NULLS NOT DISTINCT ({})) WITH (fillfactor = {})").format(
            storage_table(view), comma_list(columns), groups, sql.Literal(int(view.options.get("fillfactor", 80)))
        )
    ]
    expired_by = view.bucket.name if view.ttl and view.bucket else windows.STEP_COLUMN if view.window else None
    if expired_by:  # retention deletes by time
        statements.append(sql.SQL("CREATE INDEX ON {} ({})").format(storage_table(view), ident(expired_by)))
    for index, _ in extremes.counted_extremes(view, stream):
        statements += extremes.create_counts_table(view, index, types.groups, types.aggregates[index])
    for index in refs_indexes(view, stream):
        statements.append(
            sql.SQL(
                "CREATE TABLE {} ({}, value {} NOT NULL, n bigint NOT NULL, last_delta bigint NOT NULL,"
                " UNIQUE NULLS NOT DISTINCT ({}, value))"
            ).format(
                refs_table(view, index),
                comma_list(_group_columns(view, types)),
                raw(types.distinct_type(index)),
                groups,
            )
        )
    return statements


def create_transitions_table(view: ViewDef, types: ViewTypes, index: int = 0) -> sql.Composed:
    """DDL of the session's transitions table for a view with reference counts."""
    columns = _group_columns(view, types)
    return sql.SQL(
        "CREATE TEMP TABLE IF NOT EXISTS {} (sign int2 NOT NULL, {}, value {}) ON COMMIT DELETE ROWS"
    ).format(transitions_table(view, index), comma_list(columns), raw(types.distinct_type(index)))


def create_transitions_tables(view: ViewDef, stream: StreamDef, types: ViewTypes) -> list[sql.Composed]:
    """DDL of the session's transitions tables: one per DISTINCT expression with reference counts."""
    return [create_transitions_table(view, types, index) for index in refs_indexes(view, stream)]


def _group_columns(view: ViewDef, types: ViewTypes) -> list[sql.Composed]:
    """The view's group columns as column definitions: `name type`."""
    return [sql.SQL("{} {}").format(ident(g.name), raw(t)) for g, t in zip(view.groups, types.groups, strict=True)]


def _group_exprs(view: ViewDef) -> list[sql.Composed]:
    """The view's group expressions over a stream row: `expression AS name`."""
    return [sql.SQL("{} AS {}").format(raw(g.sql), ident(g.name)) for g in view.groups]


def _positions(count: int) -> sql.Composed:
    """`1, 2, ..., count`: GROUP BY and ORDER BY the first output columns."""
    return comma_list([sql.SQL(str(i + 1)) for i in range(count)])


def _delta_filter(view: ViewDef) -> sql.Composable:
    conditions = []
    if view.where_sql:
        conditions.append(sql.SQL("({})").format(raw(view.where_sql)))
    if view.ttl and view.bucket:
        # Deltas for buckets already past retention would resurrect deleted groups: skip them.
        conditions.append(sql.SQL("{} >= now() - {}::interval").format(raw(view.bucket.sql), sql.Literal(view.ttl)))
    if view.window is not None:  # likewise, rows older than the window's oldest step
        conditions.append(windows.in_window(view))
    if not conditions:
        return sql.SQL("")
    return sql.SQL(" WHERE ") + sql.SQL(" AND ").join(conditions)


def _distinct_filter(view: ViewDef, index: int = 0) -> sql.Composable:
    """The view's filter on deltas, and a DISTINCT argument that is not NULL (NULL is never counted)."""
    not_null = sql.SQL("({}) IS NOT NULL").format(raw(view.distinct_args[index]))
    where = _delta_filter(view)
    return (where + sql.SQL(" AND ") + not_null) if where.as_string() else sql.SQL(" WHERE ") + not_null


def update_extreme_counts(view: ViewDef, stream: StreamDef, source: sql.Composable) -> list[sql.Composed]:
    """Before the upsert: the value counts behind min/max over a keyed stream move by the batch."""
    statements = []
    for i, a in extremes.kept_extremes(view, stream):
        statements += [extremes.update_counts(view, i, a, _from(view, source), _delta_filter(view))]
        statements += [extremes.forget_zeros(view, i)]
    return statements


def update_all_refs(view: ViewDef, stream: StreamDef, source: sql.Composable) -> list[sql.Composed]:
    """`update_refs` of each DISTINCT expression that keeps reference counts."""
    return [update_refs(view, source, index) for index in refs_indexes(view, stream)]


def update_refs(view: ViewDef, source: sql.Composable, index: int = 0) -> sql.Composed:
    """Reference counts of (group, value) move by the batch's deltas; record values entering or leaving.

    Each row keeps the change it last received (`last_delta`), so RETURNING tells the count before and
    after without joining back to the batch.
    """
    group_exprs = _group_exprs(view)
    group_names = [ident(g.name) for g in view.groups]
    arg = raw(view.distinct_args[index])
    return sql.SQL(
        "WITH up AS (INSERT INTO {refs} AS r ({gnames}, value, n, last_delta)"
        " SELECT {gexprs}, {arg} AS value, sum(_cv_sign), sum(_cv_sign) FROM {source}{where}"
        " GROUP BY {pos} ORDER BY {pos}"
        " ON CONFLICT ({gnames}, value) DO UPDATE SET n = r.n + excluded.n, last_delta = excluded.n RETURNING r.*)"
        " INSERT INTO {trans} (sign, {gnames}, value)"
        " SELECT CASE WHEN n > 0 THEN 1 ELSE -1 END, {gnames}, value FROM up WHERE (n > 0) <> (n - last_delta > 0)"
    ).format(
        refs=refs_table(view, index),
        gnames=comma_list(group_names),
        gexprs=comma_list(group_exprs),
        arg=arg,
        source=_from(view, source),
        where=_distinct_filter(view, index),
        pos=_positions(len(view.groups) + 1),
        trans=transitions_table(view, index),
    )


def uses_refs(view: ViewDef, stream: StreamDef) -> bool:
    """True when the view's DISTINCT aggregates need reference-count tables (`refs_indexes`)."""
    return bool(refs_indexes(view, stream))


def counts_from_transitions(view: ViewDef, stream: StreamDef) -> bool:
    """True when a covered view's transitions alone give every aggregate, so the deltas need no second pass.

    The DISTINCT argument must be a key column (never NULL), so each transition is exactly one stream
    row entering or leaving its group, and `count(*)` is the transitions' sum; other aggregates
    (sum, min/max, hll, count(x)) need the rows themselves.
    """
    return (
        len(view.distinct_args) == 1
        and distinct_is_covered(view, stream)
        and stream.key is not None
        and view.distinct_arg in stream.key
        and all(
            a.kind in {"set", "count_distinct"} or (a.kind == "count" and a.arg_sql is None and a.filter_sql is None)
            for a in view.aggregates
        )
    )


def _netted_transitions(view: ViewDef, source: sql.Composable, index: int = 0) -> sql.Composed:
    """Covered DISTINCT: the deltas netted per (group, value) are the transitions (+1 in, -1 out)."""
    groups = _group_exprs(view)
    return sql.SQL(
        "(SELECT {groups}, {arg} AS value, sum(_cv_sign)::int AS sign FROM {source}{where}"
        " GROUP BY {pos} HAVING sum(_cv_sign) <> 0)"
    ).format(
        groups=comma_list(groups),
        arg=raw(view.distinct_args[index]),
        source=_from(view, source),
        where=_distinct_filter(view, index),
        pos=_positions(len(view.groups) + 1),
    )


def apply_deltas(
    view: ViewDef, stream: StreamDef, source: sql.Composable, states: Mapping[str, StateFunctions] | None = None
) -> sql.Composed:
    """One upsert of a batch's deltas into the view, rows sorted by group (the lock order).

    Views that drop empty groups get back one row: the ctids of groups this batch emptied (see
    `delete_rows`). With DISTINCT aggregates, deltas and transitions are aggregated in one pass over
    their UNION ALL: GROUP BY treats NULL groups as equal and hashes, where a join would need
    IS NOT DISTINCT FROM, which PostgreSQL can only evaluate in a nested loop.
    """
    group_names = [ident(g.name) for g in view.groups]
    by_position = _positions(len(view.groups))
    # min/max over a keyed stream: left as they are here, read from their value counts by fix_extremes.
    merges = {a.name: sql.SQL("v.{}").format(ident(a.name)) for _, a in extremes.kept_extremes(view, stream)}
    if view.distinct_arg is None:
        columns = stored_columns(view, sql.SQL("_cv_sign"), None, states=states, extreme_merges=merges)
        group_exprs = _group_exprs(view)
        body = sql.SQL("SELECT {groups}, {batch} FROM {source}{where} GROUP BY {pos} ORDER BY {pos}").format(
            groups=comma_list(group_exprs),
            batch=comma_list([c.batch for c in columns]),
            source=_from(view, source),
            where=_delta_filter(view),
            pos=by_position,
        )
    elif counts_from_transitions(view, stream):
        # One pass over the netted transitions instead of two over the deltas (see the function).
        sign = sql.SQL("t.sign")
        columns = stored_columns(view, sign, sql.SQL("t.value"), rows_sign=sign, states=states, extreme_merges=merges)
        body = sql.SQL("SELECT {groups}, {batch} FROM {trans} AS t GROUP BY {pos} ORDER BY {pos}").format(
            groups=comma_list([sql.SQL("t.{}").format(n) for n in group_names]),
            batch=comma_list([c.batch for c in columns]),
            trans=_netted_transitions(view, source),
            pos=by_position,
        )
    else:
        # The deltas' side computes each aggregate's inputs (its arguments and filter) under names of
        # its own, so that the outer aggregation needs no stream or joined table column.
        # Each DISTINCT expression's transitions are one more branch, in columns of their own.
        inputs, renamed = _aggregate_inputs(view)
        refs = refs_indexes(view, stream)
        count = len(view.distinct_args)
        sources = [(sql.SQL(f"_cv_tsign{suffix(i)}"), sql.SQL(f"_cv_value{suffix(i)}")) for i in range(count)]
        columns = stored_columns(
            view, *sources[0], states=states, aggregates=renamed, extreme_merges=merges, distinct_sources=sources
        )
        slots = [ident(f"_cv_g{i}") for i in range(len(view.groups))]
        # NULL typed as its expression: UNION ALL types its branches two at a time, from the left.
        empty = [
            f"CASE WHEN false THEN {arg} END AS _cv_value{suffix(i)}, NULL::int AS _cv_tsign{suffix(i)}"
            for i, arg in enumerate(view.distinct_args)
        ]
        branches = [
            sql.SQL(" UNION ALL SELECT {t_groups}, NULL, {nulls}{values} FROM {trans} AS t").format(
                t_groups=comma_list([sql.SQL("t.{}").format(n) for n in group_names]),
                nulls=sql.SQL("NULL, " * len(inputs)),
                values=sql.SQL(", ".join(["NULL, NULL"] * i + ["t.value, t.sign"] + ["NULL, NULL"] * (count - i - 1))),
                trans=transitions_table(view, i) if i in refs else _netted_transitions(view, source, i),
            )
            for i in range(count)
        ]
        body = sql.SQL(
            "SELECT {slots}, {batch} FROM ("
            "SELECT {group_exprs}, _cv_sign, {inputs}{empty} FROM {source}{where}{branches}"
            ") AS u GROUP BY {pos} ORDER BY {pos}"
        ).format(
            slots=comma_list(slots),
            batch=comma_list([c.batch for c in columns]),
            group_exprs=comma_list(
                [sql.SQL("{} AS {}").format(raw(g.sql), n) for g, n in zip(view.groups, slots, strict=True)]
            ),
            inputs=sql.SQL("").join(sql.SQL("{} AS {}, ").format(raw(e), ident(n)) for n, e in inputs),
            empty=sql.SQL(", ".join(empty)),
            source=_from(view, source),
            where=_delta_filter(view),
            branches=sql.SQL("").join(branches),
            pos=by_position,
        )
    upsert = sql.SQL(
        "INSERT INTO {view} AS v ({groups}, {targets}) {body} ON CONFLICT ({groups}) DO UPDATE SET {merges}"
    ).format(
        view=storage_table(view),
        groups=comma_list(group_names),
        targets=comma_list([ident(c.target) for c in columns]),
        body=body,
        merges=comma_list([sql.SQL("{} = {}").format(ident(c.target), c.merge) for c in columns]),
    )
    if view.is_monotonic and not merges:
        return upsert
    # The rows it emptied (to delete, unless the view keeps empty groups) and the rows it kept (whose
    # min/max over a keyed stream `fix_extremes` then reads from their value counts).
    emptied = "array_agg(tid) FILTER (WHERE n <= 0)" if not view.is_monotonic else "NULL::tid[]"
    kept = "array_agg(tid) FILTER (WHERE n > 0)" if merges else "NULL::tid[]"
    return sql.SQL(
        "WITH up AS ({upsert} RETURNING v.ctid AS tid, v.{rows} AS n)"
        " SELECT coalesce({emptied}, '{{}}'), coalesce({kept}, '{{}}') FROM up"
    ).format(upsert=upsert, rows=ident(ROWS), emptied=sql.SQL(emptied), kept=sql.SQL(kept))


def returns_rows(view: ViewDef, stream: StreamDef) -> bool:
    """True when `apply_deltas` returns (emptied, kept) ctid arrays for the engine to act on."""
    return not view.is_monotonic or bool(extremes.kept_extremes(view, stream))


def fix_extremes(view: ViewDef, stream: StreamDef) -> sql.Composed | None:
    """min/max over a keyed stream of the rows a batch kept (by ctid), read from their value counts.

    A separate statement because the upsert's INSERT branch takes the batch's own extreme, which a
    retraction later in the same batch may have taken away. Only the rows whose extreme moved are
    written: a rollup's groups mostly keep theirs, and each write costs a row version (and, for a
    view that records changes, a captured row).
    """
    kept = extremes.kept_extremes(view, stream)
    if not kept:
        return None
    names = [ident(a.name) for _, a in kept]
    reads = [sql.SQL("{} AS {}").format(extremes.read(view, i, a), ident(a.name)) for i, a in kept]
    return sql.SQL(
        "UPDATE {storage} AS t SET {sets} FROM (SELECT s.ctid AS _cv_tid, {reads} FROM {storage} AS s"
        " WHERE s.ctid = ANY(%s::tid[])) AS f WHERE t.ctid = f._cv_tid AND ({moved})"
    ).format(
        storage=storage_table(view),
        sets=comma_list([sql.SQL("{0} = f.{0}").format(n) for n in names]),
        reads=comma_list(reads),
        moved=sql.SQL(" OR ").join(sql.SQL("t.{0} IS DISTINCT FROM f.{0}").format(n) for n in names),
    )


def _aggregate_inputs(view: ViewDef) -> tuple[list[tuple[str, str]], tuple[Aggregate, ...]]:
    """Each aggregate's arguments and filter as named inputs, and the aggregates reading them by name."""
    inputs: list[tuple[str, str]] = []
    renamed = []
    for i, aggregate in enumerate(view.aggregates):
        args = split_arguments(aggregate.arg_sql) if aggregate.arg_sql else []
        names = [f"_cv_in{i}_{j}" for j in range(len(args))]
        inputs += zip(names, args, strict=True)
        where = None
        if aggregate.filter_sql:
            where = f"_cv_if{i}"
            inputs.append((where, aggregate.filter_sql))
        renamed.append(replace(aggregate, arg_sql=", ".join(names) or None, filter_sql=where))
    return inputs, tuple(renamed)


def _from(view: ViewDef | TransformDef, source: sql.Composable) -> sql.Composed:
    """The FROM clause of a view's maintenance: the deltas, joined with the view's tables if it has any."""
    if view.join is None:
        return sql.SQL("{} AS d").format(source)
    joined = [
        sql.SQL("{}JOIN {} AS {} ON {}").format(
            sql.SQL("LEFT " if t.left else ""), raw(t.table), ident(t.alias), raw(t.on_sql)
        )
        for t in view.join.tables
    ]
    return sql.SQL("{} AS {} {}").format(source, ident(view.join.stream_alias), sql.SQL(" ").join(joined))


def delete_rows(view: ViewDef) -> sql.Composed:
    """Delete the groups a batch emptied, by the ctids `apply_deltas` returned (rows it has locked)."""
    return sql.SQL("DELETE FROM {} WHERE ctid = ANY(%s::tid[])").format(storage_table(view))


def expire(view: ViewDef, stream: StreamDef) -> list[sql.Composed]:
    """Retention: delete time buckets past the TTL (and their value and reference counts), or a window's steps."""
    if view.window is not None:
        return [windows.expire(view, storage_table(view))]
    if not view.ttl or not view.bucket:
        return []
    statement = sql.SQL("DELETE FROM {} WHERE {} < now() - {}::interval").format(
        storage_table(view), ident(view.bucket.name), sql.Literal(view.ttl)
    )
    counts = [extremes.expire(view, i) for i, _ in extremes.kept_extremes(view, stream)]
    refs = [  # and each DISTINCT expression's reference counts, as the min/max value counts
        sql.SQL("DELETE FROM {} WHERE {} < now() - {}::interval").format(
            refs_table(view, index), ident(view.bucket.name), sql.Literal(view.ttl)
        )
        for index in refs_indexes(view, stream)
    ]
    return [statement, *(c for c in counts if c is not None), *refs]


def backfill_from_state(view: ViewDef, stream: StreamDef, types: ViewTypes) -> list[sql.Composed]:
    """The statements that fill a view over a keyed stream from the stream's state, run in order.

    A new view is filled with them; a quarantined one that resumes runs them after emptying its
    storage (`reset_storage`), which makes it exact whatever it missed.
    """
    source = stream_sql.backfill_source(stream)
    statements = list(update_extreme_counts(view, stream, source))
    statements += create_transitions_tables(view, stream, types) + update_all_refs(view, stream, source)
    statements.append(apply_deltas(view, stream, source, types.states))
    return statements


def reset_storage(view: ViewDef, stream: StreamDef) -> list[sql.Composed]:
    """Empty a view's storage: its rows, reference counts and min/max value counts."""
    tables = [storage_table(view)]
    tables += [refs_table(view, index) for index in refs_indexes(view, stream)]
    tables += [extremes.counts_table(view, index) for index, _ in extremes.counted_extremes(view, stream)]
    return [sql.SQL("DELETE FROM {}").format(table) for table in tables]
