"""CREATE SINK and DROP SINK as the front end reads them: names, options, the filter, and one-line refusals."""

from __future__ import annotations

import pytest

from pipelines.cv.frontend.sinks import DropSink, SinkDef, parse_sink
from pipelines.cv.frontend.statements import read_script
from pipelines.cv.model import DefinitionError

ALERT = "(new).errors >= 100 AND ((old) IS NULL OR (old).errors < 100)"


def test_an_alert_sink_is_read_with_its_view_topic_format_and_filter():
    sink = parse_sink(
        "CREATE SINK alerts FROM public.errors_per_minute"
        f" WITH (topic = 'alerts', format = 'changes', where = '{ALERT}');"
    )
    assert isinstance(sink, SinkDef)
    assert (sink.name, sink.view, sink.topic, sink.format, sink.envelope) == (
        "alerts",
        "public.errors_per_minute",
        "alerts",
        "changes",
        None,
    )
    assert sink.reader == "sink alerts"
    # Written back by PostgreSQL's parser: the same condition, whatever the spacing.
    assert "(new)).errors >= 100" in sink.where
    assert "old IS NULL" in sink.where


def test_defaults_are_an_upsert_sink_on_a_topic_named_like_it_and_a_view_in_public():
    sink = parse_sink("create sink URL_Counts from url_counts")
    assert isinstance(sink, SinkDef)
    assert (sink.name, sink.view, sink.topic, sink.format, sink.where, sink.partitions) == (
        "url_counts",
        "public.url_counts",
        "url_counts",
        "upsert",
        None,
        None,
    )


def test_the_debezium_envelope_and_partitions():
    sink = parse_sink(
        "CREATE SINK cdc FROM s.v WITH (topic = 'v.changes', format = 'changes', envelope = 'debezium', partitions = 3)"
    )
    assert (sink.envelope, sink.partitions, sink.topic) == ("debezium", 3, "v.changes")


def test_drop_sink_names_and_if_exists():
    assert parse_sink("DROP SINK alerts, other") == DropSink(("alerts", "other"), False)
    assert parse_sink("drop sink if exists alerts;") == DropSink(("alerts",), True)


def test_other_statements_are_not_sinks():
    assert parse_sink("CREATE STREAM s (a int)") is None
    assert parse_sink("DROP CONTINUOUS VIEW v") is None


@pytest.mark.parametrize(
    ("statement", "message"),
    [
        ("CREATE SINK a", "expected CREATE SINK name FROM"),
        ("CREATE SINK s.a FROM v", "a sink's name has no schema"),
        ('CREATE SINK "A" FROM v', "not a plain lower-case identifier"),
        ("CREATE SINK a FROM v WITH (format = 'avro')", "format 'avro' is not one of upsert, changes"),
        ("CREATE SINK a FROM v WITH (envelope = 'debezium')", "envelope = 'debezium' goes with format = 'changes'"),
        ("CREATE SINK a FROM v WITH (format = 'changes', envelope = 'x')", "envelope 'x' is not one of debezium"),
        ("CREATE SINK a FROM v WITH (topic = 'a b')", "is not a Kafka topic name"),
        ("CREATE SINK a FROM v WITH (partitions = 0)", "partitions '0' is not an integer in 1 .. 1000"),
        ("CREATE SINK a FROM v WITH (color = 'red')", "unknown option 'color'"),
        ("CREATE SINK a FROM v WITH (topic = 'x', topic = 'y')", "option topic is given twice"),
        ("CREATE SINK a FROM v WITH (where = 'n > 1')", "where names 'n'; name the change's rows as (old).column"),
        ("CREATE SINK a FROM v WITH (where = '(new).n > (SELECT 1)')", "a subquery is not supported"),
        ("CREATE SINK a FROM v WITH (where = 'true) OR (true')", "syntax error"),
        ("CREATE SINK a FROM v WITH (where = 'true GROUP BY 1')", "where takes one condition"),
        ("CREATE SINK a FROM v WITH (where = 'true; DROP TABLE cv.sinks')", "give one statement at a time"),
        ("DROP SINK a CASCADE", "CASCADE is not supported"),
        ("DROP SINK s.a", "a sink's name has no schema"),
    ],
)
def test_refusals_are_one_line_naming_what(statement, message):
    with pytest.raises(DefinitionError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")) as e:
        parse_sink(statement)
    assert "\n" not in str(e.value)


def test_a_script_reads_sink_statements_beside_views_and_names_the_one_that_fails():
    script = read_script(
        "CREATE STREAM s (n int) WITH (topic = 's');\n"
        "CREATE CONTINUOUS VIEW v AS SELECT n, count(*) FROM s GROUP BY n;\n"
        "CREATE SINK v_out FROM v WITH (topic = 'v_out');\n"
        "DROP SINK IF EXISTS old_out;"
    )
    assert [type(s.sink).__name__ for s in script.statements] == ["NoneType", "NoneType", "SinkDef", "DropSink"]
    assert script.statements[2].statement.label == "CREATE SINK v_out"
    with pytest.raises(DefinitionError, match=r"statement 2 \(line 2\): CREATE SINK b: format"):
        read_script("CREATE SINK a FROM v;\nCREATE SINK b FROM v WITH (format = 'x');")
