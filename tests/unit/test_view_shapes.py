"""PipelineDB's query shapes as written, read by the view parser into the one shape the engine keeps (no database)."""

from __future__ import annotations

import pytest

from pipelines.cv.frontend.statements import parse
from pipelines.cv.frontend.view_shapes import EACH_ROW_GROUP, GLOBAL_GROUP
from pipelines.cv.frontend.windows import STEP_COLUMN
from pipelines.cv.model import DefinitionError, Join, JoinedTable, Scope, Window
from pipelines.cv.views import compiler
from pipelines.cv.views.view_types import ViewTypes

CLICKS = (
    "CREATE STREAM clicks (url text, uid bigint, latency float8, ts timestamptz) "
    "WITH (topic = 'c', timestamp_column = 'ts')"
)
LIKES = "CREATE STREAM likes (oid bigint, uid bigint, ts timestamptz) WITH (topic = 'l', key = 'oid, uid')"


@pytest.fixture
def view():
    streams = {}
    for statement in (CLICKS, LIKES):
        stream = parse(statement, Scope(streams, frozenset()))
        streams[stream.name] = stream

    def define(select: str, options: str = ""):
        return parse(f"CREATE CONTINUOUS VIEW web.v {options} AS {select}", Scope(streams, frozenset()))

    return define


def test_a_view_without_group_by_is_one_row_under_a_constant_group(view):
    parsed = view("SELECT count(*), avg(latency) FROM clicks")
    assert parsed.groups == (GLOBAL_GROUP,)
    assert [o.name for o in parsed.outputs] == ["count", "avg"]
    assert view("SELECT count(*) AS n FROM likes").groups == (GLOBAL_GROUP,)  # a keyed stream too


def test_a_group_by_expression_that_is_no_output_is_a_hidden_group(view):
    parsed = view("SELECT count(*) AS n FROM clicks GROUP BY url, lower(url)")
    assert [(g.name, g.sql) for g in parsed.groups] == [("_cv_by_0", "url"), ("_cv_by_1", "lower(url)")]
    assert [o.name for o in parsed.outputs] == ["n"]
    parsed = view("SELECT url, count(*) AS n FROM clicks GROUP BY 1, uid")
    assert [g.name for g in parsed.groups] == ["url", "_cv_by_0"]


def test_outputs_are_named_as_postgresql_names_them_and_may_be_over_grouped_columns(view):
    parsed = view("SELECT uid::text, upper(url), count(*), coalesce(max(latency), 0) FROM clicks GROUP BY uid, url")
    assert [o.name for o in parsed.outputs] == ["uid", "upper", "count", "coalesce"]
    assert [(g.name, g.sql) for g in parsed.groups] == [
        ("uid", "CAST(uid AS text)"),
        ("upper", "upper(url)"),
        ("_cv_by_0", "uid"),
        ("_cv_by_1", "url"),
    ]


def test_a_view_without_aggregates_or_group_by_keeps_each_row(view):
    parsed = view("SELECT url, uid FROM clicks WHERE arrival_timestamp > clock_timestamp() - interval '1 minute'")
    assert [g.name for g in parsed.groups] == ["url", "uid", EACH_ROW_GROUP.name, STEP_COLUMN]
    assert parsed.window == Window("ts", "1 minute")
    assert view("SELECT DISTINCT url, uid FROM clicks").groups == view("SELECT url, uid FROM clicks").groups[:-1]


def test_an_output_postgresql_cannot_name_is_named_question_column(view):
    parsed = view("SELECT url || '!', count(*) + sum(uid) AS n FROM clicks GROUP BY url")
    assert [o.name for o in parsed.outputs] == ["?column?", "n"]
    parsed = view("SELECT url, count(*) + sum(uid) FROM clicks GROUP BY url")
    assert [o.name for o in parsed.outputs] == ["url", "?column?"]
    assert all(a.name.startswith("_cv_column_") for a in parsed.aggregates)


def test_select_distinct_and_a_view_without_aggregates_keep_each_group(view):
    distinct = view("SELECT DISTINCT url, uid FROM clicks")
    grouped = view("SELECT url, uid FROM clicks GROUP BY url, uid")
    assert distinct.groups == grouped.groups
    assert [g.name for g in distinct.groups] == ["url", "uid"]
    assert distinct.aggregates == ()


