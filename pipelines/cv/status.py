"""`streamviews status`: how far the runner's consumer group is behind on each stream, and how fresh.

The lag of a partition counts from the group's next offset, as stored in PostgreSQL with the views
(ops.kafka_offsets), to the partition's high watermark in Kafka; dead letters are counted per reason.
Freshness is the age of the newest event committed: the latest Kafka timestamp the group stored with
its offsets (`last_event_at`, in the batch's own transaction), against the database's clock. It is
read from PostgreSQL alone, so it needs no metrics endpoint, and it grows while a stream is idle.

Each sink (CREATE SINK): its topic and format, the position it relayed, how far behind its view it
is (changes, and the age of the oldest change it has not relayed), and whether it failed, and why.

How far back each topic reaches (what a backfill or a new consumer can still read, as its retention
left it): the offsets it retains (low to high watermark) and the Kafka timestamp of its oldest
retained record, read back from each partition's low watermark.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg
from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from pipelines.cv.catalog import backfills
from pipelines.cv.catalog.sinks import SinkState
from pipelines.cv.cli_common import KAFKA_TIMEOUT_S, CommandError, kafka_message, kafka_topics, table
from pipelines.cv.feeds import FeedState
from pipelines.cv.frontend.view_sources import FEED_TOPIC_PREFIX
from pipelines.cv.model import DefinitionError
from pipelines.runtime.checkpoint import partition_lag
from pipelines.runtime.reread import RecordsNotFetched, read_back
from pipelines.settings import KafkaSettings


@dataclass
class StreamStatus:
    """How far the runner's consumer group is behind on one stream's topic."""

    stream: str
    topic: str
    partitions: int | None = None  # None: the topic does not exist
    lag: int | None = None
    lag_by_partition: dict[int, int] = field(default_factory=dict)
    last_commit: datetime | None = None
    newest_event: datetime | None = None  # the latest Kafka timestamp committed
    freshness_s: float | None = None  # its age when the status was read
    dead_letters: dict[str, int] = field(default_factory=dict)
    held: str | None = None  # why the runner holds the stream back (cv.stream_failures), if it does
    failed_views: list[ViewFailure] = field(default_factory=list)
    change_positions: dict[str, int] = field(default_factory=dict)  # views recording changes: last position
    transform_positions: dict[str, int] = field(default_factory=dict)  # its transforms: last position (0026)
    retained: int | None = None  # offsets the topic still holds (high - low watermark, summed)
    oldest_event: datetime | None = None  # the Kafka timestamp of its oldest retained record
    backfills: list[backfills.Progress] = field(default_factory=list)  # its views catching up on history

    def as_json(self) -> dict[str, Any]:
        """A JSON-ready dict (times in ISO 8601)."""
        return {
            "stream": self.stream,
            "topic": self.topic,
            "partitions": self.partitions,
            "lag": self.lag,
            "lag_by_partition": {str(p): n for p, n in sorted(self.lag_by_partition.items())},
            "last_commit": self.last_commit.isoformat() if self.last_commit else None,
            "newest_event": self.newest_event.isoformat() if self.newest_event else None,
            "freshness_s": self.freshness_s,
            "dead_letters": self.dead_letters,
            "held": self.held,
            "failed_views": [f.as_json() for f in self.failed_views],
            "backfills": [b.as_json() for b in self.backfills],
            "change_positions": self.change_positions,
            "transforms": self.transform_positions,
            "retained_offsets": self.retained,
            "oldest_retained_event": self.oldest_event.isoformat() if self.oldest_event else None,
        }


@dataclass(frozen=True)
class ViewFailure:
    """A view of the stream that is not maintained (quarantined), or that missed events (a gap)."""

    view: str
    state: str  # "quarantined" or "gap"
    reason: str
    since: datetime
    retry_at: datetime | None = None  # quarantined: when the runner tries it again
    missed: str = ""  # gap: the offsets it did not see

    def as_json(self) -> dict[str, Any]:
        """A JSON-ready dict (times in ISO 8601)."""
        return {
            "view": self.view,
            "state": self.state,
            "reason": self.reason,
            "since": self.since.isoformat(),
            "retry_at": self.retry_at.isoformat() if self.retry_at else None,
            "missed": self.missed,
        }

    def advice(self) -> str:
        """What an operator does about it."""
        if self.state == "quarantined":
            return "fix the cause; the runner retries it and resumes it (rebuilt from a keyed stream's state)"
        return "these events are not counted: replay the view, or drop and recreate it"


# Both read by any role that reads the catalog (migration 0015).
FAILURES_SQL = (
    "SELECT stream, view, 'quarantined', reason, failed_at, retry_at, '' FROM cv.view_failures"
    " UNION ALL SELECT stream, view, 'gap', reason, failed_at, NULL, missed_from::text || ' .. ' || missed_to::text"
    " FROM cv.view_gaps ORDER BY 1, 2, 5"
)
# The views that record their changes, and the last position recorded (migration 0020).
# Each stream's continuous transforms, and the last position of their output (migration 0026).
TRANSFORMS_SQL = (
    "SELECT t.stream, t.name, p.last FROM cv.transforms AS t JOIN cv.view_change_positions AS p ON p.view = t.name"
    " ORDER BY 2"
)
CHANGES_SQL = (
    "SELECT v.stream, p.view, p.last FROM cv.view_change_positions AS p JOIN cv.views AS v ON v.name = p.view"
    " WHERE p.recording ORDER BY 2"
)


def watermarks(admin: AdminClient, kafka: KafkaSettings, topics: set[str]) -> dict[str, dict[int, tuple[int, int]]]:
    """(low, high) watermark per partition of each existing topic among `topics`.

    Raises:
        CommandError: The brokers did not answer within KAFKA_TIMEOUT_S.
    """
    metadata = kafka_topics(admin, kafka)
    parts = [
        TopicPartition(topic, partition)
        for topic in sorted(topics)
        if topic in metadata and metadata[topic].error is None
        for partition in sorted(metadata[topic].partitions)
    ]
    result: dict[str, dict[int, tuple[int, int]]] = {t: {} for t in topics if t in metadata}
    if not parts:
        return result
    try:
        low = admin.list_offsets({tp: OffsetSpec.earliest() for tp in parts}, request_timeout=KAFKA_TIMEOUT_S)
        high = admin.list_offsets({tp: OffsetSpec.latest() for tp in parts}, request_timeout=KAFKA_TIMEOUT_S)
        lows = {(tp.topic, tp.partition): f.result(KAFKA_TIMEOUT_S).offset for tp, f in low.items()}
        highs = {(tp.topic, tp.partition): f.result(KAFKA_TIMEOUT_S).offset for tp, f in high.items()}
    except KafkaException as e:
        raise CommandError(f"cannot read offsets from Kafka at {kafka.bootstrap_servers}: {kafka_message(e)}") from e
    for (topic, partition), low_offset in lows.items():
        result[topic][partition] = (low_offset, highs[(topic, partition)])
    return result


def stream_statuses(
    streams: list[tuple[str, str]],
    marks: dict[str, dict[int, tuple[int, int]]],
    offsets: list[tuple[str, int, int, datetime, datetime | None]],
    dead: list[tuple[str, str, int]],
    now: datetime | None = None,
) -> list[StreamStatus]:
    """Combine the catalog's streams, Kafka's watermarks and the group's stored offsets and dead letters.

    `offsets` are (topic, partition, next offset, last commit, newest event time); freshness is
    measured at `now` (the database's clock; default: this machine's).
    """
    now = now or datetime.now(UTC)
    committed: dict[str, dict[int, int]] = {}
    last: dict[str, datetime] = {}
    newest: dict[str, datetime] = {}
    for topic, partition, next_offset, updated_at, event_at in offsets:
        committed.setdefault(topic, {})[partition] = next_offset
        last[topic] = max(last.get(topic, updated_at), updated_at)
        if event_at is not None:
            newest[topic] = max(newest.get(topic, event_at), event_at)
    dead_by_topic: dict[str, dict[str, int]] = {}
    for topic, reason, count in dead:
        dead_by_topic.setdefault(topic, {})[reason] = count
    statuses = []
    for name, topic in streams:
        status = StreamStatus(name, topic, last_commit=last.get(topic), dead_letters=dead_by_topic.get(topic, {}))
        if topic in newest:
            status.newest_event = newest[topic]
            status.freshness_s = round(max((now - newest[topic]).total_seconds(), 0.0), 3)
        if topic in marks:
            status.partitions = len(marks[topic])
            status.lag_by_partition = {
                p: partition_lag(low, high, committed.get(topic, {}).get(p)) for p, (low, high) in marks[topic].items()
            }
            status.lag = sum(status.lag_by_partition.values())
            status.retained = sum(high - low for low, high in marks[topic].values())
        statuses.append(status)
    return statuses


def status_table(group: str, statuses: list[StreamStatus]) -> str:
    """The statuses for people: one row per stream, then the views that are not maintained."""
    rows = []
    failures = []
    changes = [(view, s.stream, last) for s in statuses for view, last in sorted(s.change_positions.items())]
    transforms = [(name, s.stream, last) for s in statuses for name, last in sorted(s.transform_positions.items())]
    for s in statuses:
        failures += [
            (f.view, f.state, f.since.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"), f.reason[:100], f.advice())
            for f in s.failed_views
        ]
        commit = s.last_commit.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if s.last_commit else "never"
        dead = ", ".join(f"{reason}={n}" for reason, n in sorted(s.dead_letters.items())) or "0"
        partitions = "-" if s.partitions is None else s.partitions
        lag = "topic missing" if s.lag is None else s.lag
        state = f"held: {s.held[:80]}" if s.held else "ok"
        rows.append((s.stream, s.topic, partitions, lag, age(s.freshness_s), commit, dead, state))
    header = f"consumer group {group}"
    if not rows:
        return f"{header}\nno streams"
    columns = ("STREAM", "TOPIC", "PARTITIONS", "LAG", "FRESHNESS", "LAST COMMIT", "DEAD LETTERS", "STATE")
    text = header + "\n" + table(columns, rows)
    if failures:
        text += "\n\nviews not maintained\n" + table(("VIEW", "STATE", "SINCE", "REASON", "WHAT TO DO"), failures)
    if changes:
        text += "\n\nchange streams\n" + table(("VIEW", "STREAM", "LAST POSITION"), changes)
    if transforms:
        text += "\n\ncontinuous transforms\n" + table(("TRANSFORM", "STREAM", "LAST POSITION"), transforms)
    reach = [
        (s.stream, s.topic, s.retained, s.oldest_event.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"))
        for s in statuses
        if s.oldest_event is not None
    ]
    if reach:
        text += "\n\nretained history (how far back a backfill reaches)\n"
        text += table(("STREAM", "TOPIC", "RETAINED OFFSETS", "OLDEST EVENT"), reach)
    if catching_up := [b.row() for s in statuses for b in s.backfills]:
        text += "\n\nviews catching up on history (incomplete until done)\n"
        text += table(("VIEW", "STREAM", "FROM", "OFFSETS DONE", "LIVE", "ETA"), catching_up)
    return text


def sink_lag_s(state: SinkState, now: datetime | None = None) -> float:
    """Seconds since the oldest change the sink has not relayed was committed; 0 when it is caught up."""
    if state.oldest_untaken is None or not state.lag_changes:
        return 0.0
    return round(max(((now or datetime.now(UTC)) - state.oldest_untaken).total_seconds(), 0.0), 3)


def sinks_json(states: list[SinkState]) -> list[dict[str, Any]]:
    """Each sink for machines: topic, format, position, lag (changes, seconds), failure."""
    return [
        {
            "sink": s.name,
            "view": s.view,
            "topic": s.topic,
            "format": s.format if s.envelope is None else f"{s.format} ({s.envelope})",
            "position": s.position,
            "lag_changes": s.lag_changes,
            "lag_seconds": sink_lag_s(s),
            "snapshot_done": s.snapshot_done,
            "failed": s.error,
        }
        for s in states
    ]


def sinks_table(states: list[SinkState]) -> str:
    """The sinks for people, after the streams' table ("" when there is none)."""
    if not states:
        return ""
    rows = [
        (
            row["sink"],
            row["view"],
            row["topic"],
            row["format"],
            row["position"] if row["snapshot_done"] else "snapshot pending",
            row["lag_changes"],
            f"{row['lag_seconds']:.1f}s",
            f"failed: {row['failed'][:80]}" if row["failed"] else "ok",
        )
        for row in sinks_json(states)
    ]
    return "\n\nsinks\n" + table(("SINK", "VIEW", "TOPIC", "FORMAT", "POSITION", "LAG", "LAG TIME", "STATE"), rows)


