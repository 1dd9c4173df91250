"""`streamviews`: define, list and drop streams and continuous views, see how far behind they are.

    streamviews define "CREATE STREAM clicks (oid bigint, ts timestamptz) WITH (topic = 'clicks')"
    streamviews define -f views.sql            # many statements: all of them or none
    streamviews define - < views.sql           # the same from standard input (also: -f -)
    streamviews list                           # streams and views as tables
    streamviews list --sql                     # their definitions
    streamviews drop object_likes              # a view (unqualified: public.object_likes) ...
    streamviews drop clicks                    # ... or a stream that has no views left
    streamviews status                         # per stream: lag, freshness, last commit, dead letters; sinks
    streamviews status --json --group my-group
    streamviews subscribe public.url_stats --from 0  # a view's changes as JSON lines, then new ones
    streamviews replay public.url_stats --from '2026-11-26 12:00+00'  # recompute it, swapped in once caught up
    streamviews run [--group G] [--streams a,b]  # the stream runner (see `streamviews run --help`)

Settings come from the environment (PG*, KAFKA_*, PIPELINE_*, LOG_*; see .env.sample). `define` and
`drop` connect as sv_owner (definitions create and drop tables) unless PGUSER is set; `list` and
`status` connect as the configured user. Before `define` changes the catalog, each stream's topic and
dead-letter topic are created when missing: a topic Kafka refuses leaves nothing defined (and the
topics created for it are deleted again). A definition blocked by locks held elsewhere (a reader
holding a view open) is tried again a few times, then fails naming what held it (exit status 1).
`drop-view` and `drop-stream` are aliases of `drop --view` and `drop --stream`; `drop` and a DROP
statement given to `define` go the same way (pipelines.cv.catalog.script: one name resolution).

Every error is one line on stderr: exit status 2 when the input is wrong (arguments, a file, a
definition PostgreSQL rejects), 1 when something failed at run time (a service unreachable, a topic
not created). `-v` logs at DEBUG, including the traceback of an error.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

import psycopg
import pydantic
import structlog
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from pipelines.cv import catalog
from pipelines.cv.catalog.sinks import sink_states
from pipelines.cv.cli_common import (
    FAILURE,
    KAFKA_TIMEOUT_S,
    USAGE,
    CommandError,
    database,
    definer,
    kafka_admin,
    kafka_log,
    kafka_message,
    kafka_topics,
    one_line,
    pg_message,
    pg_status,
    table,
)
from pipelines.cv.feeds import feed_states
from pipelines.cv.frontend.statements import Script, read_script
from pipelines.cv.model import DefinitionError
from pipelines.cv.replay import add_parser as add_replay
from pipelines.cv.status import feeds_table, runner_status, sinks_json, sinks_table, status_table
from pipelines.cv.subscribe import follow, listen, qualified, start_position
from pipelines.errors import StreamviewsError
from pipelines.logs import configure_logging, get_logger
from pipelines.runtime.deadletter import dead_letter_topic
from pipelines.settings import STREAM_RUNNER_GROUP, KafkaSettings, LogSettings, PipelineSettings, PostgresSettings

log = get_logger("cli")

PROG = "streamviews"


# --- define ---------------------------------------------------------------------------------------------


def read_input(statement: str | None, file: str | None, stdin: TextIO) -> tuple[str, str]:
    """The definitions text and where it came from: the statement, a file, or `-` (standard input).

    Raises:
        CommandError: The file cannot be read (exit status 2).
    """
    if statement is not None and statement != "-":
        return "the command line", statement
    if statement == "-" or file == "-":
        return "standard input", stdin.read()
    assert file is not None
    try:
        return file, Path(file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise CommandError(f"cannot read {file}: {reason}", USAGE) from e


def stream_topics(script: Script, default_partitions: int) -> dict[str, int]:
    """The topics (and dead-letter topics) of the streams the script declares, with their partition counts."""
    wanted: dict[str, int] = {}
    for stream in script.streams:
        partitions = stream.partitions or default_partitions
        wanted.setdefault(stream.topic, partitions)
        wanted.setdefault(dead_letter_topic(stream.topic), partitions)
    return wanted


def create_topics(wanted: dict[str, int], kafka: KafkaSettings) -> dict[str, int]:
    """Create the topics that are missing, before any definition is committed; those created.

    A topic Kafka refuses (an invalid name, one that collides with an existing topic, ...) fails the
    command before the catalog changes, and the topics it did create are deleted again.

    Raises:
        CommandError: Kafka is unreachable or refused a topic.
    """
    if not wanted:
        return {}
    admin = kafka_admin(kafka)
    existing = kafka_topics(admin, kafka)
    missing = {topic: n for topic, n in wanted.items() if topic not in existing}
    if not missing:
        return {}
    requests = [NewTopic(topic, num_partitions=n, replication_factor=-1) for topic, n in missing.items()]
    created: dict[str, int] = {}
    refused: list[str] = []
    for topic, future in admin.create_topics(requests, request_timeout=KAFKA_TIMEOUT_S).items():
        try:
            future.result(KAFKA_TIMEOUT_S)
            created[topic] = missing[topic]
        except KafkaException as e:
            if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:  # created meanwhile: fine
                refused.append(f"{topic}: {kafka_message(e)}")
        except TimeoutError:
            refused.append(f"{topic}: no answer from Kafka in {KAFKA_TIMEOUT_S:g} s")
    if refused:
        delete_topics(admin, created)
        raise CommandError(f"topic {refused[0]}; nothing was defined")
    return created


def delete_topics(admin: AdminClient, topics: dict[str, int]) -> None:
    """Delete topics this command created, when what they were created for was not defined after all."""
    if not topics:
        return
    for topic, future in admin.delete_topics(list(topics), operation_timeout=KAFKA_TIMEOUT_S).items():
        try:
            future.result(KAFKA_TIMEOUT_S)
        except (KafkaException, TimeoutError) as e:  # left behind: an empty topic, harmless; said at -v
            log.warning("a topic created for definitions that failed was not deleted", topic=topic, error=str(e))


def cmd_define(args: argparse.Namespace) -> int:
    """Create the streams' missing topics, then apply the statements all or nothing (catalog.apply)."""
    source, text = read_input(args.statement, args.file, sys.stdin)
    script = read_script(text)  # read once: the topics below and the catalog use the same statements
    if not script.statements:
        raise DefinitionError(f"no statements in {source}")
    wanted = stream_topics(script, PipelineSettings().topic_partitions)
    settings, kafka = PostgresSettings(), KafkaSettings()
    with database(settings, definer(settings)) as conn:  # PostgreSQL reachable before Kafka is asked
        created = create_topics(wanted, kafka)  # before the transaction: no lock is held while Kafka answers
        try:
            outcomes = catalog.apply(conn, script)
        except BaseException:
            delete_topics(kafka_admin(kafka), created)
            raise
    for outcome in outcomes:
        print(outcome, flush=True)
    for topic, partitions in created.items():
        print(f"topic {topic} created ({partitions} partitions)")
    return 0


