-- why: a view defined (or rebuilt) over an append-only stream should see the events its topic still
-- holds, not start from now (issue 27, item 1). The catalog records, under the stream's exclusive
-- lock, where the live runner stands in each partition (the switch point): the live runner
-- maintains the view from there on, and a catch-up (pipelines/cv/backfill.py) reads the retained
-- history before it, [start, switch), into this view only. The catch-up's positions are a consumer
-- group of their own in ops.kafka_offsets (`group_id` below), committed with its view updates; the
-- backfill is marked done in the transaction of its last batch. Applications read
-- cv.backfill_status to know whether a view is complete yet.

CREATE TABLE cv.backfills (
    view       text PRIMARY KEY REFERENCES cv.views (name) ON DELETE CASCADE,
    id         bigserial UNIQUE,
    stream     text NOT NULL,
    group_id   text NOT NULL UNIQUE,
    rule       text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    started_at timestamptz,
    done_at    timestamptz
);
COMMENT ON TABLE cv.backfills IS
    'A view catching up on its stream''s retained history: from `rule` (earliest, or a timestamptz) up to the '
    'switch points of cv.backfill_partitions; its positions are ops.kafka_offsets rows of `group_id`. Done: done_at.';

CREATE TABLE cv.backfill_partitions (
    view          text NOT NULL REFERENCES cv.backfills (view) ON DELETE CASCADE,
    topic         text NOT NULL,
    partition     integer NOT NULL,
    switch_offset bigint NOT NULL,
    start_offset  bigint,
    PRIMARY KEY (view, topic, partition)
);
COMMENT ON TABLE cv.backfill_partitions IS
    'Per partition: the live group''s next offset when the view was defined (the catch-up stops there) and where '
    'the catch-up started (NULL: not resolved yet).';

GRANT SELECT, UPDATE ON cv.backfills, cv.backfill_partitions TO sv_writer;

-- cv.forget_backfill_offsets: delete the ops.kafka_offsets rows of catch-ups that no longer exist
-- (their view dropped or rebuilt); returns how many. The catch-up calls it between backfills: the
-- writer role may not delete offsets itself, and a drop must not wait for a catch-up's row locks.
CREATE FUNCTION cv.forget_backfill_offsets() RETURNS integer
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
    WITH gone AS (
        DELETE FROM ops.kafka_offsets AS o
         WHERE o.group_id LIKE 'streamviews-backfill/%'
           AND NOT EXISTS (SELECT FROM cv.backfills AS b WHERE b.group_id = o.group_id)
        RETURNING 1)
    SELECT count(*)::integer FROM gone
$$;
REVOKE ALL ON FUNCTION cv.forget_backfill_offsets() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION cv.forget_backfill_offsets() TO sv_writer;

-- What an application reads: each backfill of a view it may read, its progress in offsets, and
-- whether the view is complete. The condition runs as the caller; the view reads as its owner.
CREATE VIEW cv.backfill_status WITH (security_barrier) AS
    SELECT b.view, b.stream, b.rule, b.created_at, b.started_at, b.done_at,
           b.done_at IS NOT NULL AS complete,
           coalesce(sum(greatest(p.switch_offset - coalesce(p.start_offset, p.switch_offset), 0)), 0)::bigint
               AS offsets_total,
           CASE WHEN b.done_at IS NOT NULL
                THEN coalesce(sum(greatest(p.switch_offset - coalesce(p.start_offset, p.switch_offset), 0)), 0)
                ELSE coalesce(sum(least(greatest(coalesce(o.next_offset, p.start_offset) - p.start_offset, 0),
                                        greatest(p.switch_offset - p.start_offset, 0))), 0)
           END::bigint AS offsets_done
      FROM cv.backfills AS b
      LEFT JOIN cv.backfill_partitions AS p ON p.view = b.view
      LEFT JOIN ops.kafka_offsets AS o
        ON o.group_id = b.group_id AND o.topic = p.topic AND o.partition = p.partition
     WHERE cv.may_read_view(b.view)
     GROUP BY b.view, b.stream, b.rule, b.created_at, b.started_at, b.done_at;
COMMENT ON VIEW cv.backfill_status IS
    'Backfills of the views the current role may read: complete is false while the view catches up on history.';
GRANT SELECT ON cv.backfill_status TO sv_reader, sv_writer;
