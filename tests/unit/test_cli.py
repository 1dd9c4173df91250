"""The `streamviews` command without services: arguments, input, one-line errors, exit codes, status."""

from __future__ import annotations

import io
import socket
import types
from datetime import UTC, datetime

import psycopg
import pytest
from confluent_kafka import KafkaError, KafkaException

from pipelines.cv import cli, cli_common, status
from pipelines.cv.cli_common import CommandError
from pipelines.cv.frontend.statements import read_script
from pipelines.cv.model import DefinitionError

STREAM = "CREATE STREAM clicks (oid bigint, ts timestamptz) WITH (topic = 'clicks')"
VIEW = "CREATE CONTINUOUS VIEW per_object AS SELECT oid, count(*) AS n FROM clicks GROUP BY oid"
UNBALANCED = "CREATE STREAM oops (a bigint) WITH (topic = 'oops'"


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """Settings pointing at nothing: a test that tried to reach a service would fail, not hang."""
    for name in ("PGUSER", "PGPASSWORD", "LOG_LEVEL", "PIPELINE_GROUP_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PGHOST", "127.0.0.1")
    monkeypatch.setenv("PGPORT", str(free_port()))
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "2")
    monkeypatch.setenv("LOG_FORMAT", "json")


def free_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def error_line(capsys, status: int, actual: int) -> str:
    """The one stderr line of a failed command, after checking the exit status and that nothing else was printed."""
    out, err = capsys.readouterr()
    assert actual == status, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("streamviews: error: ")
    assert out == ""
    return lines[0].removeprefix("streamviews: error: ")


# --- arguments ----------------------------------------------------------------------------------------


def test_define_takes_a_statement_a_file_or_stdin():
    assert cli.parse_args(["define", STREAM]).statement == STREAM
    assert cli.parse_args(["define", "-f", "views.sql"]).file == "views.sql"
    assert cli.parse_args(["define", "--file", "-"]).file == "-"
    assert cli.parse_args(["define", "-"]).statement == "-"


@pytest.mark.parametrize("argv", [["define"], ["define", STREAM, "-f", "views.sql"], [], ["list", "extra"], ["nope"]])
def test_usage_errors_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.parse_args(argv)
    assert exit_.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_drop_names_and_kinds():
    args = cli.parse_args(["drop", "a", "social.b"])
    assert (args.names, args.kind, args.handler) == (["a", "social.b"], None, cli.cmd_drop)
    assert cli.parse_args(["drop", "--view", "a"]).kind == "view"
    assert cli.parse_args(["drop", "--stream", "a"]).kind == "stream"
    assert cli.parse_args(["drop-view", "a"]).kind == "view"
    assert cli.parse_args(["drop-stream", "a"]).kind == "stream"


def test_status_arguments():
    args = cli.parse_args(["status", "--json", "--group", "g", "likes", "follows"])
    assert (args.json, args.group, args.streams) == (True, "g", ["likes", "follows"])
    args = cli.parse_args(["status"])
    assert (args.json, args.group, args.streams) == (False, None, [])


def test_run_passes_every_argument_to_the_runner():
    args = cli.parse_args(["run", "--group", "g", "--streams", "a,b", "--help"])
    assert args.runner_args == ["--group", "g", "--streams", "a,b", "--help"]


def test_each_command_has_help(capsys):
    for command in ("define", "list", "drop", "status"):
        with pytest.raises(SystemExit) as exit_:
            cli.parse_args([command, "--help"])
        assert exit_.value.code == 0
        assert f"usage: streamviews {command}" in capsys.readouterr().out


# --- input ------------------------------------------------------------------------------------------------


def test_read_input(tmp_path):
    path = tmp_path / "views.sql"
    path.write_text(f"{STREAM};\n")
    assert cli.read_input(STREAM, None, io.StringIO("unused")) == ("the command line", STREAM)
    assert cli.read_input("-", None, io.StringIO(VIEW)) == ("standard input", VIEW)
    assert cli.read_input(None, "-", io.StringIO(VIEW)) == ("standard input", VIEW)
    assert cli.read_input(None, str(path), io.StringIO("unused")) == (str(path), f"{STREAM};\n")


