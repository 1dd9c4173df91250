"""CREATE STREAM parses into what decoding and the engine need, or fails naming what is wrong."""

from __future__ import annotations

import pytest

from pipelines.cv.frontend.statements import NO_SCOPE, parse
from pipelines.cv.model import Check, Column, DefinitionError, StreamDef

CLICKS = "CREATE STREAM clicks (oid bigint, uid bigint, amount numeric, ts timestamptz) WITH (topic = 'clicks')"


def stream(columns: str, options: str = "") -> StreamDef:
    return parse(f"CREATE STREAM s ({columns})" + (f" WITH ({options})" if options else ""), NO_SCOPE)


def test_a_stream_without_a_key_is_append_only_and_keeps_its_definition_as_written():
    clicks = parse(CLICKS, NO_SCOPE)
    assert (clicks.name, clicks.topic, clicks.key, clicks.definition) == ("clicks", "clicks", None, CLICKS)


def test_a_stream_reads_the_topic_of_its_name_unless_told_otherwise():
    assert parse("CREATE STREAM page_views (url text)", NO_SCOPE).topic == "page_views"
    assert stream("url text", "topic = 'web.page-views.v2'").topic == "web.page-views.v2"
    # Kafka's longest name is 249 characters; the dead-letter topic adds `.dlq`.
    assert stream("url text", f"topic = '{'t' * 245}'").topic == "t" * 245


@pytest.mark.parametrize(
    "statement",
    [
        'CREATE STREAM "s\n" (a bigint)',
        'CREATE STREAM s ("a\n" bigint)',
        'CREATE STREAM s (a bigint CONSTRAINT "c\n" CHECK (a > 0))',
        "CREATE STREAM s (a bigint) WITH (into = E't\\n')",
    ],
)
def test_a_name_with_a_control_character_is_refused_even_at_its_end(statement):
    # Python's `$` matches before a final newline: names are matched whole.
    with pytest.raises(DefinitionError, match=r"not a plain lower-case identifier|control character"):
        parse(statement, NO_SCOPE)


def test_without_options_a_stream_reads_json_rejecting_unknown_fields_up_to_64_kib():
    s = stream("url text")
    assert (s.format, s.unknown_fields, s.max_event_bytes, s.partitions) == ("json", "reject", 65_536, None)
    assert (s.kafka_key, s.action_field, s.insert_actions, s.delete_actions) == (None, None, (), ())
    assert (s.timestamp_column, s.into, s.checks, s.key) == (None, None, (), None)


def test_column_types_are_spelled_as_postgresql_deparses_them_and_typed_for_decoding():
    s = stream("a int, b numeric(10,2), c character varying(20), d float, e bool, f timestamp with time zone")
    assert s.columns == (
        Column("a", "integer", "integer"),
        Column("b", "numeric(10, 2)", "numeric", typmods=(10, 2)),
        Column("c", "varchar(20)", "varchar", typmods=(20,)),
        Column("d", "double precision", "double"),
        Column("e", "bool", "boolean"),
        Column("f", "timestamp with time zone", "timestamptz"),
    )


@pytest.mark.parametrize(
    ("declared", "kind", "typmods"),
    [
        ("smallint", "smallint", ()),
        ("int2", "smallint", ()),
        ("integer", "integer", ()),
        ("int", "integer", ()),
        ("int4", "integer", ()),
        ("bigint", "bigint", ()),
        ("int8", "bigint", ()),
        ("numeric", "numeric", ()),
        ("decimal(12)", "numeric", (12,)),
        ("numeric(5, 5)", "numeric", (5, 5)),
        ("double precision", "double", ()),
        ("float8", "double", ()),
        ("float", "double", ()),
        ("real", "real", ()),
        ("float4", "real", ()),
        ("boolean", "boolean", ()),
        ("bool", "boolean", ()),
        ("text", "text", ()),
        ("varchar", "varchar", ()),
        ("varchar(1)", "varchar", (1,)),
        ("timestamptz", "timestamptz", ()),
        ("timestamp with time zone", "timestamptz", ()),
        ("date", "date", ()),
        ("uuid", "uuid", ()),
        ("UUID", "uuid", ()),
        ("jsonb", "jsonb", ()),
        ("pg_catalog.int8", "bigint", ()),
    ],
)
def test_each_supported_type_has_a_kind_read_from_the_parse_tree(declared, kind, typmods):
    column = stream(f"a {declared}").columns[0]
    assert (column.kind, column.typmods) == (kind, typmods)


