-- why: PipelineDB users write to streams with SQL: `INSERT INTO s (url, uid) VALUES (...)`,
-- `INSERT INTO s SELECT ...`, `COPY s FROM STDIN`, from psql or any driver (issue 26, item 3). Here
-- only Kafka producers could. The rows must reach the stream's views exactly as an event produced
-- to its topic does, THROUGH the topic (every consumer of the topic sees them, the stream's decoding
-- rules and dead letters apply), and exactly once: an INSERT that commits is never lost, one that
-- rolls back is never counted.
--
-- How: each stream has a relation `streams.<stream>` (a view with the stream's columns, reading
-- nothing) whose INSTEAD OF INSERT trigger appends the row, as JSON, to an outbox, cv.stream_inbox,
-- in the inserting transaction: a rollback takes it away with the rest. The inbox relay
-- (pipelines/cv/inbox.py) publishes committed rows to the stream's topic with a transactional Kafka
-- producer; the same Kafka transaction writes which rows it took to a progress topic (the snapshot
-- they were read in, and the last of them in (xid, id) order), and only then are the rows deleted
-- here. After a crash that record says exactly which rows Kafka holds (those visible in the
-- snapshot, up to the last: pg_visible_in_snapshot), so none is published twice, and none waits
-- for transactions that are still running.
-- `streams` is appended to the database's search_path, so `INSERT INTO page_views ...` names it
-- (a relation of that name in public comes first).

CREATE SCHEMA streams;
COMMENT ON SCHEMA streams IS
    'One relation per stream (streams.<stream>): INSERT INTO it or COPY into it to write the stream through its topic.';

CREATE TABLE cv.stream_inbox (
    xid         xid8 NOT NULL DEFAULT pg_current_xact_id(),
    id          bigint GENERATED ALWAYS AS IDENTITY,
    stream      text NOT NULL,
    payload     jsonb NOT NULL,
    inserted_at timestamptz NOT NULL DEFAULT statement_timestamp(),
    PRIMARY KEY (xid, id)
);
COMMENT ON TABLE cv.stream_inbox IS
    'Rows written to streams with SQL, until the inbox relay has published them to the stream''s topic.';

-- cv.stream_insert: the INSTEAD OF INSERT trigger of streams.<stream>; TG_ARGV[0] is the stream,
-- TG_ARGV[1] its timestamp_column ('' for none): left out of the event when NULL, so that it takes
-- the record's timestamp (the INSERT's time), as an event without the field does.
-- As its owner: the inserting role needs INSERT on the stream's relation, not on the inbox.
CREATE FUNCTION cv.stream_insert() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    event jsonb := to_jsonb(NEW);
BEGIN
    IF TG_ARGV[1] <> '' AND event -> TG_ARGV[1] = 'null'::jsonb THEN
        event := event - TG_ARGV[1];
    END IF;
    INSERT INTO cv.stream_inbox (stream, payload) VALUES (TG_ARGV[0], event);
    PERFORM pg_notify('streamviews_inbox', '');  -- once per transaction: equal notifications fold
    RETURN NEW;
END
$$;
REVOKE ALL ON FUNCTION cv.stream_insert() FROM PUBLIC;

GRANT USAGE ON SCHEMA streams TO sv_writer, sv_reader;
GRANT SELECT, DELETE ON cv.stream_inbox TO sv_writer;

DO $$
BEGIN
    EXECUTE format('ALTER DATABASE %I SET search_path = "$user", public, streams', current_database());
END
$$;
