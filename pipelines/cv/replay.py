"""`streamviews replay VIEW --from TIME|earliest`: recompute an append-only view from its stream's retained history.

After a bug fix, or when a view's result is in doubt, the view is computed again from a point of the
history its topic still holds, while readers keep reading its current result; once the new one has
caught up it is swapped in atomically, and the view keeps its name, grants, sinks and change stream
(pipelines.cv.catalog.replays: a hidden shadow view, caught up by the runner's backfill process,
swapped in by it). The command starts the replay, then prints its progress until the swap (with
`--no-wait`, it returns at once; `streamviews status` shows it as "<view> (replay)"). Ctrl-C leaves
the replay running; `--cancel` drops it.

`--from` earlier than what the topic retains is refused, naming how far back its history reaches:
a replay from less history than asked would replace the view's result by a smaller one without a
word (`--from earliest` asks for whatever is retained).
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime

import psycopg

from pipelines.cv import catalog
from pipelines.cv.catalog import replays
from pipelines.cv.cli_common import KAFKA_TIMEOUT_S, USAGE, CommandError, database, definer, kafka_admin
from pipelines.cv.frontend.backfill import EARLIEST, parse_rule, rule_ms
from pipelines.cv.model import DefinitionError
from pipelines.cv.status import watermarks
from pipelines.cv.subscribe import qualified
from pipelines.runtime.reread import RecordsNotFetched, read_back
from pipelines.settings import KafkaSettings, PostgresSettings

PROGRESS_EVERY_S = 1.0  # how often a waiting `streamviews replay` looks at its progress

Partition = tuple[str, int]


def parse_from(text: str, now: datetime) -> str:
    """`earliest`, or a timestamp with its time zone not in the future: the replay's backfill rule.

    Raises:
        CommandError: Anything else (exit status 2).
    """
    example = "e.g. '2026-11-26 12:00:00+00'"
    try:
        rule = parse_rule(text, "--from")
    except DefinitionError:
        rule = None
    if rule is None or rule == "none":
        raise CommandError(f"--from {text!r} is not 'earliest' or a timestamp with its time zone, {example}", USAGE)
    if rule != EARLIEST and datetime.fromisoformat(rule) > now:
        raise CommandError(f"--from {text!r} is in the future: there is nothing to replay", USAGE)
    return rule


def retention_refusal(rule: str, reach: dict[Partition, tuple[int, int | None]]) -> str | None:
    """Why the topics no longer hold every event since `rule`, or None when they do.

    `reach`: per partition, its low watermark and the Kafka timestamp (ms) of the record there (None:
    it retains none). A partition that never lost a record (low watermark 0) holds everything; one
    whose oldest retained record is later than `rule` may have lost events after it.
    """
    if rule == EARLIEST:
        return None
    since = rule_ms(rule)
    assert since is not None
    lost = {tp: first for tp, (low, first) in reach.items() if low > 0 and (first is None or first > since)}
    if not lost:
        return None
    if empty := sorted(tp for tp, first in lost.items() if first is None):
        topic, partition = empty[0]
        back = f"partition {partition} of {topic} retains no event any more"
    else:
        oldest = datetime.fromtimestamp(max(first for low, first in reach.values() if low > 0 and first) / 1000, UTC)
        back = f"its complete history reaches back to {oldest:%Y-%m-%d %H:%M:%S} UTC"
    return (
        f"--from {rule} is before what the topic retains (its retention deleted older events): {back}; "
        "replay from a later time, or --from earliest for whatever is retained"
    )


def topic_reach(kafka: KafkaSettings, topics: set[str]) -> dict[Partition, tuple[int, int | None]]:
    """Per partition of `topics`: its low watermark and the Kafka timestamp of its oldest retained record.

    Raises:
        CommandError: Kafka did not answer, or the records were not read back, within KAFKA_TIMEOUT_S.
    """
    marks = watermarks(kafka_admin(kafka), kafka, topics)
    ranges = {(t, p): (low, low + 1) for t, parts in marks.items() for p, (low, high) in parts.items() if high > low}
    try:
        records = read_back(kafka.bootstrap_servers, f"{kafka.client_id}-replay", ranges, timeout_s=KAFKA_TIMEOUT_S)
    except RecordsNotFetched as e:
        raise CommandError(f"cannot read the oldest retained events back from Kafka: {e}") from e
    first = {tp: messages[0].timestamp()[1] for tp, messages in records.items() if messages}
    return {(t, p): (low, first.get((t, p))) for t, parts in marks.items() for p, (low, _) in parts.items()}


def check_retention(conn: psycopg.Connection, name: str, rule: str, kafka: KafkaSettings) -> None:
    """Refuse a `--from` before what the view's topics retain (those of its stream and of streams fed into it).

    A view that is not there or not replayable is left to replays.start, which says why.
    """
    row = conn.execute("SELECT stream FROM cv.views WHERE name = %s", (name,)).fetchone()
    streams = catalog.load_streams(conn, skip_broken=True)
    stream = streams.get(row[0]) if row else None
    if rule == EARLIEST or stream is None or stream.key is not None or stream.is_feed:
        return
    topics = {s.topic for s in streams.values() if s.name == stream.name or s.into == stream.name}
    if why := retention_refusal(rule, topic_reach(kafka, topics)):
        raise CommandError(f"replay of {name}: {why}", USAGE)


def progress_line(name: str, state: replays.Replay, elapsed_s: float) -> str:
    """One line of a waiting replay's progress: offsets done of those to do, and an ETA at the rate so far."""
    if state.caught_up:
        return f"replay of {name}: caught up ({state.done}/{state.total} offsets); swapping it in"
    if not state.total:
        return f"replay of {name}: waiting for the stream runner to start it"
    eta = f", about {(state.total - state.done) * elapsed_s / state.done:.0f} s left" if state.done else ""
    return f"replay of {name}: {state.done}/{state.total} offsets{eta}"