# --- list and drop --------------------------------------------------------------------------------------


# Every definition in an order that applies again as a script: streams (not the feed streams of views
# read by views: those come with the views), transforms, views as they were created (a view over a
# view or a transform comes after what it reads), then sinks.
DEFINITIONS_IN_ORDER = """
SELECT kind, name, definition FROM (
    SELECT 1 AS rank, 'stream' AS kind, name, definition, created_at FROM cv.streams
     WHERE NOT starts_with(topic, 'view:')
    UNION ALL SELECT 2, 'transform', name, definition, created_at FROM cv.transforms
    UNION ALL SELECT 3, 'view', name, definition, created_at FROM cv.views WHERE NOT starts_with(name, 'cv_replay.')
    UNION ALL SELECT 4, 'sink', name, definition, created_at FROM cv.sinks
) AS d ORDER BY rank, CASE WHEN rank = 3 THEN created_at END, name
"""


def cmd_list(args: argparse.Namespace) -> int:
    """Print streams and views as tables, or their definitions with --sql."""
    settings = PostgresSettings()
    with database(settings, settings.user) as conn:
        if args.sql:
            rows = conn.execute(DEFINITIONS_IN_ORDER).fetchall()
            print(
                "\n\n".join(f"-- {kind} {name}\n{definition.rstrip().rstrip(';')};" for kind, name, definition in rows)
            )
            return 0
        streams = catalog.load_streams(conn, skip_broken=True)  # one no longer valid is logged, not fatal
        views = conn.execute(  # not the shadows of replays (pipelines.cv.catalog.replays)
            "SELECT name, stream FROM cv.views WHERE NOT starts_with(name, 'cv_replay.') ORDER BY name"
        ).fetchall()
        transforms = conn.execute("SELECT name, stream FROM cv.transforms ORDER BY name").fetchall()
        sinks = conn.execute("SELECT name, view, topic, format FROM cv.sinks ORDER BY name").fetchall()
    stream_rows = [
        (s.name, s.topic, s.format, ", ".join(s.key) if s.key else "- (append-only)", s.into or "-")
        for s in streams.values()
        if not s.is_feed  # a view read by a view: made by the catalog, listed with its views
    ]
    print(table(("STREAM", "TOPIC", "FORMAT", "KEY", "INTO"), stream_rows) if stream_rows else "no streams")
    print()
    print(table(("VIEW", "STREAM"), views) if views else "no continuous views")
    if transforms:
        print()
        print(table(("TRANSFORM", "STREAM"), transforms))
    if sinks:
        print()
        print(table(("SINK", "FROM", "TOPIC", "FORMAT"), sinks))
    return 0


