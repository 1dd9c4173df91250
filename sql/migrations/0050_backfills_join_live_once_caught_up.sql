-- why: a view's backfill fixed its switch point when the view was defined, so the live runner
-- maintained the new view from that moment on, beside every view it already kept, for the whole
-- catch-up. Measured with loadgen.backfill (docs/performance.md): that second view's maintenance,
-- not the catch-up itself, is what slowed the live views during a backfill (a second view with no
-- backfill at all slowed them as much). Now a backfill first catches up on its own, up to where the
-- live group stands, in rounds, and the live runner takes the view in only when the catch-up is
-- close to it, or gains too little on it to be worth chasing (pipelines/cv/backfill.py,
-- should_join): then, in a short transaction under the stream's exclusive lock, cv.join_backfill
-- fixes the switch points at the live group's offsets and moves the stream's plan version, so the
-- runner's next batch is the view's first live one. The catch-up then reads up to those switch
-- points as before. Until the join, a partition's switch_offset is NULL and its live_group says
-- whose offsets the catch-up chases.

ALTER TABLE cv.backfills ADD COLUMN joined_at timestamptz;
COMMENT ON COLUMN cv.backfills.joined_at IS
    'When the live runner took the view in (cv.join_backfill): NULL while the catch-up has not caught up with it.';
UPDATE cv.backfills SET joined_at = created_at;  -- earlier backfills fixed their switch points when defined

ALTER TABLE cv.backfill_partitions ALTER COLUMN switch_offset DROP NOT NULL;
ALTER TABLE cv.backfill_partitions ADD COLUMN live_group text;
COMMENT ON COLUMN cv.backfill_partitions.switch_offset IS
    'The live group''s next offset when the view joined the live runner (the catch-up stops there); NULL before.';
COMMENT ON COLUMN cv.backfill_partitions.live_group IS
    'The consumer group of the live runner reading the partition: the catch-up chases its offsets until it joins.';

-- cv.join_backfill: the live runner takes view `p_view` in from its next batch. The caller holds the
-- stream's lock exclusively (no batch in flight, so the live groups' stored offsets are exactly
-- where their next batches start) and passes each (group, topic) the stream is read by: the
-- stream's topic and those of the streams fed into it. Every partition a group has consumed gets
-- its switch point there, including one the group started reading after the view was defined (its
-- start resolved later, by the backfill's rule); a partition it no longer has offsets for (its topic
-- recreated) has nothing left to catch up. Returns false when the backfill is gone, done or joined.
CREATE FUNCTION cv.join_backfill(p_view text, p_groups text[], p_topics text[]) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    joined_stream text;
BEGIN
    UPDATE cv.backfills SET joined_at = now()
     WHERE view = p_view AND joined_at IS NULL AND done_at IS NULL
    RETURNING stream INTO joined_stream;
    IF joined_stream IS NULL THEN
        RETURN false;
    END IF;
    INSERT INTO cv.backfill_partitions AS p (view, topic, partition, switch_offset, live_group)
    SELECT p_view, o.topic, o.partition, o.next_offset, o.group_id
      FROM ops.kafka_offsets AS o
      JOIN unnest(p_groups, p_topics) AS s (group_id, topic) ON s.group_id = o.group_id AND s.topic = o.topic
     WHERE o.next_offset > 0
    ON CONFLICT (view, topic, partition) DO UPDATE SET switch_offset = EXCLUDED.switch_offset;
    UPDATE cv.backfill_partitions SET switch_offset = coalesce(start_offset, 0)
     WHERE view = p_view AND switch_offset IS NULL;
    UPDATE cv.streams SET plan_version = plan_version + 1 WHERE name = joined_stream;
    RETURN true;
END
$$;
REVOKE ALL ON FUNCTION cv.join_backfill(text, text[], text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION cv.join_backfill(text, text[], text[]) TO sv_writer;

-- The status counts, before the join, up to where the live group stands now: the total grows while
-- events flow, and the catch-up gains on it. joined_at is new, at the end.
CREATE OR REPLACE VIEW cv.backfill_status WITH (security_barrier) AS
    SELECT b.view, b.stream, b.rule, b.created_at, b.started_at, b.done_at,
           b.done_at IS NOT NULL AS complete,
           coalesce(sum(greatest(t.target - coalesce(p.start_offset, t.target), 0)), 0)::bigint AS offsets_total,
           CASE WHEN b.done_at IS NOT NULL
                THEN coalesce(sum(greatest(t.target - coalesce(p.start_offset, t.target), 0)), 0)
                ELSE coalesce(sum(least(greatest(coalesce(o.next_offset, p.start_offset) - p.start_offset, 0),
                                        greatest(t.target - p.start_offset, 0))), 0)
           END::bigint AS offsets_done,
           b.joined_at
      FROM cv.backfills AS b
      LEFT JOIN cv.backfill_partitions AS p ON p.view = b.view
      LEFT JOIN ops.kafka_offsets AS o
        ON o.group_id = b.group_id AND o.topic = p.topic AND o.partition = p.partition
      LEFT JOIN ops.kafka_offsets AS l
        ON p.switch_offset IS NULL AND l.group_id = p.live_group AND l.topic = p.topic AND l.partition = p.partition
     CROSS JOIN LATERAL (SELECT coalesce(p.switch_offset, l.next_offset, p.start_offset) AS target) AS t
     WHERE cv.may_read_view(b.view)
     GROUP BY b.view, b.stream, b.rule, b.created_at, b.started_at, b.done_at, b.joined_at;
COMMENT ON VIEW cv.backfill_status IS
    'Backfills of the views the current role may read: complete is false while the view catches up on history; '
    'joined_at is when the live runner took it in.';
