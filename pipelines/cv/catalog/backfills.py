"""A new view's backfill in the catalog: the switch point between the history and the live runner.

Called when a view over an append-only stream is created or rebuilt, under the stream's exclusive
lock (pipelines.cv.catalog.locks): no batch of the stream is in flight, so the live consumer group's
stored next offsets (ops.kafka_offsets) are exactly where its next batch starts, and that batch is
the first to include the new view (its plan is compiled again when the stream's plan version
moved). The switch point is those offsets, per partition of the stream's topic and of the topics of
streams fed `into` it. The catch-up (pipelines/cv/backfill.py) reads [start, switch) into this view
alone, so no event is counted twice or missed, whatever the timing.

A partition the live group has not consumed yet has no switch point: the live runner will read it
from the stream's start rule (`start_offset`): everything with 'earliest' (the default), and with
'latest' or a time, nothing before, which the stream declared it does not keep.
"""

from __future__ import annotations

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
    """Record the view's backfill and switch points (the caller holds the stream's lock); say what it starts from."""
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
    switch: list[tuple[str, int, int]] = []
    for source in (stream, *feeders):
        rows = conn.execute(
            "SELECT partition, next_offset FROM ops.kafka_offsets"
            " WHERE group_id = %s AND topic = %s AND next_offset > 0 ORDER BY partition",
            (live_group(source), source.topic),
        ).fetchall()
        switch.extend((source.topic, partition, offset) for partition, offset in rows)
    if not switch:
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
        "INSERT INTO cv.backfill_partitions (view, topic, partition, switch_offset)"
        " SELECT %s, * FROM unnest(%s::text[], %s::int[], %s::bigint[])",
        (name, [t for t, _, _ in switch], [p for _, p, _ in switch], [o for _, _, o in switch]),
    )
    log.info("backfill recorded", view=name, rule=rule, switch={f"{t}[{p}]": o for t, p, o in switch})
    since = "the earliest retained event" if rule == EARLIEST else rule
    return (
        f"backfilling from {since} up to {sum(o for _, _, o in switch)} offsets the runner has read, then live; "
        "it reads as incomplete until caught up (streamviews status, cv.backfill_status)"
    )