def oldest_events(kafka: KafkaSettings, marks: dict[str, dict[int, tuple[int, int]]]) -> dict[str, datetime]:
    """Per topic, the Kafka timestamp of its oldest retained record (its partitions' records at the low watermark).

    A topic whose records are not read back in time (or that has none) is left out: status still answers.
    """
    ranges = {(t, p): (low, low + 1) for t, parts in marks.items() for p, (low, high) in parts.items() if high > low}
    try:
        records = read_back(kafka.bootstrap_servers, f"{kafka.client_id}-status", ranges, timeout_s=KAFKA_TIMEOUT_S)
    except RecordsNotFetched:
        return {}
    oldest: dict[str, datetime] = {}
    for (topic, _), messages in records.items():
        for message in messages:
            ms = message.timestamp()[1]
            if ms >= 0:
                at = datetime.fromtimestamp(ms / 1000, UTC)
                oldest[topic] = min(oldest.get(topic, at), at)
    return oldest


def feeds_table(feeds: list[FeedState]) -> str:
    """The views read by other views (pipelines.cv.feeds): each feed's lag behind its upstream's changes."""
    if not feeds:
        return ""
    rows = [
        (
            f.stream,
            f.upstream,
            f.lag,
            f.taken_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S"),
            f.views,
            f.quarantined,
            f.dead_letters,
        )
        for f in feeds
    ]
    columns = ("FEED", "UPSTREAM", "LAG (CHANGES)", "LAST TAKEN (UTC)", "VIEWS", "QUARANTINED", "DEAD LETTERS")
    return "\n\nviews over views\n" + table(columns, rows)