def cmd_drop(args: argparse.Namespace) -> int:
    """Drop the named views and streams, in the order given, all or nothing (catalog.drop)."""
    settings = PostgresSettings()
    with database(settings, definer(settings)) as conn:
        outcomes = catalog.drop(conn, args.names, args.kind)
    for outcome in outcomes:
        print(outcome)
    return 0


# --- status and run -------------------------------------------------------------------------------------


def cmd_status(args: argparse.Namespace) -> int:
    """Print each stream's consumer lag, last commit and dead letters for the runner's group."""
    group = args.group or PipelineSettings().group_id or STREAM_RUNNER_GROUP
    settings, kafka = PostgresSettings(), KafkaSettings()
    with database(settings, settings.user) as conn:
        statuses = runner_status(conn, kafka_admin(kafka), kafka, group, args.streams)
        sinks = [s for s in sink_states(conn) if not args.streams or s.stream in args.streams]  # of those streams
        feeds = feed_states(conn)
    if args.json:
        print(
            json.dumps(
                {
                    "group": group,
                    "streams": [s.as_json() for s in statuses],
                    "sinks": sinks_json(sinks),
                    "feeds": [f.as_json() for f in feeds],
                },
                indent=2,
            )
        )
    else:
        print(status_table(group, statuses) + sinks_table(sinks) + feeds_table(feeds))
    return 0


def cmd_subscribe(args: argparse.Namespace) -> int:
    """Print a view's changes after a position as JSON lines, then each new one (pipelines.cv.subscribe)."""
    settings = PostgresSettings()
    view = qualified(args.view)
    # Ctrl-C (or SIGTERM) is how a subscription ends: noted by the handler, seen between waits, so
    # it never lands inside the driver's wait for a notification.
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with database(settings, settings.user) as conn:
        listen(conn)  # before the first read: a commit in between is then notified
        follow(conn, view, start_position(conn, view, args.start), args.limit, stopped=stop.is_set)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """Hand the remaining arguments to the stream runner (imported only now: it is a service)."""
    try:
        runner = importlib.import_module("pipelines.cv.runner")
    except ModuleNotFoundError as e:
        if e.name != "pipelines.cv.runner":
            raise
        raise CommandError("the stream runner (pipelines.cv.runner) is not part of this installation") from e
    return runner.main(args.runner_args) or 0


# --- the command line -----------------------------------------------------------------------------------


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The argument parser: one subcommand per thing a user does."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Define, list and drop streams and continuous views; see their lag; run the stream runner.",
        epilog="Examples:\n" + __doc__.split("\n\n")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG, with tracebacks of errors")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    define = commands.add_parser(
        "define", help="create streams and views from a statement, a file or stdin (all or nothing)"
    )
    define.add_argument(
        "statement", nargs="?", help="CREATE STREAM ... or CREATE CONTINUOUS VIEW ...; - reads standard input"
    )
    define.add_argument("-f", "--file", help="a file of statements separated by ';'; - reads standard input")
    define.set_defaults(handler=cmd_define, parser=define)

    listing = commands.add_parser("list", help="streams (topic, format, key, into) and views (stream)")
    listing.add_argument("--sql", action="store_true", help="print the definitions instead of tables")
    listing.set_defaults(handler=cmd_list)

    def add_drop(name: str, kind: str | None, summary: str) -> None:
        drop = commands.add_parser(name, help=summary)
        drop.add_argument("names", nargs="+", metavar="NAME", help="a view (x means public.x), a stream or a sink")
        if kind is None:
            only = drop.add_mutually_exclusive_group()
            only.add_argument("--view", dest="kind", action="store_const", const="view", help="NAME is a view")
            only.add_argument("--stream", dest="kind", action="store_const", const="stream", help="NAME is a stream")
        drop.set_defaults(handler=cmd_drop, kind=kind)

    add_drop("drop", None, "drop views (and their tables) or streams without views (and their state)")
    add_drop("drop-view", "view", "an alias of drop --view (DROP CONTINUOUS VIEW in define does the same)")
    add_drop("drop-stream", "stream", "an alias of drop --stream (DROP STREAM in define does the same)")

    status = commands.add_parser(
        "status", help="per stream: partitions, consumer lag, freshness, last commit, dead letters"
    )
    status.add_argument("streams", nargs="*", metavar="STREAM", help="only these streams (default: all)")
    status.add_argument("--group", help=f"consumer group (default: PIPELINE_GROUP_ID or {STREAM_RUNNER_GROUP})")
    status.add_argument("--json", action="store_true", help="print JSON for machines")
    status.set_defaults(handler=cmd_status)

    subscribe = commands.add_parser(
        "subscribe", help="a view's changes (WITH (changes = true)) as JSON lines, waiting for new ones"
    )
    subscribe.add_argument("view", help="a view that records its changes (x means public.x)")
    subscribe.add_argument(
        "--from", dest="start", default="now", metavar="POSITION", help="print changes after POSITION, or now (default)"
    )
    subscribe.add_argument("--limit", type=_positive, help="stop after N changes (default: never)")
    subscribe.set_defaults(handler=cmd_subscribe)
    add_replay(commands)

    # The runner parses its own arguments (`streamviews run --help` is the runner's help).
    run = commands.add_parser("run", help="run the stream runner: streams' topics into their views", add_help=False)
    run.set_defaults(handler=cmd_run)
    return parser


