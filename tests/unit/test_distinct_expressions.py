"""DISTINCT aggregates over several expressions in one view: each expression keeps its own reference counts.

The first expression keeps `<storage>__refs` (the name views with one expression always had), the
others `__refs2`, `__refs3`, ...; each is maintained by the same statements, and each aggregate reads
the transitions of its own expression.
"""

from __future__ import annotations

import pytest

from pipelines.cv.frontend.statements import NO_SCOPE, parse
from pipelines.cv.model import DefinitionError, Scope, StreamDef, ViewDef
from pipelines.cv.views import compiler, refs
from pipelines.cv.views.view_types import ViewTypes

CLICKS = "CREATE STREAM clicks (url text, uid bigint, ms int, ts timestamptz) WITH (topic = 'clicks')"
LIKES = "CREATE STREAM likes (url text, uid bigint, ms int) WITH (topic = 'likes', key = 'url, uid')"
THREE = (
    "SELECT url, count(DISTINCT uid) AS users, count(DISTINCT ms) AS latencies, array_agg(DISTINCT ms) AS each_ms,"
    " array_agg(DISTINCT url) AS urls, count(*) AS n FROM {} GROUP BY url"
)


@pytest.fixture(scope="module")
def streams() -> dict[str, StreamDef]:
    return {"clicks": parse(CLICKS, NO_SCOPE), "likes": parse(LIKES, NO_SCOPE)}


def define(streams: dict[str, StreamDef], query: str) -> ViewDef:
    view = parse(f"CREATE CONTINUOUS VIEW t.v AS {query}", Scope(streams, frozenset()))
    assert isinstance(view, ViewDef)
    return view


def text(statement) -> str:
    return statement.as_string(None)


STORED = ("bigint", "bigint", "integer[]", "bigint", "text[]", "bigint", "bigint")
TYPES = ViewTypes(("text",), STORED, "bigint", (), {}, True)


def typed(types: ViewTypes) -> ViewTypes:
    return ViewTypes(types.groups, types.aggregates, types.distinct_arg, (), {}, True, ("integer", "text"))


def test_each_distinct_expression_is_listed_once_in_order_of_first_use(streams):
    view = define(streams, THREE.format("clicks"))
    assert view.distinct_args == ("uid", "ms", "url")
    assert view.distinct_arg == "uid"


def test_each_expression_keeps_reference_counts_of_its_own_the_first_under_the_old_name(streams):
    view = define(streams, THREE.format("clicks"))
    ddl = [text(s) for s in compiler.create_view_tables(view, streams["clicks"], typed(TYPES))]
    refs = [s for s in ddl if "__refs" in s]
    assert [s.split(" (")[0] for s in refs] == [
        'CREATE TABLE "cv"."t__v__refs"',
        'CREATE TABLE "cv"."t__v__refs2"',
        'CREATE TABLE "cv"."t__v__refs3"',
    ]
    assert ["value bigint" in refs[0], "value integer" in refs[1], "value text" in refs[2]] == [True] * 3
    # Each set of values (array_agg(DISTINCT)) carries a batch's removals in a scratch column of its own.
    assert '"_cv_removed2" integer[]' in ddl[0]
    assert '"_cv_removed3" text[]' in ddl[0]
    assert '"_cv_removed" ' not in ddl[0]


def test_each_expressions_reference_counts_move_by_the_same_statement_over_its_own_values(streams):
    view = define(streams, THREE.format("clicks"))
    updates = [text(s) for s in compiler.update_all_refs(view, streams["clicks"], compiler.ident("d"))]
    assert len(updates) == 3
    for suffix, arg, statement in zip(("", "2", "3"), ("uid", "ms", "url"), updates, strict=True):
        assert f'INSERT INTO "cv"."t__v__refs{suffix}"' in statement
        assert f"{arg} AS value" in statement
        assert f"({arg}) IS NOT NULL" in statement
        assert f'INSERT INTO "pg_temp"."cv_trans_t_v{suffix}"' in statement
    drops = [text(s) for s in refs.drop_all_dead_refs(view, streams["clicks"])]
    assert [d.split(" AS r")[0] for d in drops] == [
        'DELETE FROM "cv"."t__v__refs"',
        'DELETE FROM "cv"."t__v__refs2"',
        'DELETE FROM "cv"."t__v__refs3"',
    ]


