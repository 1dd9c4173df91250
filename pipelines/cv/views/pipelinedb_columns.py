"""How PipelineDB's aggregates (pipelines.cv.frontend.pipelinedb_calls) are computed over a batch and merged.

| kind   | stored  | batch (rows entering the group)       | merge                                      |
| keyed  | type v  | v at the batch's extreme k (ties: the | the side with the more extreme key (the    |
|        |         | least v), beside max(k) / min(k)      | sibling max/min column); a tie: least(v)   |
| first  | x[]     | the first n x in the ORDER BY's order | the first n of both arrays, re-sorted      |
| append | x[]     | the batch's values, at most the cap   | stored || batch, cut at the cap            |
| bloom  | bytea   | streamviews.bloom_add (pgext)         | streamviews.bloom_union: OR of the bits    |
| freq   | bytea   | streamviews.freq_add (pgext)          | streamviews.freq_merge: counters added     |
| bucket | bytea   | streamviews.bucket_add (pgext): x,    | streamviews.bucket_merge: the batch's      |
|        |         | buckets and ts side by side           | bucket of a value (or the later ts's) wins |

`keyed` reads its key from the max(k) / min(k) stored beside it (same key, same filter): in an
upsert's SET every `v.` reference is the row before the update, so that column's old and new values
are both at hand. Every merge is order-free but `append`'s and an untimed `bucket`'s (see the front end).
"""

from __future__ import annotations

from psycopg import sql

from pipelines.cv.model import Aggregate, ViewDef
from pipelines.cv.sqltext.parsing import split_arguments
from pipelines.cv.views.sql_text import ident, raw


def pipelinedb_column(
    view: ViewDef, aggregate: Aggregate, where: sql.Composable | None
) -> tuple[sql.Composable, sql.Composable]:
    """A keyed, first or append aggregate's SQL over a batch, and its merge (`aggregate` may name its inputs)."""
    col = ident(aggregate.name)
    entering = sql.SQL("_cv_sign > 0") + (sql.SQL(" AND ({})").format(where) if where is not None else sql.SQL(""))
    if aggregate.kind == "keyed":
        key, value = (raw(e) for e in split_arguments(aggregate.arg_sql or ""))
        extreme = aggregate.params[0]
        direction, beats = ("DESC", ">") if extreme == "max" else ("ASC", "<")
        batch = sql.SQL(
            "(array_agg({v} ORDER BY {k} " + direction + ", {v} ASC NULLS LAST)"
            " FILTER (WHERE {entering} AND ({k}) IS NOT NULL))[1]"
        ).format(v=value, k=key, entering=entering)
        kc = ident(key_column(view, aggregate))
        merge = sql.SQL(
            "CASE WHEN excluded.{kc} IS NULL THEN v.{c} WHEN v.{kc} IS NULL OR excluded.{kc} " + beats + " v.{kc}"
            " THEN excluded.{c} WHEN excluded.{kc} = v.{kc} THEN least(v.{c}, excluded.{c}) ELSE v.{c} END"
        ).format(kc=kc, c=col)
        return batch, merge
    x = raw(aggregate.arg_sql or "")
    if aggregate.kind in {"bloom", "freq"}:  # pgext/sketches.c: NULL state makes a new sketch of that shape
        add, merge_ = ("bloom_add", "bloom_union") if aggregate.kind == "bloom" else ("freq_add", "freq_merge")
        first, second = float(aggregate.params[0]), float(aggregate.params[1])
        shape = [sql.Literal(first), sql.SQL("{}::bigint").format(sql.Literal(int(second)))]
        if aggregate.kind == "freq":
            shape[1] = sql.Literal(second)
        batch = sql.SQL("streamviews." + add + "(NULL, array_agg({x}) FILTER (WHERE {e}), {a}::float8, {b})").format(
            x=x, e=entering, a=shape[0], b=shape[1]
        )
        return batch, sql.SQL("streamviews." + merge_ + "(v.{0}, excluded.{0})").format(col)
    if aggregate.kind == "bucket":  # x, bucket [, ts]: arrays side by side (one filter, so one order)
        inputs = [raw(e) for e in split_arguments(aggregate.arg_sql or "")]
        arrays = [sql.SQL("array_agg({}) FILTER (WHERE {})").format(e, entering) for e in inputs]
        if len(arrays) == 2:
            arrays.append(sql.SQL("NULL"))
        batch = sql.SQL("streamviews.bucket_add(NULL, {})").format(sql.SQL(", ").join(arrays))
        return batch, sql.SQL("streamviews.bucket_merge(v.{0}, excluded.{0})").format(col)
    if aggregate.kind == "first":
        n, order = sql.Literal(int(aggregate.params[0])), sql.SQL(_order(aggregate.params[1]))
        batch = sql.SQL("(array_agg({x} ORDER BY {x} {o}) FILTER (WHERE {e}))[1:{n}]").format(
            x=x, o=order, e=entering, n=n
        )
        both = sql.SQL("ARRAY(SELECT e FROM unnest(v.{c} || excluded.{c}) AS e ORDER BY e {o} LIMIT {n})").format(
            c=col, o=order, n=n
        )
        return batch, either(col, both)
    cap = sql.Literal(int(aggregate.params[0]))
    batch = sql.SQL("(array_agg({x}) FILTER (WHERE {e}))[1:{cap}]").format(x=x, e=entering, cap=cap)
    return batch, either(col, sql.SQL("(v.{0} || excluded.{0})[1:{1}]").format(col, cap))


def key_column(view: ViewDef, keyed: Aggregate) -> str:
    """The stored max(k) / min(k) beside a keyed aggregate: same key, same filter (as the front end stores it)."""
    index = next(i for i, a in enumerate(view.aggregates) if a.name == keyed.name)
    original = view.aggregates[index]
    key = split_arguments(original.arg_sql or "")[0]
    return next(
        a.name
        for a in view.aggregates
        if a.kind == original.params[0] and a.arg_sql == key and a.filter_sql == original.filter_sql
    )


def _order(direction: str) -> str:
    """An ORDER BY direction from the catalog, checked (it is spliced into SQL)."""
    allowed = {f"{d} NULLS {n}" for d in ("ASC", "DESC") for n in ("FIRST", "LAST")}
    if direction not in allowed:
        raise ValueError(f"not an ORDER BY direction: {direction!r}")
    return direction


def either(col: sql.Identifier, both: sql.Composable) -> sql.Composed:
    """A merge of nullable states: either side when the other is NULL, else `both`."""
    return sql.SQL(
        "CASE WHEN excluded.{0} IS NULL THEN v.{0} WHEN v.{0} IS NULL THEN excluded.{0} ELSE {1} END"
    ).format(col, both)
