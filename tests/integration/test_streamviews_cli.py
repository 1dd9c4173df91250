"""The `streamviews` console script against the running stack: define, list, drop, status and its errors.

Every test runs the installed script in a subprocess with the stack's environment, as a user would,
on streams and views with unique names that it drops afterwards (with their topics).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic

from pipelines.cv import catalog
from tests.integration.conftest import pipeline_env, unique, wait_for

SCRIPT = Path(sys.executable).parent / "streamviews"


@pytest.fixture(scope="module")
def script() -> Path:
    if not SCRIPT.exists():
        pytest.fail(f"{SCRIPT} is missing: run `.venv/bin/pip install -e '.[dev]'`")
    return SCRIPT


@pytest.fixture
def cli(stack, script):
    """Run `streamviews ARGS` (as sv_owner unless `user` says otherwise); the completed process."""

    def run(*args: str, stdin: str | None = None, user: str = "sv_owner", **env: str):
        environment = pipeline_env(stack, PGUSER=user, PIPELINE_TOPIC_PARTITIONS="2", LOG_LEVEL="WARNING", **env)
        return subprocess.run(
            [str(script), *args], input=stdin, env=environment, capture_output=True, text=True, timeout=120
        )

    return run


@pytest.fixture
def name(pg, admin):
    """A unique prefix for this test's streams, views (in public) and topics; all dropped afterwards."""
    prefix = unique("cli")
    yield prefix
    with pg("sv_owner", autocommit=True) as conn:
        views = conn.execute("SELECT name FROM cv.views WHERE stream LIKE %s", (f"{prefix}%",)).fetchall()
        for (view,) in views:
            catalog.drop(conn, [view], "view")
        for (stream,) in conn.execute("SELECT name FROM cv.streams WHERE name LIKE %s", (f"{prefix}%",)).fetchall():
            catalog.drop(conn, [stream], "stream")
        conn.execute("DELETE FROM ops.kafka_offsets WHERE topic LIKE %s", (f"{prefix}%",))
        conn.execute("DELETE FROM ops.dead_letters WHERE topic LIKE %s", (f"{prefix}%",))
    topics = [t for t in admin.list_topics(timeout=30).topics if t.startswith(prefix)]
    if topics:
        for future in admin.delete_topics(topics).values():
            future.result(30)


def stream_sql(name: str) -> str:
    # A consumer group of its own: the supervised runner leaves these streams (and their topics) alone.
    return (
        f"CREATE STREAM {name} (oid bigint, uid bigint)"
        f" WITH (topic = '{name}', key = 'oid, uid', consumer_group = 'cli-tests')"
    )


def view_sql(view: str, stream: str) -> str:
    return f"CREATE CONTINUOUS VIEW {view} AS SELECT oid, count(*) AS n FROM {stream} GROUP BY oid"


def ok(result: subprocess.CompletedProcess) -> list[str]:
    """The stdout lines of a command that must have succeeded."""
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def one_error(result: subprocess.CompletedProcess, status: int = 2) -> str:
    """The single stderr line of a failed command (no traceback, nothing else)."""
    assert result.returncode == status, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("streamviews: error: ")
    return lines[0].removeprefix("streamviews: error: ")


def catalog_names(pg, prefix: str) -> set[str]:
    with pg("sv_owner") as conn:
        rows = conn.execute(
            "SELECT name FROM cv.streams WHERE name LIKE %s UNION ALL SELECT name FROM cv.views WHERE stream LIKE %s",
            (f"{prefix}%", f"{prefix}%"),
        ).fetchall()
    return {row[0] for row in rows}


def test_define_list_and_drop(cli, pg, admin, name):
    # From a statement: the stream, its topic and its dead-letter topic (PIPELINE_TOPIC_PARTITIONS=2).
    created, *topic_lines = ok(cli("define", stream_sql(name)))
    assert created == f"stream {name} created"
    assert set(topic_lines) == {f"topic {name} created (2 partitions)", f"topic {name}.dlq created (2 partitions)"}
    topics = admin.list_topics(timeout=30).topics
    assert len(topics[name].partitions) == len(topics[f"{name}.dlq"].partitions) == 2
    # Defining it again changes nothing and creates no topic.
    assert ok(cli("define", stream_sql(name))) == [f"stream {name} unchanged"]

    # From standard input: an unqualified view lands in public.
    lines = ok(cli("define", "-", stdin=f"-- per object\n{view_sql(name + '_v', name)};\n"))
    assert lines == [f"view public.{name}_v created; backfilled 0 groups from the current state of {name}"]

    listing = "\n".join(ok(cli("list", user="sv_writer")))
    assert any(line.split()[:5] == [name, name, "json", "oid,", "uid"] for line in listing.splitlines())
    assert any(line.split() == [f"public.{name}_v", name] for line in listing.splitlines())
    definitions = "\n".join(ok(cli("list", "--sql", user="sv_writer")))
    assert f"-- view public.{name}_v\n{view_sql(name + '_v', name)};" in definitions

    # A stream with views cannot go; the view goes by its unqualified name, then the stream.
    assert one_error(cli("drop", name)) == f"stream {name} still has views; drop them first"
    assert ok(cli("drop", f"{name}_v")) == [f"view public.{name}_v dropped"]
    assert ok(cli("drop", name)) == [f"stream {name} dropped"]
    assert catalog_names(pg, name) == set()
    assert one_error(cli("drop", name)) == f"no stream, continuous view, transform or sink named {name}"


