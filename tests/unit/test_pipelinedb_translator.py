"""PipelineDB's regression cases read into steps (tests/pipelinedb_regress/translator.py), without a database.

The translator is the harness's one piece of logic that decides what a case means here: which
statement declares a stream or a view, what names it gets, what PipelineDB printed after it, and
what has no meaning on this system.
"""

from __future__ import annotations

from tests.pipelinedb_regress.translator import CASES, Names, Statement, load, read_case, translate

ECHO = """\
-- a comment before the first statement; it names a matrel in prose
CREATE FOREIGN TABLE s (k text, v int) SERVER pipelinedb;
CREATE VIEW v AS SELECT k::text, sum(v) FROM s
  GROUP BY k;
INSERT INTO s (k, v) VALUES ('x', 1), ('y;', 2);
SELECT * FROM v ORDER BY k;
 k  | sum
----+-----
 x  |   1
 y; |   2
(2 rows)

SELECT 1 WHERE false;
 ?column?
----------
(0 rows)

CREATE VIEW bad AS SELECT k FROM nowhere;
ERROR:  relation "nowhere" does not exist
LINE 1: CREATE VIEW bad AS SELECT k FROM nowhere;
                                         ^
SELECT * FROM v_mrel;
 k | sum
---+-----
(0 rows)

CREATE VIEW plain AS SELECT 1 AS one;
SELECT NULL::text AS n, '' AS e;
 n | e
---+---
   |
(1 row)

DROP FOREIGN TABLE s CASCADE;
NOTICE:  drop cascades to view v
"""


def names() -> Names:
    return Names(schema="sch", suffix="abc", group="grp")


def test_a_psql_echo_is_read_into_statements_with_what_each_printed():
    statements = read_case(ECHO)
    assert [s.text.splitlines()[-1] for s in statements] == [
        "CREATE FOREIGN TABLE s (k text, v int) SERVER pipelinedb;",
        "  GROUP BY k;",
        "INSERT INTO s (k, v) VALUES ('x', 1), ('y;', 2);",  # a semicolon in a string does not end it
        "SELECT * FROM v ORDER BY k;",
        "SELECT 1 WHERE false;",
        "CREATE VIEW bad AS SELECT k FROM nowhere;",
        "SELECT * FROM v_mrel;",
        "CREATE VIEW plain AS SELECT 1 AS one;",
        "SELECT NULL::text AS n, '' AS e;",
        "DROP FOREIGN TABLE s CASCADE;",
    ]
    select = statements[3].expected
    assert select.columns == ["k", "sum"]
    assert select.rows == [("x", "1"), ("y;", "2")]
    assert statements[4].expected.rows == []
    assert statements[5].expected.error == 'relation "nowhere" does not exist'
    assert statements[8].expected.rows == [(None, None)]  # psql prints NULL and '' alike
    assert statements[9].expected.rows is None
    assert statements[9].expected.error is None


DESCRIBED = """\
\\d+ v_mrel
                 Table "public.v_mrel"
 Column |  Type  | Collation | Nullable
--------+--------+-----------+----------
 k      | text   |           |
Indexes:
    "v_mrel_pkey" PRIMARY KEY, btree ("$pk")
Options: fillfactor=50

INSERT INTO s (k, v) VALUES ('x', 0), ('x', 1);
\\d v
       View "public.v"
 Column | Type
--------+------
 k      | text

\\d+ v_osrel;
       Foreign table "public.v_osrel"
 Column | Type
--------+------
 old    | v
Server: pipelinedb

SELECT * FROM v;
 k | sum
---+-----
 x |   1
(1 row)

"""


def test_what_a_describe_printed_is_its_output_and_the_statement_after_it_runs():
    # Its title line once made the describe's lines the start of the next statement: the INSERT after
    # it never ran, and a case lost the rows of its first INSERT (cont_array_agg, cont_object_agg).
    statements = read_case(DESCRIBED)
    assert [s.text for s in statements] == [
        "\\d+ v_mrel",
        "INSERT INTO s (k, v) VALUES ('x', 0), ('x', 1);",
        "\\d v",
        "\\d+ v_osrel;",
        "SELECT * FROM v;",
    ]
    assert statements[-1].expected.rows == [("x", "1")]


def test_every_case_reads_each_describe_as_one_statement():
    for path in sorted(CASES.glob("*.out")):
        for statement in load(path.stem):
            assert "\n-----" not in statement.text or statement.text.lstrip().startswith("--"), (path.stem, statement)


def test_streams_and_views_are_renamed_for_the_run_and_declared_in_this_projects_sql():
    steps = translate(read_case(ECHO), names())
    stream, view, insert, select = steps[:4]
    assert stream.kind == "stream"
    assert stream.name == "s_abc"
    assert stream.sql.startswith(
        "CREATE STREAM s_abc (k text, v int, arrival_timestamp timestamptz DEFAULT now()) WITH ("
    )
    assert "consumer_group = 'grp'" in stream.sql
    assert "topic = 'pdbregress-abc-s'" in stream.sql
    assert view.kind == "view"
    assert view.name == "sch.v"
    assert (
        " ".join(view.sql.split())
        == "CREATE CONTINUOUS VIEW sch.v WITH (backfill = 'none') AS SELECT k::text, sum(v) FROM s_abc GROUP BY k"
    )
    assert insert.sql == "INSERT INTO s_abc (k, v) VALUES ('x', 1), ('y;', 2)"  # the string is left as written
    assert select.kind == "sql"
    assert select.sql == "SELECT * FROM v ORDER BY k"