def _positive(text: str) -> int:
    """An integer of 1 or more (argparse type)."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


def parse_args(argv: Sequence[str] | None, prog: str = PROG) -> argparse.Namespace:
    """Parse the command line; usage errors exit with status 2 (argparse's own message)."""
    parser = build_parser(prog)
    args, extra = parser.parse_known_args(argv)
    if args.command == "run":
        args.runner_args = extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "define" and (args.statement is None) == (args.file is None):
        args.parser.error("give one statement, -f FILE, or - (standard input)")
    return args


def _configure_logging(verbose: bool) -> None:
    """LOG_LEVEL when set, else WARNING: a command's output is its result, not the catalog's INFO lines."""
    settings = LogSettings()
    if verbose:
        settings = settings.model_copy(update={"level": "DEBUG"})
    elif "level" not in settings.model_fields_set:
        settings = settings.model_copy(update={"level": "WARNING"})
    configure_logging(settings)
    kafka_log.setLevel(logging.DEBUG if verbose else logging.CRITICAL)


def _settings_message(error: pydantic.ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    return f"invalid setting {error.title}.{where}: {first['msg']}"


def describe_error(error: Exception) -> tuple[int, str]:
    """The exit status and one-line message of a failed command; unexpected errors name their type."""
    if isinstance(error, CommandError):
        status, message = error.status, str(error)
    elif isinstance(error, catalog.StatementFailed):
        status, message = pg_status(error.error), str(error)
    elif isinstance(error, DefinitionError):
        status, message = USAGE, str(error)
    elif isinstance(error, psycopg.Error):
        status, message = pg_status(error), pg_message(error)
    elif isinstance(error, KafkaException):
        status, message = FAILURE, f"Kafka: {kafka_message(error)}"
    elif isinstance(error, pydantic.ValidationError):
        status, message = USAGE, _settings_message(error)
    elif isinstance(error, StreamviewsError):
        status, message = FAILURE, str(error)
    else:
        status, message = FAILURE, f"unexpected {type(error).__name__}" + (f": {error}" if str(error) else "")
    return status, one_line(message)


def run_command(args: argparse.Namespace) -> tuple[int, str | None]:
    """Run the parsed command: (exit status, None) or (exit status, the one-line error)."""
    try:
        if args.command != "run":  # the runner configures logging itself
            _configure_logging(args.verbose)
        return args.handler(args), None
    except KeyboardInterrupt:
        return 130, "interrupted"
    except BrokenPipeError:
        raise
    except Exception as e:  # the one place that turns any failure into one line
        if structlog.is_configured():
            log.debug("command failed", command=args.command, exc_info=e)
        return describe_error(e)


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    """Entry point of the `streamviews` console script: the exit status."""
    args = parse_args(argv, prog)
    try:
        status, message = run_command(args)
        if message is not None:
            print(f"{prog}: error: {message}", file=sys.stderr)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader (e.g. `| head`) went away: stop quietly; the Python docs' recipe for it.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return FAILURE
    return status


if __name__ == "__main__":
    sys.exit(main())