def test_a_missing_file_is_a_usage_error(tmp_path):
    with pytest.raises(CommandError, match=r"cannot read .*missing\.sql: No such file or directory") as error:
        cli.read_input(None, str(tmp_path / "missing.sql"), io.StringIO())
    assert error.value.status == 2


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no statements in the command line"),
        ("-- only a comment\n;", "no statements in the command line"),
        (f"{STREAM};\n\n{UNBALANCED};", "statement 2 (line 3): CREATE STREAM oops: syntax error: "),
        ("CREATE STREAM x (a text) WITH (topic = 'x", "syntax error: unterminated quoted string"),
    ],
)
def test_incomplete_input_is_an_error_never_a_silent_success(capsys, text, message):
    assert error_line(capsys, 2, cli.main(["define", text])).startswith(message)


# --- one-line errors and exit codes -------------------------------------------------------------------


def test_unbalanced_statement_fails_before_connecting(capsys):
    message = error_line(capsys, 2, cli.main(["define", UNBALANCED]))
    assert message == "CREATE STREAM oops: syntax error: syntax error at end of input"


def test_missing_file(capsys, tmp_path):
    message = error_line(capsys, 2, cli.main(["define", "-f", str(tmp_path / "nope.sql")]))
    assert message.endswith("nope.sql: No such file or directory")


def test_empty_stdin(capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("  \n-- nothing\n"))
    assert error_line(capsys, 2, cli.main(["define", "-"])) == "no statements in standard input"


def test_connection_failure_names_host_port_and_role(capsys, monkeypatch):
    port = free_port()
    monkeypatch.setenv("PGPORT", str(port))
    message = error_line(capsys, 1, cli.main(["list"]))
    assert message.startswith(f"cannot connect to PostgreSQL at 127.0.0.1:{port}/streamviews as sv_writer: ")
    message = error_line(capsys, 1, cli.main(["define", STREAM]))
    assert f"127.0.0.1:{port}/streamviews as sv_owner: " in message
    monkeypatch.setenv("PGUSER", "someone")
    assert " as someone: " in error_line(capsys, 1, cli.main(["drop", "x"]))


def test_bad_setting_is_one_line(capsys, monkeypatch):
    monkeypatch.setenv("PGPORT", "not-a-port")
    assert error_line(capsys, 2, cli.main(["list"])).startswith("invalid setting PostgresSettings.port: ")


def test_unexpected_exception_is_one_line(capsys, monkeypatch):
    def boom(args):
        raise RuntimeError("boom\n  second line")

    monkeypatch.setattr(cli, "cmd_list", boom)
    assert error_line(capsys, 1, cli.main(["list"])) == "unexpected RuntimeError: boom second line"