def test_what_has_no_meaning_here_is_skipped_with_the_reason_and_the_rest_runs_as_written():
    steps = translate(read_case(ECHO), names())
    by_text = {s.statement.text.splitlines()[-1]: s for s in steps}
    mrel = by_text["SELECT * FROM v_mrel;"]
    assert mrel.kind == "unsupported"
    assert "matrel" in mrel.reason
    assert by_text["CREATE FOREIGN TABLE s (k text, v int) SERVER pipelinedb;"].kind == "stream"  # the comment is prose
    plain = by_text["CREATE VIEW plain AS SELECT 1 AS one;"]
    assert plain.kind == "sql"
    assert plain.sql.startswith("CREATE VIEW sch.plain")
    drop = by_text["DROP FOREIGN TABLE s CASCADE;"]
    assert drop.kind == "drop_stream"
    assert drop.name == "s_abc"


def test_definitions_qualify_the_cases_tables_and_views_but_not_columns_or_strings():
    run = names()
    steps = translate(
        [
            Statement("CREATE TABLE t (id int, s text);"),
            Statement("CREATE FOREIGN TABLE st (id int) SERVER pipelinedb;"),
            Statement("CREATE VIEW j AS SELECT st.id, t.s FROM st JOIN t ON t.id = st.id WHERE t.s <> 't';"),
            Statement("CREATE VIEW up AS SELECT (new).id FROM output_of('j');"),
            Statement("CREATE VIEW tr WITH (action = transform) AS SELECT id FROM st;"),
        ],
        run,
    )
    assert steps[0].kind == "sql"
    join = " ".join(steps[2].sql.split())
    assert join == (
        "CREATE CONTINUOUS VIEW sch.j WITH (backfill = 'none') AS "
        "SELECT st_abc.id, t.s FROM st_abc JOIN sch.t ON t.id = st_abc.id WHERE t.s <> 't'"
    )
    assert "output_of('sch.j')" in steps[3].sql
    assert steps[4].sql.startswith("CREATE VIEW sch.tr WITH (action = transform) AS")  # PipelineDB's transform


def test_every_committed_case_names_its_source_and_reads_into_statements():
    cases = sorted(CASES.glob("*.out"))
    assert len(cases) >= 20
    for path in cases:
        assert path.read_text().startswith("-- Source: pipelinedb/pipelinedb src/test/regress/expected/"), path
        statements = load(path.stem)
        assert statements, path
        assert any(s.expected.rows for s in statements), path


def test_a_view_over_a_view_starts_from_its_upstream_and_the_cases_schemas_are_recorded_for_cleanup():
    run = names()
    steps = translate(
        [
            Statement("CREATE SCHEMA ns0;"),
            Statement("ALTER SCHEMA ns0 RENAME TO ns1;"),
            Statement("CREATE FOREIGN TABLE s (x int) SERVER pipelinedb;;"),  # PipelineDB's cases have ';;'
            Statement("CREATE VIEW c AS SELECT x, count(*) FROM s GROUP BY x;"),
            Statement("CREATE VIEW up AS SELECT sum(count) FROM c;"),
        ],
        run,
    )
    assert run.schemas == {"ns0", "ns1"}
    assert steps[2].kind == "stream"
    assert "backfill = 'none'" in steps[3].sql  # PipelineDB's views see the events after their creation
    assert "backfill" not in steps[4].sql  # a view over a view reads its upstream's rows: no backfill option
    assert " FROM sch.c" in steps[4].sql


def test_set_ttl_is_an_alter_and_ttl_expire_the_runners_expiry_now():
    names = Names(schema="r", suffix="1", group="g")
    statements = [
        Statement("CREATE FOREIGN TABLE s (x int) SERVER pipelinedb;"),
        Statement("CREATE VIEW v AS SELECT arrival_timestamp AS ts, x FROM s;"),
        Statement("SELECT pipelinedb.set_ttl('v', '5 seconds', 'ts');"),
        Statement("SELECT pipelinedb.set_ttl('v', null, null);"),
        Statement("SELECT 0 * pipelinedb.ttl_expire('v');"),
        Statement("""CREATE VIEW "MyCV" WITH (ttl = '1 second', ttl_column = 'ts') AS SELECT ts FROM s;"""),
    ]
    steps = translate(statements, names)
    assert [(s.kind, s.sql) for s in steps[2:4]] == [
        ("set_ttl", "ALTER CONTINUOUS VIEW r.v SET (ttl = '5 seconds', ttl_column = 'ts')"),
        ("set_ttl", "ALTER CONTINUOUS VIEW r.v RESET (ttl, ttl_column)"),
    ]
    assert (steps[4].kind, steps[4].name) == ("ttl_expire", "r.v")
    # A quoted name is the catalog's to take or refuse; what reads it is skipped by its plain name.
    assert (steps[5].kind, steps[5].name, steps[5].source) == ("view", 'r."MyCV"', "mycv")