@pytest.mark.parametrize(
    "options",
    [
        "WITH (sw = '1 minute')",
        "WITH (sw = '1 minute', step_factor = 10)",
        "WITH (sw = '1 minute', step_factor = '1')",
        "WITH (sw = '1 minute', sw_column = 'ts')",
    ],
)
def test_the_sw_option_is_a_window_over_arrival_timestamp(view, options):
    parsed = view("SELECT url, count(*) FROM clicks GROUP BY url", options)
    window = "arrival_timestamp > clock_timestamp() - interval '1 minute'"
    written = view(f"SELECT url, count(*) FROM clicks WHERE {window} GROUP BY url")
    assert parsed.window == written.window == Window("ts", "1 minute")
    assert parsed.groups == written.groups
    assert parsed.groups[-1].name == STEP_COLUMN


def test_arrival_timestamp_and_qualified_and_aliased_columns_read_as_the_stream_columns(view):
    parsed = view("SELECT x.url, max(x.arrival_timestamp) AS last, count(*) FROM public.clicks AS x GROUP BY x.url")
    assert [g.sql for g in parsed.groups] == ["url"]
    assert [a.arg_sql for a in parsed.aggregates if a.kind == "max"] == ["ts"]
    parsed = view("SELECT arrival_timestamp, clicks.url, count(*) FROM clicks GROUP BY 1, 2")
    assert [(g.name, g.sql) for g in parsed.groups] == [("arrival_timestamp", "ts"), ("url", "url")]


@pytest.mark.parametrize(
    "select",
    [
        "SELECT p.s, count(*) AS n FROM clicks c JOIN pages p ON p.url = c.url GROUP BY p.s",
        "SELECT p.s, count(*) AS n FROM pages p JOIN clicks c ON p.url = c.url GROUP BY p.s",
        "SELECT p.s, count(*) AS n FROM clicks c, pages p WHERE p.url = c.url GROUP BY p.s",
        "SELECT p.s, count(*) AS n FROM clicks c JOIN pages p USING (url) GROUP BY p.s",
        "SELECT p.s, count(*) AS n FROM pages p RIGHT JOIN clicks c ON p.url = c.url GROUP BY p.s",
    ],
)
def test_a_join_is_read_whichever_way_postgresql_lets_it_be_written(view, select):
    parsed = view(select)
    ((table),) = parsed.join.tables
    assert (parsed.join.stream_alias, table.table, table.alias) == ("c", "pages", "p")
    assert table.left is ("RIGHT" in select)
    conditions = {table.on_sql, parsed.where_sql}
    assert conditions & {"p.url = c.url", "c.url = p.url"}


def test_using_columns_are_the_streams(view):
    parsed = view("SELECT url, count(*) AS n FROM clicks c LEFT JOIN pages p USING (url) GROUP BY url")
    assert parsed.join == Join("c", (JoinedTable("pages", "p", True, "c.url = p.url"),))
    assert [g.sql for g in parsed.groups] == ["c.url"]


@pytest.mark.parametrize(
    ("select", "tables", "where"),
    [
        (  # each table joined with what comes before it, in the order written
            "SELECT u.name, count(*) FROM clicks c JOIN pages p ON p.url = c.url LEFT JOIN users u ON u.id = p.owner"
            " GROUP BY u.name",
            [("pages", "p", False, "p.url = c.url"), ("users", "u", True, "u.id = p.owner")],
            None,
        ),
        (  # the stream second, its first table kept by RIGHT JOIN's rule; then USING a stream column
            "SELECT u.name, count(*) FROM pages p RIGHT JOIN clicks c ON p.url = c.url JOIN users u USING (uid)"
            " GROUP BY u.name",
            [("pages", "p", True, "p.url = c.url"), ("users", "u", False, "c.uid = u.uid")],
            None,
        ),
        (  # inner joins of the tables first: the stream first, every condition kept
            "SELECT u.name, count(*) FROM pages p JOIN users u ON u.id = p.owner JOIN clicks c ON c.url = p.url"
            " GROUP BY u.name",
            [("pages", "p", False, "TRUE"), ("users", "u", False, "u.id = p.owner AND c.url = p.url")],
            None,
        ),
        (  # a comma join with a join of tables: the same joins, the tables' USING their condition
            "SELECT u.name, count(*) FROM clicks c, pages p JOIN users u USING (owner) WHERE p.url = c.url"
            " GROUP BY u.name",
            [("pages", "p", False, "TRUE"), ("users", "u", False, "p.owner = u.owner")],
            "p.url = c.url",
        ),
        (  # a comma join of three: the WHERE clause joins them
            "SELECT u.name, count(*) FROM clicks c, pages p, users u WHERE p.url = c.url AND u.id = p.owner"
            " GROUP BY u.name",
            [("pages", "p", False, "TRUE"), ("users", "u", False, "TRUE")],
            "p.url = c.url AND u.id = p.owner",
        ),
    ],
)
def test_a_stream_joins_any_number_of_tables_each_after_what_comes_before_it(view, select, tables, where):
    parsed = view(select)
    assert parsed.join.stream_alias == "c"
    assert [(t.table, t.alias, t.left, t.on_sql) for t in parsed.join.tables] == tables
    assert parsed.where_sql == where


