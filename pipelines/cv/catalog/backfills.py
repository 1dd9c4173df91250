"""A new view's backfill in the catalog: the partitions its catch-up reads, and when the live runner takes it in.

Called when a view over an append-only stream is created or rebuilt, under the stream's exclusive
lock (pipelines.cv.catalog.locks). It records the partitions the live consumer group has consumed
(ops.kafka_offsets), per topic of the stream and of the streams fed `into` it, with that group: the
catch-up (pipelines/cv/backfill.py) reads their history into this view alone, chasing where the live
group stands, and the live runner leaves the view out meanwhile (pipelines.cv.plans), so a backfill
costs the live views only what its own process takes. Once the catch-up is about a batch behind,
`cv.join_backfill` (migration 0050), under the stream's exclusive lock again, fixes each partition's
switch point at the live group's stored offset: no batch is in flight, so that is exactly where its
next batch starts, and that batch is the first to include the view (the stream's plan version
moved). The catch-up then reads up to the switch points, so no event is counted twice or missed,
whatever the timing.

A partition the live group has not consumed yet when the view is defined is recorded if the group
reads it before the join; if the group has consumed nothing at all of the stream, there is no
backfill: the live runner will read the topic from the stream's start rule (`start_offset`):
everything with 'earliest' (the default), and with 'latest' or a time, nothing before, which the
stream declared it does not keep.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from pipelines.cv.catalog.store import load_streams
from pipelines.cv.frontend.backfill import EARLIEST, backfill_rule
from pipelines.cv.model import StreamDef, ViewDef
from pipelines.logs import get_logger
from pipelines.settings import STREAM_RUNNER_GROUP, PipelineSettings

log = get_logger("cv.catalog")

GROUP_PREFIX = "streamviews-backfill/"  # migration 0029's cv.forget_backfill_offsets knows it too


def live_group(stream: StreamDef) -> str:
    """The consumer group of the runner reading the stream (its declared one, or the supervised runner's)."""
    return stream.consumer_group or PipelineSettings().group_id or STREAM_RUNNER_GROUP


def record(conn: psycopg.Connection, view: ViewDef, stream: StreamDef) -> str:
    """Record the view's backfill and the partitions it reads (the caller holds the stream's lock); say its start."""
    name = view.qualified_name
    conn.execute("DELETE FROM cv.backfills WHERE view = %s", (name,))  # rebuilt: its catch-up starts anew
    rule = backfill_rule(view.options, stream, view.aggregates)
    if rule is None:
        why = (
            "an aggregate kept as a transition state, or in arrival order (array_agg, string_agg, json_agg), may "
            "depend on the order events come in"
        )
        if view.options.get("backfill", "").strip().lower() == "none":
            why = "backfill = 'none'"
        return f"starts from now ({why})"
    feeders = [s for s in load_streams(conn, skip_broken=True).values() if s.into == stream.name]
    read: list[tuple[str, int, str, int]] = []  # (topic, partition, live group, its next offset now)
    for source in (stream, *feeders):
        group = live_group(source)
        rows = conn.execute(
            "SELECT partition, next_offset FROM ops.kafka_offsets"
            " WHERE group_id = %s AND topic = %s AND next_offset > 0 ORDER BY partition",
            (group, source.topic),
        ).fetchall()
        read.extend((source.topic, partition, group, offset) for partition, offset in rows)
    if not read:
        return (
            f"the runner has consumed nothing of {stream.name} yet: it reads the topic from the stream's start "
            f"({stream.start_offset}), this view with it"
        )
    backfill_id = conn.execute("SELECT nextval(pg_get_serial_sequence('cv.backfills', 'id'))").fetchone()[0]
    group_id = f"{GROUP_PREFIX}{name}/{backfill_id}"
    conn.execute(
        "INSERT INTO cv.backfills (view, id, stream, group_id, rule) VALUES (%s, %s, %s, %s, %s)",
        (name, backfill_id, stream.name, group_id, rule),
    )
    conn.execute(
        "INSERT INTO cv.backfill_partitions (view, topic, partition, live_group)"
        " SELECT %s, * FROM unnest(%s::text[], %s::int[], %s::text[])",
        (name, [t for t, _, _, _ in read], [p for _, p, _, _ in read], [g for _, _, g, _ in read]),
    )
    log.info("backfill recorded", view=name, rule=rule, live={f"{t}[{p}]": o for t, p, _, o in read})
    since = "the earliest retained event" if rule == EARLIEST else rule
    return (
        f"backfilling from {since} ({sum(o for _, _, _, o in read)} offsets the runner has read so far), then live; "
        "it reads as incomplete until caught up (streamviews status, cv.backfill_status)"
    )


def join(conn: psycopg.Connection, view: str, reads: list[tuple[str, str]]) -> bool:
    """The live runner takes `view` in from its next batch: its switch points fixed where the live groups stand.

    In a transaction holding the stream's lock exclusively (the caller's): migration 0050's
    cv.join_backfill. `reads`: each (live group, topic) the stream is read by. False when the
    backfill is gone (the view dropped or rebuilt), done or joined already.
    """
    joined = conn.execute(
        "SELECT cv.join_backfill(%s, %s::text[], %s::text[])", (view, [g for g, _ in reads], [t for _, t in reads])
    ).fetchone()[0]
    if joined:
        log.info("backfill joined the live runner", view=view)
    return bool(joined)


@dataclass(frozen=True)
class Progress:
    """A backfill as `streamviews status` shows it: offsets done out of those to do, and when it may be done."""

    view: str
    stream: str
    rule: str
    done: int
    total: int
    complete: bool
    eta_s: float | None  # at the rate so far; None before it started or when done
    live: bool = True  # the live runner maintains the view too (the catch-up joined it: cv.join_backfill)

    def as_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {k: getattr(self, k) for k in ("view", "rule", "done", "total", "complete", "eta_s", "live")}

    def row(self) -> tuple[object, ...]:
        """Its row in the status table."""
        eta = "done" if self.complete else "-" if self.eta_s is None else f"{self.eta_s:.0f} s"
        return (self.view, self.stream, self.rule, f"{self.done}/{self.total}", "yes" if self.live else "not yet", eta)


def progress(conn: psycopg.Connection) -> list[Progress]:
    """Every backfill not done, with its progress (cv.backfill_status, migrations 0029, 0050); replays as "V (replay)".

    Before the join, the offsets to do are up to where the live group stands now: they grow while
    events flow, and the ETA is at the rate so far against them.
    """
    rows = conn.execute(
        "SELECT coalesce(r.view || ' (replay)', s.view) AS shown, s.stream, s.rule, s.offsets_done, s.offsets_total,"
        " s.complete, extract(epoch FROM now() - s.started_at), s.joined_at IS NOT NULL FROM cv.backfill_status AS s"
        " LEFT JOIN cv.replays AS r ON r.shadow = s.view AND r.ended_at IS NULL WHERE NOT s.complete ORDER BY shown"
    ).fetchall()
    found = []
    for view, stream, rule, done, total, complete, elapsed, live in rows:
        eta = None
        if done and elapsed and not complete:
            eta = (total - done) * float(elapsed) / done
        found.append(Progress(view, stream, rule, done, total, complete, eta, live))
    return found