@pytest.mark.parametrize(
    "declared",
    [
        "timestamp",
        "timestamp without time zone",
        "json",
        "text[]",
        "int[]",
        "interval",
        "bytea",
        "character(3)",
        "money",
        "bit(3)",
        "myschema.mood",
    ],
)
def test_every_other_type_is_read_by_postgresqls_input_as_declared(declared):
    (column,) = stream(f"a {declared}").columns
    assert (column.kind, column.typmods) == ("input", ())  # its modifiers are PostgreSQL's to read


def test_a_type_postgresql_reads_keeps_its_modifiers_as_postgresql_deparses_them():
    assert [c.type for c in stream("a bit(3), b character(3), c myschema.mood[]").columns] == [
        "pg_catalog.bit(3)",
        "char(3)",
        "myschema.mood[]",
    ]


@pytest.mark.parametrize("declared", ["timestamptz(3)", "numeric(0)", "numeric(3, 4)", "varchar(0)", "setof int"])
def test_modifiers_out_of_range_of_the_types_decoding_reads_are_rejected_naming_the_type(declared):
    with pytest.raises(DefinitionError, match=r"^CREATE STREAM s: column a: type .*(not supported|modifier|takes)"):
        stream(f"a {declared}")


def test_column_constraints_are_not_null_default_and_named_or_unnamed_checks():
    s = stream(
        "a bigint NOT NULL CONSTRAINT positive CHECK (a > 0) CHECK (a < 100), "
        "b text NULL DEFAULT 'none', c timestamptz CONSTRAINT nn NOT NULL DEFAULT now()"
    )
    a, b, c = s.columns
    assert (a.not_null, a.default, a.checks) == (True, None, (Check("positive", "a > 0"), Check(None, "a < 100")))
    assert (b.not_null, b.default, b.checks) == (False, "'none'", ())
    assert (c.not_null, c.default) == (True, "now()")


def test_table_checks_may_use_every_column_and_keep_their_name():
    s = stream("a int, b int, CONSTRAINT ordered CHECK (a < b), CHECK (a IS NOT NULL OR b IS NOT NULL)")
    assert s.checks == (Check("ordered", "a < b"), Check(None, "a IS NOT NULL OR b IS NOT NULL"))


def test_key_columns_are_not_null_without_saying_so():
    s = stream("a int, b int, c int", "key = 'b, a'")
    assert s.key == ("b", "a")
    assert [c.not_null for c in s.columns] == [True, True, False]


@pytest.mark.parametrize(
    ("declared", "default", "sql"),
    [
        ("bigint", "0", "0"),
        ("bigint", "-5", "-5"),
        ("real", "1.5e3", "1.5e3"),
        ("text", "'x'", "'x'"),
        ("text", "NULL", "NULL"),
        ("boolean", "true", "TRUE"),
        ("bigint", "'7'::bigint", "CAST('7' AS bigint)"),
        ("bigint", "-5::bigint", "- CAST(5 AS bigint)"),
        ("jsonb", "'{}'::jsonb", "CAST('{}' AS jsonb)"),
        ("timestamptz", "'2026-01-01T00:00:00Z'", "'2026-01-01T00:00:00Z'"),
        ("timestamptz", "now()", "now()"),
        ("timestamptz", "current_timestamp", "CURRENT_TIMESTAMP"),
        ("timestamptz", "clock_timestamp()", "clock_timestamp()"),
        ("date", "current_date", "CURRENT_DATE"),
    ],
)
def test_a_default_is_a_constant_maybe_cast_or_the_current_time_kept_as_postgresql_deparses_it(declared, default, sql):
    assert stream(f"a {declared} DEFAULT {default}").columns[0].default == sql