def test_a_joined_view_slides_over_the_streams_qualified_time(view):
    parsed = view(
        "SELECT c.url, count(*) FROM clicks c JOIN pages p USING (url)"
        " WHERE c.arrival_timestamp > clock_timestamp() - interval '4 seconds' GROUP BY c.url"
    )
    assert parsed.window == Window("ts", "4 seconds")
    with pytest.raises(DefinitionError, match="compares a stream column"):
        view("SELECT count(*) FROM clicks c JOIN pages p USING (url) WHERE p.ts > now() - interval '1 minute'")


def test_a_subquery_that_projects_and_filters_its_stream_is_merged_into_the_view(view):
    merged = view(
        "SELECT a0, sum(b0) AS total FROM (SELECT b1 AS b0, a1 AS a0 FROM"
        " (SELECT upper(url) AS a1, uid::integer AS b1 FROM clicks WHERE uid > 0) s1 WHERE a1 <> '') s2"
        " WHERE b0 < 100 GROUP BY a0"
    )
    written = view(
        "SELECT upper(url) AS a0, sum(uid::integer) AS total FROM clicks"
        " WHERE uid > 0 AND upper(url) <> '' AND uid::integer < 100 GROUP BY 1"
    )
    assert (merged.groups, merged.aggregates, merged.outputs) == (written.groups, written.aggregates, written.outputs)
    assert merged.where_sql == "uid > 0 AND upper(url) <> '' AND CAST(uid AS integer) < 100"


def test_pipelinedbs_action_materialize_is_a_view_and_another_action_is_refused(view):
    assert view("SELECT url, count(*) FROM clicks GROUP BY url", "WITH (action = materialize)").groups
    assert view("SELECT url, count(*) FROM clicks GROUP BY url", "WITH (action = 'materialize', fillfactor = 50)")
    with pytest.raises(DefinitionError, match="action is materialize"):
        view("SELECT url, count(*) FROM clicks GROUP BY url", "WITH (action = dump)")


def test_fillfactor_is_the_storage_tables(view):
    parsed = view("SELECT count(*) FROM clicks", "WITH (fillfactor = 42)")
    stream = parse(CLICKS, Scope({}, frozenset()))
    ddl = compiler.create_view_tables(parsed, stream, ViewTypes(("boolean",), ("bigint",), None))
    assert "fillfactor = 42" in ddl[0].as_string(None)


def test_pk_may_name_the_one_group_column(view):
    parsed = view("SELECT uid::integer, count(*) FROM clicks GROUP BY uid", "WITH (pk = 'uid')")
    assert [g.name for g in parsed.groups] == ["uid", "_cv_by_0"]  # the output, and the column it reads


def test_ttl_column_names_the_group_a_ttl_expires_by(view):
    parsed = view(
        "SELECT ts, minute(ts) AS m, count(*) FROM clicks GROUP BY ts, m", "WITH (ttl = '1 hour', ttl_column = 'ts')"
    )
    assert parsed.bucket.name == "ts"
    assert view("SELECT minute(ts) AS m, count(*) FROM clicks GROUP BY m", "WITH (ttl = '1 hour')").bucket.name == "m"