def age(seconds: float | None) -> str:
    """How long ago, in the largest unit that keeps two digits: `42s ago`, `17m ago`, `5h ago`, `3d ago`."""
    if seconds is None:
        return "never"
    for unit, size, below in (("s", 1, 120), ("m", 60, 7_200), ("h", 3_600, 172_800)):
        if seconds < below:
            return f"{int(seconds // size)}{unit} ago"
    return f"{int(seconds // 86_400)}d ago"


def runner_status(
    conn: psycopg.Connection, admin: AdminClient, kafka: KafkaSettings, group: str, only: list[str] | None = None
) -> list[StreamStatus]:
    """Each declared stream's status for `group` (a role that reads ops.kafka_offsets: the writer).

    Raises:
        DefinitionError: `only` names a stream that is not declared.
    """
    streams = conn.execute(  # views read by views have no topic: `feeds_table` shows them
        "SELECT name, topic FROM cv.streams WHERE NOT starts_with(topic, %s) ORDER BY name", (FEED_TOPIC_PREFIX,)
    ).fetchall()
    if only:
        unknown = sorted(set(only) - {name for name, _ in streams})
        if unknown:
            raise DefinitionError(f"no stream named {', '.join(unknown)}")
        streams = [(name, topic) for name, topic in streams if name in only]
    topics = [topic for _, topic in streams]
    offsets = conn.execute(
        "SELECT topic, partition, next_offset, updated_at, last_event_at FROM ops.kafka_offsets"
        " WHERE group_id = %s AND topic = ANY(%s)",
        (group, topics),
    ).fetchall()
    (now,) = conn.execute("SELECT now()").fetchone()
    dead = conn.execute(
        "SELECT topic, reason, count FROM ops.dead_letters WHERE group_id = %s AND topic = ANY(%s)", (group, topics)
    ).fetchall()
    marks = watermarks(admin, kafka, set(topics))
    statuses = stream_statuses(streams, marks, offsets, dead, now)
    oldest = oldest_events(kafka, marks)
    for s in statuses:
        s.oldest_event = oldest.get(s.topic)
    by_name = {s.stream: s for s in statuses}
    for stream, reason in conn.execute("SELECT stream, reason FROM cv.stream_failures WHERE group_id = %s", (group,)):
        if stream in by_name:
            by_name[stream].held = reason
    for stream, *failure in conn.execute(FAILURES_SQL):
        if stream in by_name:
            by_name[stream].failed_views.append(ViewFailure(*failure))
    for stream, view, last in conn.execute(CHANGES_SQL):
        if stream in by_name:
            by_name[stream].change_positions[view] = last
    for stream, name, last in conn.execute(TRANSFORMS_SQL):
        if stream in by_name:
            by_name[stream].transform_positions[name] = last
    for progress in backfills.progress(conn):
        if progress.stream in by_name:
            by_name[progress.stream].backfills.append(progress)
    return statuses