@pytest.mark.parametrize(
    ("columns", "match"),
    [
        ("a bigint DEFAULT random()", r"DEFAULT random\(\) is not supported"),
        ("a bigint DEFAULT 1 + 1", r"DEFAULT 1 \+ 1 is not supported"),
        ("a bigint DEFAULT nextval('s')", "not supported"),
        ("a text DEFAULT current_user", "not supported"),
        ("a bigint DEFAULT 'x'", "'x' is not a bigint"),
        ("a bigint DEFAULT 1.5", "must be a JSON integer"),
        ("a bigint DEFAULT now()", "is a timestamptz, not bigint"),
        ("a date DEFAULT now()", "is a timestamptz, not date"),
        ("a bigint DEFAULT '1'::text", "text is not a bigint"),
        ("a varchar(2) DEFAULT 'abc'", "over varchar"),
        ("a bigint NOT NULL DEFAULT NULL", "DEFAULT NULL on a NOT NULL column"),
        ("a bigint DEFAULT 0 CONSTRAINT positive CHECK (a > 0)", r"a = 0 violates CHECK \(a > 0\)"),
        ("a bigint DEFAULT 1 DEFAULT 2", "DEFAULT is given twice"),
    ],
)
def test_a_default_decoding_cannot_evaluate_is_rejected(columns, match):
    with pytest.raises(DefinitionError, match=match):
        stream(columns)


@pytest.mark.parametrize(
    ("columns", "match"),
    [
        ("a int PRIMARY KEY", "column a: PRIMARY KEY is not supported"),
        ("a int UNIQUE", "column a: UNIQUE is not supported"),
        ("a int REFERENCES t (a)", "column a: REFERENCES is not supported"),
        ("a int GENERATED ALWAYS AS (1) STORED", "column a: GENERATED ALWAYS AS"),
        ("a int GENERATED ALWAYS AS IDENTITY", "column a: GENERATED ... AS IDENTITY"),
        ('a text COLLATE "C"', "column a: COLLATE is not supported"),
        ("a int NULL NOT NULL", "NULL and NOT NULL contradict"),
        ("a int, UNIQUE (a)", "UNIQUE is not supported; a stream takes CHECK only"),
        ("a int, PRIMARY KEY (a)", "PRIMARY KEY is not supported"),
        ("a int, CHECK (a > 0) NOT VALID", "NOT VALID"),
        ("a int CHECK (a > 0) NO INHERIT", "NO INHERIT"),
        ("a int, b int CHECK (a < b)", r"CHECK \(a < b\) uses a, .*only its own column \(b\); write a table CHECK"),
        ("a int, CHECK (a < c)", r"CHECK \(a < c\) uses c"),
        ("a int CHECK (a > (SELECT 1))", "not supported"),
        ("a int CHECK (foo(a))", r"foo\(a\) is not supported"),
        ("a text CHECK (a > 'm')", "collation"),
        ("a text CHECK (a LIKE 'x%')", "not supported"),
        ("a int CHECK (a + 1)", "a CHECK is a condition"),
        ("a int CHECK (a > 'x')", "'x' is not a bigint"),
        ("a numeric CHECK (a / 2 > 1)", "numeric / is not supported"),
        ("a int CHECK (a > 1 / 0)", "division by zero"),
        ("a timestamptz CHECK (a > now())", r"now\(\) is not supported"),
        ("a jsonb CHECK (a = '{}')", "IS \\[NOT\\] NULL"),
    ],
)
def test_a_constraint_other_than_not_null_default_and_check_or_a_check_decoding_cannot_evaluate_is_rejected(
    columns, match
):
    with pytest.raises(DefinitionError, match=match):
        stream(columns)


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ("format = 'csv'", {"format": "csv"}),
        ("format = 'debezium', into = 't'", {"format": "debezium", "into": "t"}),
        ("kafka_key = 'a'", {"kafka_key": "a"}),
        ("timestamp_column = 'ts'", {"timestamp_column": "ts"}),
        ("unknown_fields = 'ignore'", {"unknown_fields": "ignore"}),
        ("partitions = 6", {"partitions": 6}),
        ("partitions = '12'", {"partitions": 12}),
        ("max_event_bytes = 1024", {"max_event_bytes": 1024}),
        ("max_event_bytes = '10485760'", {"max_event_bytes": 10_485_760}),
        (
            "key = 'a', action_field = 'op', insert_actions = 'add, put', delete_actions = 'del'",
            {"action_field": "op", "insert_actions": ("add", "put"), "delete_actions": ("del",), "key": ("a",)},
        ),
        (
            "into = 't', action_field = 'op', insert_actions = 'add', delete_actions = 'del'",
            {"action_field": "op", "insert_actions": ("add",), "delete_actions": ("del",), "into": "t"},
        ),
    ],
)
def test_stream_options_say_how_events_are_read(options, expected):
    s = stream("a bigint NOT NULL, b text, ts timestamptz", options)
    assert {name: getattr(s, name) for name in expected} == expected