@pytest.mark.parametrize(
    ("select", "options", "match"),
    [
        ("SELECT url, count(*) FROM clicks GROUP BY url", "WITH (step_factor = 10)", "give sw"),
        ("SELECT url, count(*) FROM clicks GROUP BY url", "WITH (sw_column = 'ts')", "give sw"),
        ("SELECT url, count(*) FROM clicks GROUP BY url", "WITH (sw = '1 hour', sw_column = 'url')", "timestamptz"),
        ("SELECT url, count(*) FROM clicks GROUP BY url", "WITH (sw = '1 minute', step_factor = 60)", "1 to 50"),
        (
            "SELECT url, count(*) FROM clicks WHERE ts > now() - interval '1 hour' GROUP BY url",
            "WITH (sw = '1 minute')",
            "keep one",
        ),
        ("SELECT oid, count(*) FROM likes GROUP BY oid", "WITH (sw = '1 minute')", "timestamp_column"),
        ("SELECT url, count(*) FROM clicks GROUP BY url", "WITH (ttl = '1 hour', ttl_column = 'url')", "ttl_column"),
        ("SELECT ts, count(*) AS n FROM clicks GROUP BY ts", "WITH (ttl = '1 hour', ttl_column = 'n')", "ttl_column"),
        ("SELECT ts, count(*) FROM clicks GROUP BY ts", "WITH (ttl_column = 'ts')", "give ttl too"),
        ("SELECT count(*) FROM clicks", "WITH (fillfactor = 5)", "10 to 100"),
        ("SELECT uid::integer, count(*) FROM clicks GROUP BY uid", "WITH (pk = 'count')", "drop pk"),
        ("SELECT url, uid, count(*) FROM clicks GROUP BY url, uid", "WITH (pk = 'url')", "drop pk"),
        ("SELECT count(*) FROM clicks", "WITH (ttl = '1 hour')", "time bucket"),
        ("SELECT DISTINCT ON (url) url, uid FROM clicks", "", "keyed_max"),
        ("SELECT DISTINCT url, count(*) FROM clicks GROUP BY url", "", "drop DISTINCT"),
        ("SELECT url, count(*) FROM clicks GROUP BY ROLLUP (url)", "", "one view per grouping"),
        ("SELECT url, count(*) FROM clicks GROUP BY CUBE (url)", "", "one view per grouping"),
        ("SELECT url, count(*) FROM clicks GROUP BY GROUPING SETS ((url), ())", "", "one view per grouping"),
        ("SELECT url, count(*) FROM clicks GROUP BY url HAVING count(*) > 1", "", "when reading the view"),
        ("SELECT url, count(*) FROM clicks GROUP BY url ORDER BY url LIMIT 3", "", "when reading the view"),
        ("SELECT dense_rank(3) WITHIN GROUP (ORDER BY uid) FROM clicks", "", "count\\(DISTINCT x\\) FILTER"),
        ("SELECT rank(3, 4) WITHIN GROUP (ORDER BY uid) FROM clicks", "", "one value per ORDER BY key"),
        ("SELECT url, bit_and(DISTINCT uid) AS u FROM clicks GROUP BY url", "", "count, sum, avg, array_agg"),
        ("SELECT url, count(*) FROM clicks WHERE url IN (SELECT url FROM pages) GROUP BY url", "", "JOIN table"),
        (
            "SELECT url, sum(n) FROM (SELECT url, count(*) AS n FROM clicks GROUP BY url) c GROUP BY url",
            "",
            "of its own",
        ),
        ("SELECT url FROM (SELECT url FROM clicks LIMIT 3) c", "", "no LIMIT"),
        ("SELECT url FROM (SELECT u FROM (SELECT url AS u FROM clicks) a) b", "", "not a column of the subquery"),
        ("SELECT url, count(*) FROM clicks WHERE EXISTS (SELECT 1) GROUP BY url", "", "subqueries"),
        ("SELECT url, count(*) FROM other.clicks GROUP BY url", "", "streams have no schema"),
        ("SELECT url, count(*) FROM clicks, likes GROUP BY url", "", "two streams"),
        (
            "SELECT count(*) FROM clicks c JOIN pages p ON p.url = c.url RIGHT JOIN users u ON u.id = p.owner",
            "",
            "keeps the table's rows",
        ),
        (
            "SELECT count(*) FROM pages p LEFT JOIN users u ON u.id = p.owner JOIN clicks c ON true",
            "",
            "then its tables",
        ),
        ("SELECT count(*) FROM clicks c JOIN (pages p JOIN users u ON u.id = p.owner) ON true", "", "parenthesized"),
        ("SELECT count(*) FROM clicks c JOIN pages p ON true JOIN users p ON true", "", "different names"),
        ("SELECT count(*) FROM clicks c JOIN pages p ON true JOIN users u USING (owner)", "", "write ON"),
        ("SELECT x.url, count(*) FROM clicks GROUP BY x.url", "", "not a column"),
        ("SELECT arrival_timestamp, count(*) FROM likes GROUP BY 1", "", "declares none"),
        ("SELECT upper(url), count(*) FROM clicks GROUP BY uid", "", "must appear in GROUP BY"),
        ("SELECT 1, count(*) + 1 FROM clicks", "", "two output columns are named '\\?column\\?'"),
    ],
)
def test_a_shape_the_engine_cannot_keep_is_refused_with_what_to_write(view, select, options, match):
    with pytest.raises(DefinitionError, match=match):
        view(select, options)
