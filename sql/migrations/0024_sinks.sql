-- why: a view's changes could be read only from PostgreSQL (streamviews subscribe); nothing a view
-- computes reached Kafka, so no topic could hold the current view for other services, and no alert
-- could be declared (issue 25, item 2). A sink (`CREATE SINK name FROM schema.view WITH (topic,
-- format, where, ...)`) is a reader of the view's change stream (migration 0023, reader
-- 'sink <name>') that the relay process (pipelines/cv/relay/, service `sinks`) publishes to a topic.
-- The relay connects as sv_writer: it reads cv.view_changes and the view's rows, and advances its
-- own reader position after Kafka acknowledged; no role needs REPLICATION for it.

CREATE TABLE cv.sinks (
    name          text PRIMARY KEY,
    -- The change stream it reads (a view's today; any source of cv.view_change_positions later).
    -- No cascade: the reader row (0023) already refuses a DROP of the view, naming the sink.
    view          text NOT NULL REFERENCES cv.view_change_positions (view),
    topic         text NOT NULL,
    format        text NOT NULL CHECK (format IN ('upsert', 'changes')),
    envelope      text CHECK (envelope IN ('debezium')),
    where_sql     text,
    partitions    integer CHECK (partitions > 0),
    definition    text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    snapshot_done boolean NOT NULL DEFAULT false,
    failed_at     timestamptz,
    error         text,
    CHECK (envelope IS NULL OR format = 'changes')
);
COMMENT ON TABLE cv.sinks IS
    'Sinks: a view''s change stream published to a Kafka topic by the relay (service sinks); its position is its cv.change_readers row.';
COMMENT ON COLUMN cv.sinks.where_sql IS
    'The filter over (old) and (new), the change''s before and after as rows of the view, as the relay runs it.';
COMMENT ON COLUMN cv.sinks.snapshot_done IS
    'False until the relay published the view''s rows as they were at one position and moved the reader there.';
COMMENT ON COLUMN cv.sinks.failed_at IS
    'When the relay last failed to read this sink''s changes (its filter raised, say): retried later; NULL when it runs.';

-- The relay reads its sinks and records its snapshot and failures; readers see the sinks in status.
GRANT SELECT ON cv.sinks TO sv_writer, sv_reader;
GRANT UPDATE (snapshot_done, failed_at, error) ON cv.sinks TO sv_writer;