def test_a_file_is_applied_all_or_nothing(cli, pg, admin, name, tmp_path):
    definitions = tmp_path / "views.sql"
    definitions.write_text(
        f"{stream_sql(name)};\n\n{view_sql(name + '_ok', name)};\n{view_sql('nosuchschema_x.v', name)};\n"
    )
    message = one_error(cli("define", "-f", str(definitions)))
    assert message == (
        'statement 3 (line 4): CREATE CONTINUOUS VIEW nosuchschema_x.v: schema "nosuchschema_x" does not exist'
    )
    assert catalog_names(pg, name) == set()
    assert name not in admin.list_topics(timeout=30).topics

    # A definition error in the second statement: the first is not kept either.
    definitions.write_text(
        f"{stream_sql(name)};\nCREATE CONTINUOUS VIEW {name}_v AS"
        f" SELECT oid, count(*) AS n FROM {name} GROUP BY oid HAVING count(*) > 1;"  # HAVING is refused
    )
    message = one_error(cli("define", "-f", str(definitions)))
    assert message.startswith(f"statement 2 (line 2): continuous view public.{name}_v: ")
    assert catalog_names(pg, name) == set()

    # Fixed, the same file defines both.
    definitions.write_text(f"{stream_sql(name)};\n{view_sql(name + '_v', name)};")
    assert ok(cli("define", "-f", str(definitions)))[:2] == [
        f"stream {name} created",
        f"view public.{name}_v created; backfilled 0 groups from the current state of {name}",
    ]
    assert catalog_names(pg, name) == {name, f"public.{name}_v"}


