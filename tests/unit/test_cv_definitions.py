"""Stream and view definitions parse into what the engine maintains, or fail naming what is unsupported."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.cv.frontend.statements import NO_SCOPE, numbered_statements, parse, split_statements
from pipelines.cv.model import Aggregate, Check, DefinitionError, GroupColumn, Scope, StreamDef, ViewDef
from pipelines.cv.views import compiler

SOCIAL_SQL = Path(__file__).resolve().parents[2] / "sql" / "views" / "social.sql"


CLICKS = "CREATE STREAM clicks (oid bigint, uid bigint, amount numeric, ts timestamptz) WITH (topic = 'clicks')"
LIKES = "CREATE STREAM likes (oid bigint, uid bigint, ts timestamptz) WITH (topic = 'likes', key = 'oid, uid')"
VIEW_ON_LIKES = "CREATE CONTINUOUS VIEW t.per_object AS SELECT oid, count(*) AS n FROM likes GROUP BY oid"


@pytest.fixture(scope="module")
def streams() -> dict[str, StreamDef]:
    clicks, likes = parse(CLICKS, NO_SCOPE), parse(LIKES, NO_SCOPE)
    return {"clicks": clicks, "likes": likes}


@pytest.fixture
def view(streams):
    def parse_view(query: str, options: str = "") -> ViewDef:
        return parse(f"CREATE CONTINUOUS VIEW t.v {options} AS {query}", Scope(streams, frozenset()))

    return parse_view


@pytest.fixture(scope="module")
def social() -> dict[str, StreamDef | ViewDef]:
    streams, parsed = {}, {}
    for statement in split_statements(SOCIAL_SQL.read_text()):
        definition = parse(statement, Scope(streams, frozenset()))
        if isinstance(definition, StreamDef):
            streams[definition.name] = definition
            parsed[definition.name] = definition
        else:
            parsed[definition.qualified_name] = definition
    return parsed


# --- sql/views/social.sql -------------------------------------------------------------------------


def test_the_social_file_declares_four_streams_then_five_views(social):
    assert list(social) == [
        "likes",
        "follows",
        "app_likes",
        "app_follows",
        "social.object_likes",
        "social.user_likes",
        "social.user_following",
        "social.user_followers",
        "social.object_likes_hourly",
    ]


@pytest.mark.parametrize(
    ("name", "columns", "key"),
    [("likes", ("oid", "uid", "ts"), ("oid", "uid")), ("follows", ("uid", "target", "ts"), ("uid", "target"))],
)
def test_social_streams_are_sets_keyed_by_their_pairs_on_a_topic_of_their_name(social, name, columns, key):
    stream = social[name]
    assert (stream.topic, stream.key, stream.column_names) == (name, key, columns)
    assert [c.type for c in stream.columns] == ["bigint", "bigint", "timestamptz"]
    assert [c.kind for c in stream.columns] == ["bigint", "bigint", "timestamptz"]
    assert all(c.not_null for c in stream.columns)
    assert stream.state_table == f"state_{name}"


@pytest.mark.parametrize(
    ("name", "kafka_key", "actions"), [("likes", "oid", ("like", "unlike")), ("follows", "uid", ("follow", "unfollow"))]
)
def test_social_events_are_json_keyed_by_their_first_id_and_say_insert_or_delete_in_their_action(
    social, name, kafka_key, actions
):
    stream = social[name]
    assert (stream.format, stream.kafka_key, stream.action_field) == ("json", kafka_key, "action")
    assert (stream.insert_actions, stream.delete_actions) == ((actions[0],), (actions[1],))
    assert (stream.timestamp_column, stream.unknown_fields, stream.max_event_bytes) == ("ts", "reject", 4096)
    assert (stream.partitions, stream.into) == (None, None)


@pytest.mark.parametrize("name", ["likes", "follows", "app_likes", "app_follows"])
def test_social_ids_are_positive_and_their_check_is_named_as_the_dead_letter_reason(social, name):
    ids = social[name].columns[:2]
    assert [c.checks for c in ids] == [(Check("id_out_of_range", f"{c.name} > 0"),) for c in ids]


def test_a_follow_of_oneself_is_refused_by_a_table_check(social):
    assert social["follows"].checks == social["app_follows"].checks == (Check("self_follow", "uid <> target"),)
    assert social["likes"].checks == social["app_likes"].checks == ()


@pytest.mark.parametrize(("name", "into"), [("app_likes", "likes"), ("app_follows", "follows")])
def test_the_application_tables_changes_feed_the_streams_of_the_same_rows(social, name, into):
    stream = social[name]
    assert (stream.topic, stream.format, stream.into, stream.key) == (f"cdc.app.{into}", "debezium", into, None)
    assert stream.column_names[2] == stream.timestamp_column == "created_at"
    assert [c.type for c in stream.columns] == [c.type for c in social[into].columns]


def by(name: str, sql: str | None = None) -> GroupColumn:
    return GroupColumn(name, sql or name, sql or name)


@pytest.mark.parametrize(
    ("name", "stream", "groups", "aggregates"),
    [
        ("object_likes", "likes", (by("oid"),), (Aggregate("like_count", "count"), Aggregate("likers", "set", "uid"))),
        ("user_likes", "likes", (by("uid"),), (Aggregate("liked_objects", "set", "oid"),)),
        ("user_following", "follows", (by("uid"),), (Aggregate("following", "set", "target"),)),
        ("user_followers", "follows", (by("uid", "target"),), (Aggregate("followers", "set", "uid"),)),
    ],
)
def test_social_set_views_keep_everything_and_forget_retracted_members(social, name, stream, groups, aggregates):
    view = social[f"social.{name}"]
    assert (view.schema, view.name, view.stream) == ("social", name, stream)
    assert (view.groups, view.aggregates) == (groups, aggregates)
    assert (view.where_sql, view.ttl, view.bucket, view.options) == (None, None, None, {})
    assert view.distinct_arg == aggregates[-1].arg_sql
    assert not view.is_monotonic


def test_hourly_likes_are_bucketed_by_hour_kept_30_days_and_monotonic_because_of_the_sketch(social):
    view = social["social.object_likes_hourly"]
    hour = GroupColumn("hour", "date_trunc('hour', ts)", None, "hour")
    assert view.groups == (by("oid"), hour)
    assert view.aggregates == (Aggregate("likes", "count"), Aggregate("likers_hll", "hll", "hll_hash_bigint(uid)"))
    assert (view.ttl, view.options, view.bucket, view.where_sql) == ("30 days", {"ttl": "30 days"}, hour, None)
    assert view.is_monotonic
    assert view.distinct_arg is None


def test_split_statements_drops_comments_and_the_trailing_semicolons():
    statements = split_statements(SOCIAL_SQL.read_text())
    assert len(statements) == 9
    assert not any(s.startswith("--") or s.endswith(";") for s in statements)


def test_split_statements_keeps_each_statement_as_written():
    assert split_statements(LIKES + ";\n" + CLICKS + ";") == [LIKES, CLICKS]


def test_statements_are_numbered_with_their_lines_and_labelled():
    text = f"-- likes\n{LIKES};\n/* nothing */;\n/* a view; with a semicolon */\n{VIEW_ON_LIKES}\n  ;\n"
    statements = numbered_statements(text)
    assert [(s.number, s.line, s.text) for s in statements] == [(1, 2, LIKES), (2, 5, VIEW_ON_LIKES)]
    assert [s.label for s in statements] == ["CREATE STREAM likes", "CREATE CONTINUOUS VIEW t.per_object"]
    assert split_statements(text) == [LIKES, VIEW_ON_LIKES]
    assert numbered_statements("-- only a comment\n;") == []


def test_a_semicolon_in_a_string_does_not_split():
    statement = "CREATE STREAM s (a text) WITH (topic = 'a;b')"
    assert split_statements(statement) == [statement]


UNBALANCED = "CREATE STREAM oops (a bigint) WITH (topic = 'oops'"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (UNBALANCED, "^CREATE STREAM oops: syntax error: syntax error at end of input$"),
        (f"{UNBALANCED};\n{LIKES};", "^CREATE STREAM oops: syntax error"),
        (f"{LIKES};\n\n{UNBALANCED};", r"^statement 2 \(line 3\): CREATE STREAM oops: syntax error"),
        (f"{LIKES};\njunk here;\n{CLICKS};", r"^statement 2 \(line 2\): expected CREATE STREAM"),
        (f"{LIKES};\n)", r"^statement 2 \(line 2\): expected CREATE STREAM"),
    ],
)
def test_text_that_is_no_complete_statement_is_an_error_naming_it_never_dropped(text, message):
    with pytest.raises(DefinitionError, match=message):
        split_statements(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("CREATE STREAM x (a text DEFAULT 'oops", "unterminated quoted string"),
        ("CREATE STREAM x (a text) /* no end", "unterminated /\\* comment"),
        ("CREATE STREAM x (a text DEFAULT $$oops", "unterminated dollar-quoted string"),
    ],
)
def test_an_unterminated_quote_or_comment_is_a_definition_error(text, message):
    for read in (split_statements, lambda t: parse(t, NO_SCOPE)):
        with pytest.raises(DefinitionError, match=f"^syntax error: {message}"):
            read(text)


@pytest.mark.parametrize("comment", ["/* c */ ", "/* c */\n-- d\n", "-- c\n", "-- c\n/* d; e */\n"])
def test_comments_before_a_statement_are_skipped(comment):
    stream = parse(comment + LIKES, NO_SCOPE)
    assert (stream.name, stream.definition) == ("likes", LIKES)
    assert split_statements(comment + LIKES + ";") == [LIKES]


# --- views ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "stored", "monotonic"),
    [
        ("count(*)", [("a", "count", None)], False),
        ("count(uid)", [("a", "count", "uid")], False),
        ("count(DISTINCT uid)", [("a", "count_distinct", "uid")], False),
        # sum and avg add up cv.sum_term(x): real in double precision, as PostgreSQL's avg(real)
        ("sum(amount)", [("_cv_a_0", "count", "amount"), ("_cv_a_1", "sum", "cv.sum_term(amount)")], False),
        ("avg(amount)", [("_cv_a_0", "count", "amount"), ("_cv_a_1", "sum", "cv.sum_term(amount)")], False),
        (
            "stddev(amount)",
            [
                ("_cv_a_0", "count", "amount"),
                ("_cv_a_1", "sum", "(cv.sum_term(amount))::numeric"),
                ("_cv_a_2", "sum", "(cv.sum_term(amount))::numeric * (cv.sum_term(amount))::numeric"),
            ],
            False,
        ),
        ("min(ts)", [("a", "min", "ts")], False),
        ("max(ts)", [("a", "max", "ts")], False),
        # NULL is counted apart (PostgreSQL lists it last); clicks has no key, so uid may be NULL
        ("array_agg(DISTINCT uid)", [("_cv_a_0", "set", "uid"), ("_cv_a_1", "count", None)], False),
        ("hll_add_agg(hll_hash_bigint(uid))", [("a", "hll", "hll_hash_bigint(uid)")], True),
        ("percentile_cont(0.9) WITHIN GROUP (ORDER BY amount)", [("_cv_a_0", "tdigest", "(amount)::float8")], True),
        ("topk_agg(uid, 5)", [("_cv_a_0", "topk", "uid")], True),
        ("bit_or(uid)", [("a", "state", "uid")], True),
    ],
)
def test_each_call_is_kept_as_stored_aggregates_and_only_forgetful_ones_keep_empty_groups(
    view, expression, stored, monotonic
):
    parsed = view(f"SELECT oid, {expression} AS a FROM clicks GROUP BY oid")
    assert (parsed.schema, parsed.name, parsed.stream, parsed.groups) == ("t", "v", "clicks", (by("oid"),))
    assert [(a.name, a.kind, a.arg_sql) for a in parsed.aggregates] == stored
    assert parsed.is_monotonic is monotonic


def test_outputs_keep_the_select_order_and_calls_share_what_they_store(view):
    parsed = view(
        "SELECT count(*) AS n, oid, sum(amount) / count(*) AS mean, avg(amount) AS a, count(*) FROM clicks GROUP BY oid"
    )
    assert [(o.name, o.sql, o.is_group) for o in parsed.outputs] == [
        ("n", "_cv_call_0_", False),
        ("oid", "oid", True),
        ("mean", "_cv_call_1_ / _cv_call_2_", False),
        ("a", "_cv_call_3_", False),
        ("count", "_cv_call_4_", False),  # named after the function, as PostgreSQL names it
    ]
    assert [a.name for a in parsed.aggregates] == ["n", "_cv_mean_1", "_cv_mean_2"]  # count(*) once
    assert [c.stored for c in parsed.calls] == [
        ("n",),
        ("_cv_mean_1", "_cv_mean_2"),
        ("n",),
        ("_cv_mean_1", "_cv_mean_2"),
        ("n",),
    ]


def test_pipelinedbs_distinct_count_names_keep_their_meaning(view):
    exact = view("SELECT oid, exact_count_distinct(uid) AS u FROM clicks GROUP BY oid")
    assert exact.aggregates == view("SELECT oid, count(DISTINCT uid) AS u FROM clicks GROUP BY oid").aggregates
    approx = view("SELECT oid, approx_count_distinct(uid) AS u FROM clicks GROUP BY oid")
    assert [(a.kind, a.arg_sql) for a in approx.aggregates] == [("hll", "hll_hash_any(uid)")]


def test_a_filter_is_kept_with_the_aggregate_it_restricts(view):
    parsed = view("SELECT oid, count(*) FILTER (WHERE amount > 10) AS big FROM clicks GROUP BY oid")
    assert parsed.aggregates == (Aggregate("big", "count", None, "amount > 10"),)


@pytest.mark.parametrize("expression", ["percentile_cont(0.5) WITHIN GROUP (ORDER BY uid)", "topk_agg(uid, 3)"])
def test_an_aggregate_that_cannot_forget_is_refused_over_a_keyed_stream(view, expression):
    with pytest.raises(DefinitionError, match="append-only"):
        view(f"SELECT oid, {expression} AS a FROM likes GROUP BY oid")


def test_distinct_aggregates_over_the_same_expression_share_one_distinct_arg(view):
    parsed = view("SELECT oid, count(DISTINCT uid) AS n, array_agg(DISTINCT uid) AS uids FROM likes GROUP BY oid")
    assert parsed.distinct_arg == "uid"


def test_a_sketch_may_be_kept_over_a_keyed_stream_because_retractions_leave_it_unchanged(view):
    parsed = view("SELECT oid, hll_add_agg(hll_hash_bigint(uid)) AS h FROM likes GROUP BY oid")
    assert parsed.is_monotonic


def test_an_unqualified_view_lives_in_public(streams):
    parsed = parse(
        "CREATE CONTINUOUS VIEW v AS SELECT oid, count(*) AS n FROM clicks GROUP BY oid", Scope(streams, frozenset())
    )
    assert parsed.qualified_name == "public.v"


@pytest.mark.parametrize("group_by", ["hour", "date_trunc('hour', ts)"])
def test_group_by_names_an_output_column_by_alias_or_by_expression(view, group_by):
    parsed = view(f"SELECT date_trunc('hour', ts) AS hour, count(*) AS n FROM clicks GROUP BY {group_by}")
    assert parsed.groups == (GroupColumn("hour", "date_trunc('hour', ts)", None, "hour"),)


@pytest.mark.parametrize(("unit", "bucket_unit"), [("'day'", "day"), ("'HOUR'", "hour"), ("'fortnight'", None)])
def test_date_trunc_of_a_stream_column_by_a_known_unit_is_a_time_bucket(view, unit, bucket_unit):
    parsed = view(f"SELECT date_trunc({unit}, ts) AS b, count(*) AS n FROM clicks GROUP BY b")
    assert parsed.groups[0].bucket_unit == bucket_unit
    assert (parsed.bucket is not None) is (bucket_unit is not None)


def test_an_expression_group_has_no_source_column(view):
    parsed = view("SELECT oid % 10 AS shard, count(*) AS n FROM clicks GROUP BY oid % 10")
    assert parsed.groups == (GroupColumn("shard", "oid % 10", None, None),)


def test_where_is_kept_as_sql_text(view):
    parsed = view("SELECT oid, sum(amount) AS total FROM clicks WHERE amount > 0 AND uid <> 7 GROUP BY oid")
    assert parsed.where_sql == "amount > 0 AND uid <> 7"


def test_ttl_applies_to_the_time_bucket(view):
    parsed = view(
        "SELECT date_trunc('day', ts) AS day, count(*) AS n FROM clicks GROUP BY day", "WITH (ttl = '7 days')"
    )
    assert (parsed.ttl, parsed.options, parsed.bucket.name) == ("7 days", {"ttl": "7 days"}, "day")


@pytest.mark.parametrize(
    ("options", "match"),
    [("WITH (ttl = '1 day')", "time bucket"), ("WITH (retention = '1 day')", "unknown option 'retention'")],
)
def test_view_options_are_ttl_only_and_ttl_needs_a_time_bucket(view, options, match):
    with pytest.raises(DefinitionError, match=match):
        view("SELECT oid, count(*) AS n FROM clicks GROUP BY oid", options)


def unsupported(query: str, match: str, id: str):
    return pytest.param(query, match, id=id)


@pytest.mark.parametrize(
    ("query", "match"),
    [
        unsupported("SELECT oid, count(*) AS n FROM clicks JOIN likes USING (oid) GROUP BY oid", "joins", "join"),
        unsupported(
            "SELECT oid, sum(n) AS n FROM (SELECT oid, count(*) AS n FROM clicks GROUP BY oid) c GROUP BY oid",
            "subquery in FROM may only project and filter",
            "from-sub",
        ),
        unsupported("SELECT oid, count(*) AS n FROM clicks WHERE uid IN (SELECT 1) GROUP BY oid", "subq", "where-sub"),
        unsupported("SELECT oid, count(*) AS n FROM clicks GROUP BY oid HAVING count(*) > 1", "HAVING", "having"),
        unsupported("SELECT oid, count(*) AS n FROM clicks GROUP BY oid ORDER BY oid", "ORDER BY", "order-by"),
        unsupported("SELECT oid, count(*) AS n FROM clicks GROUP BY oid LIMIT 1", "LIMIT", "limit"),
        unsupported("SELECT DISTINCT oid, count(*) AS n FROM clicks GROUP BY oid", "DISTINCT", "select-distinct"),
        unsupported("SELECT oid, count(*) OVER () AS n FROM clicks GROUP BY oid", "OVER", "window-aggregate"),
        unsupported("SELECT oid, rank() OVER () AS r, count(*) AS n FROM clicks GROUP BY oid", "window", "window"),
        unsupported(
            "SELECT oid, count(DISTINCT uid) FILTER (WHERE uid > 1) AS n FROM clicks GROUP BY oid", "FILTER", "filter"
        ),
        unsupported("SELECT oid, count(*) AS n FROM clicks GROUP BY oid UNION SELECT 1, 1", "UNION", "union"),
        unsupported("SELECT * FROM clicks", r"SELECT \*", "select-star"),
        unsupported("SELECT oid, count(*) AS n FROM views GROUP BY oid", "not a stream", "unknown-stream"),
        unsupported("SELECT oid, count(nope) AS n FROM clicks GROUP BY oid", "not a column", "unknown-column"),
        unsupported("SELECT oid, uid, count(*) AS n FROM clicks GROUP BY oid", "must appear in GROUP BY", "ungrouped"),
        unsupported("SELECT oid, count(*) AS n FROM clicks GROUP BY ROLLUP (oid)", "ROLLUP", "rollup"),
        unsupported("SELECT oid, array_agg(ts) AS a FROM likes GROUP BY oid", "cannot forget a retracted row", "array"),
        unsupported("SELECT oid, count(*) AS oid FROM clicks GROUP BY oid", "two output columns", "same-name"),
        unsupported("SELECT oid, count(*) AS n FROM clicks GROUP BY oid,", "syntax error", "syntax-error"),
        unsupported(
            "SELECT oid, string_agg(uid::text, ',') AS a FROM likes GROUP BY oid", "cannot forget", "string-agg"
        ),
        unsupported("SELECT oid, sum(*) AS s FROM clicks GROUP BY oid", "sum", "sum-star"),
        unsupported(
            "SELECT oid, count(*) AS n, avg(uid) AS a FROM clicks GROUP BY oid, a", "is an aggregate", "agg-group"
        ),
        unsupported("SELECT oid, count(*) AS n FROM clicks WHERE count(*) > 0 GROUP BY oid", "WHERE", "agg-where"),
    ],
)
def test_an_unsupported_view_shape_is_rejected_naming_it(view, query, match):
    with pytest.raises(DefinitionError, match=match):
        view(query)


@pytest.mark.parametrize(
    ("query", "from_transitions"),
    [
        ("SELECT oid, count(*) AS n, array_agg(DISTINCT uid) AS likers FROM likes GROUP BY oid", True),
        ("SELECT uid, array_agg(DISTINCT oid) AS liked, count(DISTINCT oid) AS n FROM likes GROUP BY uid", True),
        # sum needs the rows themselves, not just which values entered or left
        ("SELECT oid, sum(uid) AS s, array_agg(DISTINCT uid) AS likers FROM likes GROUP BY oid", False),
        # the distinct argument is not a key column: a transition is not one stream row
        ("SELECT oid, uid, count(*) AS n, array_agg(DISTINCT ts) AS at FROM likes GROUP BY oid, uid", False),
        # not covered: a user's objects per hour need reference counts
        ("SELECT date_trunc('hour', ts) AS h, array_agg(DISTINCT uid) AS u FROM likes GROUP BY h", False),
        # an append-only stream has no transitions to speak of
        ("SELECT oid, count(*) AS n, array_agg(DISTINCT uid) AS u FROM clicks GROUP BY oid", False),
    ],
)
def test_count_and_set_views_over_a_key_are_aggregated_from_transitions_alone(view, streams, query, from_transitions):
    parsed = view(query)
    assert compiler.counts_from_transitions(parsed, streams[parsed.stream]) is from_transitions


@pytest.mark.parametrize(
    ("call", "match"),
    [
        ("topk_agg(uid, 0)", "k a positive integer constant"),
        ("topk_agg(uid, -3)", "k a positive integer constant"),
        ("topk_agg(uid, 1001)", "k is at most 1000"),
        ("topk_agg(uid, 300000000)", "k is at most 1000"),
        ("topk_agg(uid, 3000000000)", "k a positive integer constant"),
        ("percentile_cont(1.5) WITHIN GROUP (ORDER BY amount)", "between 0 and 1"),
        ("percentile_cont(-0.1) WITHIN GROUP (ORDER BY amount)", "between 0 and 1"),
        ("percentile_cont(ARRAY[0.5, 2]) WITHIN GROUP (ORDER BY amount)", "between 0 and 1"),
        ("percentile_cont('{0.5,1.01}'::float8[]) WITHIN GROUP (ORDER BY amount)", "between 0 and 1"),
        ("percentile_cont('NaN'::float8) WITHIN GROUP (ORDER BY amount)", "between 0 and 1"),
        ("percentile_cont(NULL) WITHIN GROUP (ORDER BY amount)", "between 0 and 1"),
        ("percentile_cont(ARRAY[]::float8[]) WITHIN GROUP (ORDER BY amount)", "between 0 and 1"),
        ("percentile_cont(uid) WITHIN GROUP (ORDER BY amount)", "a constant between 0 and 1"),
    ],
)
def test_an_aggregates_parameters_are_checked_when_the_view_is_defined_not_at_its_first_event(view, call, match):
    with pytest.raises(DefinitionError, match=match) as caught:
        view(f"SELECT oid, {call} AS a FROM clicks GROUP BY oid")
    assert str(caught.value).startswith("continuous view t.v: ")


@pytest.mark.parametrize(
    "call",
    [
        "topk_agg(uid, 1)",
        "topk_agg(uid, 1000)",
        "percentile_cont(0) WITHIN GROUP (ORDER BY amount)",
        "percentile_cont(1) WITHIN GROUP (ORDER BY amount)",
        "percentile_cont('0.5'::float8) WITHIN GROUP (ORDER BY amount)",
        "percentile_cont(ARRAY[0.1, 0.5, 0.99]) WITHIN GROUP (ORDER BY amount)",
        "percentile_cont('{0.1,0.9}'::float8[]) WITHIN GROUP (ORDER BY amount)",
    ],
)
def test_parameters_within_their_limits_are_accepted(view, call):
    assert view(f"SELECT oid, {call} AS a FROM clicks GROUP BY oid").calls


@pytest.mark.parametrize(
    ("statement", "match"),
    [
        ('CREATE CONTINUOUS VIEW t."v\n" AS SELECT oid, count(*) AS n FROM clicks GROUP BY oid', "plain lower-case"),
        ('CREATE CONTINUOUS VIEW "t\n".v AS SELECT oid, count(*) AS n FROM clicks GROUP BY oid', "plain lower-case"),
        ('CREATE CONTINUOUS VIEW t.v AS SELECT oid, count(*) AS "n\n" FROM clicks GROUP BY oid', "plain lower-case"),
        (
            "CREATE CONTINUOUS VIEW t.v WITH (ttl = E'1 day\\n') AS SELECT oid, count(*) AS n FROM clicks GROUP BY oid",
            "control character",
        ),
    ],
)
def test_a_name_or_option_with_a_control_character_is_refused(streams, statement, match):
    with pytest.raises(DefinitionError, match=match):
        parse(statement, Scope(streams, frozenset()))