def test_each_aggregate_reads_the_transitions_of_its_own_expression(streams):
    view = define(streams, THREE.format("clicks"))
    upsert = text(compiler.apply_deltas(view, streams["clicks"], compiler.ident("d")))
    for suffix in ("", "2", "3"):
        assert f'FROM "pg_temp"."cv_trans_t_v{suffix}" AS t' in upsert
    assert "sum(_cv_tsign) FILTER (WHERE (_cv_value) IS NOT NULL)" in upsert  # count(DISTINCT uid)
    assert "sum(_cv_tsign2) FILTER (WHERE (_cv_value2) IS NOT NULL)" in upsert  # count(DISTINCT ms)
    assert "array_agg(_cv_value2) FILTER (WHERE _cv_tsign2 > 0" in upsert  # array_agg(DISTINCT ms)
    assert "array_agg(_cv_value3) FILTER (WHERE _cv_tsign3 < 0" in upsert  # url's removals


def test_an_expression_the_streams_key_covers_needs_no_reference_counts_the_others_do(streams):
    # likes is keyed by (url, uid): per url, each uid is one row, so its deltas are its transitions.
    view = define(
        streams, "SELECT url, count(DISTINCT uid) AS users, count(DISTINCT ms) AS latencies FROM likes GROUP BY url"
    )
    assert compiler.refs_indexes(view, streams["likes"]) == [1]
    upsert = text(compiler.apply_deltas(view, streams["likes"], compiler.ident("d")))
    assert "HAVING sum(_cv_sign) <> 0" in upsert  # uid: the deltas netted
    assert 'FROM "pg_temp"."cv_trans_t_v2" AS t' in upsert  # ms: its reference counts' transitions
    assert not compiler.counts_from_transitions(view, streams["likes"])


def test_emptying_a_view_empties_every_reference_count_table(streams):
    view = define(streams, THREE.format("clicks"))
    deletes = [text(s) for s in compiler.reset_storage(view, streams["clicks"])]
    assert deletes[1:] == [f'DELETE FROM "cv"."t__v__refs{s}"' for s in ("", "2", "3")]


def test_the_types_of_the_other_expressions_are_kept_with_the_view():
    types = typed(TYPES)
    assert ViewTypes.from_json(types.to_json()) == types
    assert [types.distinct_type(i) for i in range(3)] == ["bigint", "integer", "text"]
    older = {k: v for k, v in types.to_json().items() if k != "distinct_more"}  # a view stored before
    assert ViewTypes.from_json(older).distinct_more == ()


def test_retention_reaches_every_expressions_reference_counts(streams):
    view = parse(
        "CREATE CONTINUOUS VIEW t.hourly WITH (ttl = '1 day') AS SELECT date_trunc('hour', ts) AS hour,"
        " count(DISTINCT uid) AS users, count(DISTINCT url) AS urls FROM clicks GROUP BY hour",
        Scope(streams, frozenset()),
    )
    deletes = [text(s) for s in compiler.expire(view, streams["clicks"])]
    assert deletes[1:] == [
        f"""DELETE FROM "cv"."t__hourly__refs{s}" WHERE "hour" < now() - '1 day'::interval""" for s in ("", "2")
    ]


def test_every_distinct_aggregate_over_an_expression_reads_its_one_kept_set(streams):
    view = define(
        streams,
        "SELECT url, sum(DISTINCT ms) AS s, avg(DISTINCT ms) AS a, string_agg(DISTINCT url, ',') AS t,"
        " json_agg(DISTINCT ms) AS j FROM clicks GROUP BY url",
    )
    assert view.distinct_args == ("ms", "url")
    sets = [a for a in view.aggregates if a.kind == "set"]
    assert [a.arg_sql for a in sets] == ["ms", "url"]  # one set per expression, shared by its calls
    assert any(a.kind == "count" and a.filter_sql == "(ms) IS NULL" for a in view.aggregates)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        ("string_agg(DISTINCT url, uid::text)", "constant delimiter"),
        ("count(DISTINCT uid) FILTER (WHERE ms > 1)", "FILTER on a DISTINCT aggregate"),
        ("bit_or(DISTINCT uid)", "DISTINCT works with count, sum, avg, array_agg, json_agg"),
    ],
)
def test_a_distinct_aggregate_that_cannot_be_kept_is_refused_in_one_line(streams, call, match):
    with pytest.raises(DefinitionError, match=match):
        define(streams, f"SELECT url, {call} AS x FROM clicks GROUP BY url")


def test_a_sliding_window_counts_each_expression_in_a_sketch_and_keeps_no_reference_counts(streams):
    view = define(
        streams,
        "SELECT url, count(DISTINCT uid) AS u, count(DISTINCT ms) AS m FROM clicks"
        " WHERE ts > now() - interval '1 minute' GROUP BY url",
    )
    assert [(a.kind, a.arg_sql) for a in view.aggregates] == [("hll", "hll_hash_any(uid)"), ("hll", "hll_hash_any(ms)")]
    assert view.distinct_args == ()
    assert not compiler.uses_refs(view, streams["clicks"])