def test_errors_are_one_line(cli, pg, name, tmp_path):
    unbalanced = f"CREATE STREAM {name} (a bigint) WITH (topic = '{name}'"
    assert one_error(cli("define", unbalanced)) == f"CREATE STREAM {name}: syntax error: syntax error at end of input"
    assert one_error(cli("define", "-", stdin=f"{unbalanced};\n")).startswith(f"CREATE STREAM {name}: syntax error")
    assert catalog_names(pg, name) == set()

    ok(cli("define", stream_sql(name)))
    message = one_error(cli("define", view_sql("nosuchschema_x.v", name)))
    assert message == 'CREATE CONTINUOUS VIEW nosuchschema_x.v: schema "nosuchschema_x" does not exist'
    message = one_error(cli("define", "-f", str(tmp_path / "missing.sql")))
    assert message == f"cannot read {tmp_path / 'missing.sql'}: No such file or directory"
    assert one_error(cli("define", "-", stdin="-- nothing here\n")) == "no statements in standard input"

    message = one_error(cli("list", user="sv_writer", PGPORT="1"), status=1)
    assert message == "cannot connect to PostgreSQL at 127.0.0.1:1/streamviews as sv_writer: Connection refused"
    message = one_error(cli("status", user="sv_writer", KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:1"), status=1)
    assert message.startswith("cannot reach Kafka at 127.0.0.1:1: ")


def test_status_shows_lag_last_commit_and_dead_letters(cli, pg, kafka, name):
    ok(cli("define", stream_sql(name)))
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    for uid in range(5):
        producer.produce(name, value=json.dumps({"oid": 1, "uid": uid}).encode(), partition=0)
    assert producer.flush(30) == 0
    group = unique("cli-group")  # no runner consumes in this group: the lag is exactly what was produced

    def status() -> dict:
        report = json.loads("\n".join(ok(cli("status", "--json", "--group", group, name, user="sv_writer"))))
        assert report["group"] == group
        (stream,) = report["streams"]
        return stream

    stream = wait_for(lambda: (s := status())["lag"] == 5 and s, what="lag of 5")
    assert stream | {"lag_by_partition": None, "oldest_retained_event": None} == {
        "stream": name,
        "topic": name,
        "partitions": 2,
        "lag": 5,
        "lag_by_partition": None,
        "last_commit": None,
        "newest_event": None,
        "freshness_s": None,
        "dead_letters": {},
        "held": None,
        "failed_views": [],
        "change_positions": {},
        "transforms": {},
        "backfills": [],
        "retained_offsets": 5,  # how far back a backfill reaches: the 5 records, the oldest produced just now
        "oldest_retained_event": None,
    }
    assert stream["oldest_retained_event"] is not None
    assert stream["lag_by_partition"] == {"0": 5, "1": 0}

    # The group has committed 3 records of partition 0 and counted a dead letter.
    with pg("sv_writer", autocommit=True) as conn:
        conn.execute(
            "INSERT INTO ops.kafka_offsets (group_id, topic, partition, next_offset) VALUES (%s, %s, 0, 3)",
            (group, name),
        )
        conn.execute(
            "INSERT INTO ops.dead_letters (group_id, topic, reason, count) VALUES (%s, %s, 'invalid_json', 4)",
            (group, name),
        )
    stream = status()
    assert (stream["lag"], stream["dead_letters"]) == (2, {"invalid_json": 4})
    assert stream["last_commit"] is not None

    header, columns, row, *reach = ok(cli("status", "--group", group, name, user="sv_writer"))
    assert reach[:3] == ["", "retained history (how far back a backfill reaches)", reach[2]]
    assert reach[3].split()[:3] == [name, name, "5"]  # the stream, its topic, the offsets it retains
    assert header == f"consumer group {group}"
    assert columns.split() == [
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
    cells = row.split()
    assert cells[:4] == [name, name, "2", "2"]
    assert cells[-2:] == ["invalid_json=4", "ok"]
    assert one_error(cli("status", f"{name}_nosuch", user="sv_writer")) == f"no stream named {name}_nosuch"


def test_a_topic_kafka_cannot_take_leaves_nothing_defined(cli, pg, admin, name):
    # A trailing newline once passed the topic check: the stream was committed, its topic never created.
    message = one_error(cli("define", f"CREATE STREAM {name} (a bigint) WITH (topic = '{name}\n')"))
    assert message == f"CREATE STREAM {name}: option topic '{name}\\n' has a control character"
    assert catalog_names(pg, name) == set()

    # Kafka refuses a topic whose name collides with another's once '.' and '_' are alike: the topics
    # are created before the catalog changes, so the stream is not defined, and its dead-letter topic,
    # created in the same request, is deleted again.
    admin.create_topics([NewTopic(f"{name}_x", num_partitions=1, replication_factor=1)])[f"{name}_x"].result(30)
    definitions = f"{stream_sql(name)};\nCREATE STREAM {name}_2 (a bigint) WITH (topic = '{name}.x');"
    message = one_error(cli("define", "-", stdin=definitions), status=1)
    assert message.startswith(f"topic {name}.x: ")
    assert "collides" in message
    assert message.endswith("; nothing was defined")
    assert catalog_names(pg, name) == set()
    topics = admin.list_topics(timeout=30).topics
    assert {name, f"{name}.dlq", f"{name}.x", f"{name}.x.dlq"}.isdisjoint(topics)


def test_a_reader_holding_a_view_open_fails_its_replace_and_drop_in_one_line_naming_it(cli, pg, name):
    ok(cli("define", "-", stdin=f"{stream_sql(name)};\n{view_sql(name + '_v', name)};"))
    replace = (
        view_sql(f"{name}_v", name).replace("CREATE", "CREATE OR REPLACE", 1).replace("AS n", "AS n, count(*) + 1 AS m")
    )
    with pg("sv_owner") as reader:  # an open transaction that read the view (the owner: no watchdog ends it)
        reader.execute(f"SELECT * FROM public.{name}_v").fetchall()
        for args in (("define", replace), ("drop", f"{name}_v")):
            message = one_error(cli(*args, PIPELINE_DEFINITION_ATTEMPTS="2"), status=1)
            assert f"a reader holds public.{name}_v open (pid {reader.info.backend_pid}, sv_owner" in message
            assert message.endswith("(tried 2 times); retry later")
        reader.rollback()
    assert ok(cli("drop", f"{name}_v")) == [f"view public.{name}_v dropped"]


def test_a_stored_stream_this_release_refuses_blocks_no_definition_and_can_be_dropped(cli, pg, name):
    # As a stream defined before topics ending in a newline were refused was stored.
    with pg("sv_owner", autocommit=True) as conn:
        conn.execute(
            "INSERT INTO cv.streams (name, topic, definition) VALUES (%s, %s, %s)",
            (name, f"{name}\n", f"CREATE STREAM {name} (a bigint) WITH (topic = '{name}\n')"),
        )
    assert ok(cli("define", stream_sql(f"{name}_ok")))[0] == f"stream {name}_ok created"
    assert ok(cli("drop", name)) == [f"stream {name} dropped"]
    assert catalog_names(pg, name) == {f"{name}_ok"}
