"""min(x) and max(x) over a keyed stream: exact under retractions, from counts of each value per group.

A retraction can take away a group's minimum, and the next one is then unknown to the stored row.
So the view keeps, for each such aggregate, a table `cv.<storage>__m<i>` counting the rows behind
every (group, value); a batch moves the counts first (forgetting values whose count reaches 0), and
then, after the upsert, each changed group reads its extreme from the first entry of that table's
index (pipelines.cv.views.compiler.fix_extremes). An
append-only stream needs none of this: least()/greatest() of the stored and the batch's are exact;
nor does a view over a view's rows that only grow (pipelines.cv.views.growth), whose counts table
is made all the same, empty, so that the view's tables stay the same when its upstream changes.
"""

from __future__ import annotations

from psycopg import sql

from pipelines.cv.model import Aggregate, StreamDef, ViewDef
from pipelines.cv.views import growth
from pipelines.cv.views.sql_text import CV_SCHEMA, comma_list, ident, raw


def counted_extremes(view: ViewDef, stream: StreamDef) -> list[tuple[int, Aggregate]]:
    """The view's min/max aggregates that have a value counts table (their position among the view's aggregates)."""
    if stream.key is None:
        return []
    return [(i, a) for i, a in enumerate(view.aggregates) if a.kind in {"min", "max"}]


def kept_extremes(view: ViewDef, stream: StreamDef) -> list[tuple[int, Aggregate]]:
    """Of `counted_extremes`, those whose counts are kept: every one, but over a view's rows that only grow."""
    grown = growth.grown_extremes(view, stream)
    return [(i, a) for i, a in counted_extremes(view, stream) if a.name not in grown]


def counts_table(view: ViewDef, index: int) -> sql.Identifier:
    """`cv.<storage>__m<index>`: rows behind each (group, value) of aggregate `index`."""
    return ident(CV_SCHEMA, f"{view.storage_name}__m{index}")


def create_counts_table(view: ViewDef, index: int, group_types: tuple[str, ...], value_type: str) -> list[sql.Composed]:
    """DDL: (groups, value, n); its unique index, groups then value, finds a group's extreme first.

    A partial index finds the values a batch has just brought to 0, which `forget_zeros` deletes.
    """
    table = counts_table(view, index)
    groups = [sql.SQL("{} {}").format(ident(g.name), raw(t)) for g, t in zip(view.groups, group_types, strict=True)]
    return [
        sql.SQL(
            "CREATE TABLE {} ({}, value {} NOT NULL, n bigint NOT NULL, UNIQUE NULLS NOT DISTINCT ({}, value))"
        ).format(table, comma_list(groups), raw(value_type), _names(view)),
        sql.SQL("CREATE INDEX ON {} (value) WHERE n <= 0").format(table),
    ]


def update_counts(
    view: ViewDef, index: int, aggregate: Aggregate, source: sql.Composable, where: sql.Composable
) -> sql.Composed:
    """A batch's deltas move the counts of (group, value).

    `source` is the deltas' FROM clause, `where` the view's filter on them (with its WHERE keyword).
    A (group, value) the batch leaves at 0 is not inserted; one it brings to 0 is deleted by
    `forget_zeros`, in a statement of its own (a statement cannot see its own CTE's rows).
    """
    condition = sql.SQL("({}) IS NOT NULL").format(raw(aggregate.arg_sql or ""))
    if aggregate.filter_sql:
        condition = sql.SQL("{} AND ({})").format(condition, raw(aggregate.filter_sql))
    where_all = sql.SQL("{} AND {}").format(where, condition) if where.as_string() else sql.SQL(" WHERE ") + condition
    groups = [sql.SQL("{} AS {}").format(raw(g.sql), ident(g.name)) for g in view.groups]
    positions = comma_list([sql.SQL(str(i + 1)) for i in range(len(view.groups) + 1)])
    return sql.SQL(
        "INSERT INTO {table} AS m ({names}, value, n)"
        " SELECT {groups}, {arg}, sum(_cv_sign) FROM {source}{where} GROUP BY {pos} HAVING sum(_cv_sign) <> 0"
        " ORDER BY {pos} ON CONFLICT ({names}, value) DO UPDATE SET n = m.n + excluded.n"
    ).format(
        table=counts_table(view, index),
        names=_names(view),
        groups=comma_list(groups),
        arg=raw(aggregate.arg_sql or ""),
        source=source,
        where=where_all,
        pos=positions,
    )


def forget_zeros(view: ViewDef, index: int) -> sql.Composed:
    """Delete the values no row holds any more (through the partial index: only those a batch zeroed)."""
    return sql.SQL("DELETE FROM {} WHERE n <= 0").format(counts_table(view, index))


def read(view: ViewDef, index: int, aggregate: Aggregate) -> sql.Composed:
    """A stored row's extreme (`s` the storage row), from its group's counts: the first by the index.

    A group without NULLs is looked up with plain equalities, which the unique index answers; the
    NULL-matching ORs (for groups with a NULL) make PostgreSQL scan the whole table instead: measured
    on 200,000 counts, 51 ms a row against 0.03 ms.
    """
    names = [ident(g.name) for g in view.groups]
    matching = sql.SQL(" AND ").join(
        sql.SQL("(m.{0} = s.{0} OR (m.{0} IS NULL AND s.{0} IS NULL))").format(n) for n in names
    )
    equal = sql.SQL(" AND ").join(sql.SQL("m.{0} = s.{0}").format(n) for n in names)
    no_null = sql.SQL(" AND ").join(sql.SQL("s.{} IS NOT NULL").format(n) for n in names)
    order = sql.SQL("ASC" if aggregate.kind == "min" else "DESC")

    def first(where: sql.Composable) -> sql.Composed:
        return sql.SQL("(SELECT m.value FROM {} AS m WHERE {} ORDER BY m.value {} LIMIT 1)").format(
            counts_table(view, index), where, order
        )

    return sql.SQL("(CASE WHEN {} THEN {} ELSE {} END)").format(no_null, first(equal), first(matching))


def expire(view: ViewDef, index: int) -> sql.Composed | None:
    """Retention of a bucketed view reaches the counts too."""
    if not view.ttl or not view.bucket:
        return None
    return sql.SQL("DELETE FROM {} WHERE {} < now() - {}::interval").format(
        counts_table(view, index), ident(view.bucket.name), sql.Literal(view.ttl)
    )


def _names(view: ViewDef) -> sql.Composed:
    return comma_list([ident(g.name) for g in view.groups])