@pytest.mark.parametrize(
    ("options", "match"),
    [
        (
            "n = '3'",
            "unknown option 'n'; known: action_field, consumer_group, delete_actions, format, insert_actions, into, "
            "kafka_key",
        ),
        ("topic = s", "option topic takes a quoted string or an integer"),
        ("partitions = 1.5", "option partitions takes a quoted string or an integer"),
        ("topic = 'a', topic = 'b'", "option topic is given twice"),
        ("topic = 'no spaces'", "not a Kafka topic name"),
        ("topic = '..'", "not a Kafka topic name"),
        ("topic = '.'", "not a Kafka topic name"),
        ("topic = ''", "not a Kafka topic name"),
        ("topic = 'caf\u00e9'", "not a Kafka topic name"),
        (f"topic = '{'t' * 246}'", r"1 to 245 characters leaving room for \.dlq"),
        ("topic = E's\\n'", r"option topic 's\\n' has a control character"),
        ("topic = E's\\t'", "has a control character"),
        ("consumer_group = E'g\\n'", "has a control character"),
        ("action_field = E'op\\r'", "has a control character"),
        ("format = 'avro'", "format 'avro' is not one of json, csv, debezium"),
        ("key = 'x'", "key names unknown columns"),
        ("key = 'a, a'", "key names a column twice"),
        ("key = 'j'", "key column j is jsonb"),
        ("kafka_key = 'x'", "kafka_key 'x' is not a column"),
        ("kafka_key = 'b'", "kafka_key b must be NOT NULL"),
        ("kafka_key = 'ts'", "kafka_key ts is timestamptz"),
        ("format = 'debezium', kafka_key = 'a'", "kafka_key does not apply to format debezium"),
        ("insert_actions = 'add'", "insert_actions need action_field"),
        ("insert_actions = 'add', delete_actions = 'del'", "insert_actions and delete_actions need action_field"),
        ("key = 'a', action_field = 'op', insert_actions = 'add'", "needs both insert_actions and delete_actions"),
        ("key = 'a', action_field = 'b', insert_actions = 'x', delete_actions = 'y'", "'b' is a column"),
        ("key = 'a', action_field = 'op', insert_actions = 'x', delete_actions = 'x'", "'x' is both"),
        ("key = 'a', action_field = 'op', insert_actions = 'x,', delete_actions = 'y'", "has an empty name"),
        ("key = 'a', action_field = 'op', insert_actions = 'x, x', delete_actions = 'y'", "names a value twice"),
        ("action_field = 'op', insert_actions = 'x', delete_actions = 'y'", "delete actions need a key"),
        (
            "format = 'csv', key = 'a', action_field = 'op', insert_actions = 'x', delete_actions = 'y'",
            "action_field applies to format json only, not csv",
        ),
        (
            "format = 'debezium', into = 't', action_field = 'op', insert_actions = 'x', delete_actions = 'y'",
            "action_field applies to format json only, not debezium",
        ),
        ("timestamp_column = 'b'", "timestamp_column b is text, not timestamptz"),
        ("timestamp_column = 'x'", "timestamp_column 'x' is not a column"),
        ("timestamp_column = 'd'", "timestamp_column d has a DEFAULT"),
        ("unknown_fields = 'drop'", "unknown_fields 'drop' is not 'reject' or 'ignore'"),
        ("partitions = 0", r"partitions '0' is not an integer in 1 \.\. 1000"),
        ("partitions = 1001", r"partitions '1001' is not an integer in 1 \.\. 1000"),
        ("partitions = -1", "partitions '-1' is not an integer"),
        ("max_event_bytes = '64k'", r"max_event_bytes '64k' is not an integer in 1 \.\. 10485760"),
        ("max_event_bytes = 10485761", "max_event_bytes '10485761' is not an integer"),
        ("into = 's'", "into names the stream itself"),
        ("into = 'T'", "'T' is not a plain lower-case identifier"),
        ("into = 't', key = 'a'", "a stream with into has no key of its own"),
    ],
)
def test_an_invalid_or_contradictory_option_is_rejected_in_one_line_naming_the_stream(options, match):
    with pytest.raises(DefinitionError, match=match) as caught:
        stream("a bigint NOT NULL, b text, ts timestamptz, d timestamptz DEFAULT now(), j jsonb", options)
    assert str(caught.value).startswith("CREATE STREAM s: ")
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "statement",
    [
        "CREATE STREAM " + "s" * 64 + " (a int)",
        "CREATE STREAM s (" + "a" * 64 + " int)",
        'CREATE STREAM s ("' + "é" * 32 + '" int)',  # 64 bytes in UTF-8
        "CREATE STREAM s (a int CONSTRAINT " + "c" * 64 + " CHECK (a > 0))",
        "CREATE STREAM s (a int) WITH (" + "o" * 64 + " = 1)",
    ],
)
def test_a_name_over_63_bytes_is_rejected_rather_than_truncated(statement):
    with pytest.raises(DefinitionError, match="bytes; PostgreSQL allows 63 and would truncate it"):
        parse(statement, NO_SCOPE)