def test_verbose_logs_the_traceback(capsys, monkeypatch):
    def boom(args):
        raise RuntimeError("boom")

    monkeypatch.setattr(cli, "cmd_list", boom)
    assert cli.main(["-v", "list"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err
    assert err.strip().splitlines()[-1] == "streamviews: error: unexpected RuntimeError: boom"


def test_prog_names_the_alias(capsys):
    assert cli.main(["define", UNBALANCED], prog="python -m pipelines.cv") == 2
    assert capsys.readouterr().err.startswith("python -m pipelines.cv: error: ")


@pytest.mark.parametrize(
    ("error", "status", "message"),
    [
        (CommandError("no topic", 1), 1, "no topic"),
        (CommandError("bad file", 2), 2, "bad file"),
        (DefinitionError("view x: bad\nthing"), 2, "view x: bad thing"),
        (psycopg.errors.InvalidSchemaName('schema "x" does not exist'), 2, 'schema "x" does not exist'),
        (psycopg.errors.UndefinedColumn("no column y"), 2, "no column y"),
        (psycopg.OperationalError("server closed the connection\nunexpectedly"), 1, "server closed the connection"),
        (KafkaException(KafkaError(KafkaError._TRANSPORT, "broker down")), 1, "Kafka: broker down"),
        (ValueError(""), 1, "unexpected ValueError"),
    ],
)
def test_describe_error(error, status, message):
    actual_status, actual = cli.describe_error(error)
    assert actual_status == status
    assert actual.startswith(message)
    assert "\n" not in actual


def test_connection_reason_drops_what_the_caller_says():
    error = psycopg.OperationalError(
        'connection failed: connection to server at "127.0.0.1", port 1 failed: Connection refused\n'
        "\tIs the server running on that host and accepting TCP/IP connections?"
    )
    assert cli_common.connection_reason(error) == "Connection refused"
    error = psycopg.OperationalError(
        'connection failed: connection to server at "127.0.0.1", port 5432 failed: '
        'FATAL:  password authentication failed for user "x"'
    )
    assert cli_common.connection_reason(error) == 'password authentication failed for user "x"'


# --- run ----------------------------------------------------------------------------------------------


def test_run_calls_the_runner(monkeypatch):
    calls = []
    runner = types.SimpleNamespace(main=lambda argv: calls.append(argv) or 3)
    monkeypatch.setitem(__import__("sys").modules, "pipelines.cv.runner", runner)
    assert cli.main(["run", "--group", "g"]) == 3
    assert calls == [["--group", "g"]]


def test_run_without_a_runner_is_one_line(capsys, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "pipelines.cv.runner", None)
    assert "stream runner" in error_line(capsys, 1, cli.main(["run"]))


# --- status and tables --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("low", "high", "next_offset", "lag"),
    [(0, 10, None, 10), (4, 10, None, 6), (0, 10, 7, 3), (5, 10, 2, 5), (0, 10, 10, 0), (0, 10, 12, 0)],
)
def test_partition_lag(low, high, next_offset, lag):
    assert status.partition_lag(low, high, next_offset) == lag


def test_stream_statuses():
    at = datetime(2030, 1, 1, 12, tzinfo=UTC)
    later = datetime(2030, 1, 1, 13, tzinfo=UTC)
    event = datetime(2030, 1, 1, 12, 59, 30, tzinfo=UTC)
    statuses = status.stream_statuses(
        [("clicks", "clicks"), ("gone", "gone")],
        {"clicks": {0: (0, 10), 1: (0, 5)}},
        [("clicks", 0, 8, at, None), ("clicks", 1, 5, later, event)],
        [("clicks", "invalid_json", 3), ("clicks", "check_violation", 1)],
        now=datetime(2030, 1, 1, 13, 0, 12, tzinfo=UTC),
    )
    clicks, gone = statuses
    assert (clicks.partitions, clicks.lag, clicks.lag_by_partition) == (2, 2, {0: 2, 1: 0})
    assert clicks.last_commit == later
    assert (clicks.newest_event, clicks.freshness_s) == (event, 42.0)
    assert (gone.newest_event, gone.freshness_s) == (None, None)
    assert clicks.dead_letters == {"invalid_json": 3, "check_violation": 1}
    assert (gone.partitions, gone.lag, gone.last_commit, gone.dead_letters) == (None, None, None, {})
    assert clicks.as_json()["last_commit"] == "2030-01-01T13:00:00+00:00"
    table = status.status_table("g", statuses).splitlines()
    assert table[0] == "consumer group g"
    assert table[1].split() == [
        "STREAM",
        "TOPIC",
        "PARTITIONS",
        "LAG",
        "FRESHNESS",
        "LAST",
        "COMMIT",
        "DEAD",
        "LETTERS",
        "STATE",
    ]
    assert table[2].split() == [
        "clicks",
        "clicks",
        "2",
        "2",
        "42s",
        "ago",
        "2030-01-01",
        "13:00:00",
        "UTC",
        "check_violation=1,",
        "invalid_json=3",
        "ok",
    ]
    assert table[3].split() == ["gone", "gone", "-", "topic", "missing", "never", "never", "0", "ok"]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "never"),
        (0.4, "0s ago"),
        (42.9, "42s ago"),
        (119, "119s ago"),
        (120, "2m ago"),
        (7_199, "119m ago"),
        (7_200, "2h ago"),
        (172_799, "47h ago"),
        (172_800, "2d ago"),
    ],
)
def test_age(seconds, text):
    assert status.age(seconds) == text


def test_table_aligns_columns():
    assert cli_common.table(("A", "LONGER"), [("xyz", 1), ("b", "")]) == "A    LONGER\nxyz  1\nb"


def test_the_topics_of_the_streams_defined_are_known_before_anything_is_defined():
    script = read_script(
        f"CREATE STREAM a (x int) WITH (partitions = 3);\n{VIEW};\nCREATE STREAM b (x int) WITH (topic = 'b.t')"
    )
    assert cli.stream_topics(script, 6) == {"a": 3, "a.dlq": 3, "b.t": 6, "b.t.dlq": 6}


def test_a_stream_whose_topic_kafka_would_refuse_fails_before_connecting(capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO(f"{VIEW};\nCREATE STREAM b (x int) WITH (topic = 'b/t');\n"))
    message = error_line(capsys, 2, cli.main(["define", "-"]))
    assert message.startswith("statement 2 (line 2): CREATE STREAM b: topic 'b/t' is not a Kafka topic name")