def wait(conn: psycopg.Connection, replay_id: int, name: str) -> int:
    """Print the replay's progress until it ends: 0 once swapped in.

    Raises:
        CommandError: It ended otherwise (cancelled, redefined, failed), or Ctrl-C (it goes on).
    """
    started, last = time.monotonic(), ""
    try:
        while True:
            state = replays.replay(conn, replay_id)
            if state is None:
                raise CommandError(f"{name} was dropped during its replay")
            if state.outcome == "swapped":
                print(f"replay of {name} swapped in: {state.groups} groups, computed from {state.rule}", flush=True)
                return 0
            if state.ended_at is not None:
                raise CommandError(f"replay of {name} {state.outcome}")
            line = progress_line(name, state, time.monotonic() - started)
            if line != last:
                print(line, flush=True)
                last = line
            time.sleep(PROGRESS_EVERY_S)
    except KeyboardInterrupt:
        raise CommandError(
            f"interrupted; the replay of {name} goes on in the stream runner (streamviews status; "
            f"streamviews replay {name} --cancel drops it)",
            130,
        ) from None


def cmd_replay(args: argparse.Namespace) -> int:
    """Start (or cancel) a view's replay, then wait for its swap unless --no-wait."""
    settings, name = PostgresSettings(), qualified(args.view)
    with database(settings, definer(settings)) as conn:
        if args.cancel:
            if not replays.cancel(conn, name):
                raise CommandError(f"no replay of {name} is running", USAGE)
            print(f"replay of {name} cancelled; the view keeps its current result")
            return 0
        if args.start is None:
            raise CommandError("give --from TIME, --from earliest, or --cancel", USAGE)
        (now,) = conn.execute("SELECT now()").fetchone()
        rule = parse_from(args.start, now)
        check_retention(conn, name, rule, KafkaSettings())
        replay_id, line = replays.start(conn, name, rule)
        print(line, flush=True)
        if args.no_wait:
            print(f"the stream runner swaps it in once caught up; streamviews status shows it as {name} (replay)")
            return 0
        return wait(conn, replay_id, name)


def add_parser(commands: argparse._SubParsersAction) -> None:
    """The `replay` subcommand."""
    replay = commands.add_parser(
        "replay", help="recompute an append-only view from its stream's retained history, swapped in once caught up"
    )
    replay.add_argument("view", help="the view to recompute (x means public.x)")
    replay.add_argument(
        "--from", dest="start", metavar="TIME", help="'earliest' or a timestamp with its time zone (within retention)"
    )
    replay.add_argument("--no-wait", action="store_true", help="return once started; the runner swaps it in")
    replay.add_argument("--cancel", action="store_true", help="drop the running replay; the view keeps its result")
    replay.set_defaults(handler=cmd_replay)