def test_a_name_of_63_bytes_is_kept_whole():
    assert stream(f"{'a' * 63} int").column_names == ("a" * 63,)


@pytest.mark.parametrize(
    ("statement", "match"),
    [
        pytest.param("CREATE STREAM s (a int) WITH (topic = 's', key = 'b')", "unknown columns", id="unknown-key"),
        pytest.param("CREATE STREAM x.s (a int) WITH (topic = 's')", "schema-qualified", id="schema"),
        pytest.param("CREATE STREAM s () WITH (topic = 's')", "no columns", id="no-columns"),
        pytest.param("CREATE STREAM \"S\" (a int) WITH (topic = 's')", "lower-case", id="quoted-name"),
        pytest.param("CREATE STREAM s (a int, a text) WITH (topic = 's')", "column", id="duplicate-column"),
        pytest.param("CREATE STREAM IF NOT EXISTS s (a int)", "IF NOT EXISTS is not supported", id="if-not-exists"),
        pytest.param("CREATE STREAM s (a int) INHERITS (t)", "INHERITS is not supported", id="inherits"),
        pytest.param("CREATE STREAM s (LIKE t)", "only column definitions and CHECK", id="like"),
    ],
)
def test_an_invalid_stream_is_rejected_naming_the_problem(statement, match):
    with pytest.raises(DefinitionError, match=match):
        parse(statement, NO_SCOPE)


@pytest.mark.parametrize(
    ("statement", "match"),
    [
        ("SELECT 1", "expected CREATE STREAM"),
        ("CREATE STREAM s (a int WITH (topic = 's')", "syntax error"),
        ("CREATE STREAM a (x int) WITH (topic = 'a');\nCREATE STREAM b (x int) WITH (topic = 'b')", "one statement"),
    ],
)
def test_only_one_create_stream_or_continuous_view_statement_is_understood(statement, match):
    with pytest.raises(DefinitionError, match=match):
        parse(statement, NO_SCOPE)
