-- why: nothing a continuous view computes could leave PostgreSQL except by polling it by key: no
-- alert when a count crosses a threshold, no cache told that a row changed, no rollup of one view
-- by another, no sink to Kafka (issue 25). PipelineDB gave each view an output stream, the (old),
-- (new) and (delta) of every row a batch changed. Here each view that asks for it
-- (`WITH (changes = true)`, or `ALTER CONTINUOUS VIEW v SET (changes = true)`) has a change stream:
-- cv.view_changes, one row per group row changed per committed transaction, with a position that
-- orders them per view.
--
-- How: the storage table of such a view gets three statement-level AFTER triggers with transition
-- tables (created by the catalog, pipelines/cv/views/change_capture.py). Each statement's old and
-- new rows are projected as users read them (the read view's columns) and netted per group in a
-- transaction-local table (the first before, the last after). A deferred constraint trigger,
-- armed by the first capture of a transaction, records what is left at commit: every path that
-- writes a view's storage (runner batches, isolation's re-applies and rebuilds, retention, a
-- definition's backfill) is captured and flushed, and none can forget the flush. Savepoints roll
-- the netted rows back with the storage rows they describe.
--
-- Positions: cv.view_change_positions holds each view's last position, advanced by the commit's
-- own UPDATE, views in name order (the order every writer locks views in). The row stays locked
-- until the transaction ends, so two runners writing one view commit their positions in order: a
-- reader following `position > p` never meets a lower position committed later. One
-- `NOTIFY streamviews_changes` per such commit names the views and their last position.

CREATE TABLE cv.view_change_positions (
    view          text PRIMARY KEY REFERENCES cv.views (name) ON DELETE CASCADE,
    last          bigint NOT NULL DEFAULT 0,
    recording     boolean NOT NULL DEFAULT true,
    delta_columns text[] NOT NULL DEFAULT '{}'
);
COMMENT ON TABLE cv.view_change_positions IS
    'Views with a change stream: the last position recorded, whether changes are recorded now, the outputs with a delta.';
COMMENT ON COLUMN cv.view_change_positions.delta_columns IS
    'Output columns that are a count or a sum of numbers: their change is the delta (PipelineDB''s (delta)).';

-- No foreign key to cv.view_change_positions: its check cost a third of recording a change, and a
-- change is only ever recorded under its view's position row (cv.record_view_changes); the
-- trigger below deletes a view's changes with that row.
CREATE TABLE cv.view_changes (
    view         text NOT NULL,
    position     bigint NOT NULL,
    key          jsonb NOT NULL,
    before       jsonb,
    after        jsonb,
    delta        jsonb,
    committed_at timestamptz NOT NULL,
    PRIMARY KEY (view, position)
);
COMMENT ON TABLE cv.view_changes IS
    'Each view''s change stream: per committed transaction, one row per group it changed (before NULL: new; after NULL: gone).';
-- cv.view_changes_dropped: a view's changes go with its position row (the view dropped: ON DELETE
-- CASCADE from cv.views).
CREATE FUNCTION cv.view_changes_dropped() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    DELETE FROM cv.view_changes WHERE view = OLD.view;
    RETURN NULL;
END
$$;

CREATE TRIGGER changes_dropped AFTER DELETE ON cv.view_change_positions
    FOR EACH ROW EXECUTE FUNCTION cv.view_changes_dropped();

-- Retention deletes by time; rows arrive in time order, so a BRIN index costs next to nothing.
CREATE INDEX view_changes_committed_at ON cv.view_changes USING brin (committed_at);

-- cv.may_read_view: true when the current role may read view `schema.name` (USAGE on its schema,
-- SELECT on it). By OID, so that a schema the role may not use is a false, not an error.
CREATE FUNCTION cv.may_read_view(p_view text) RETURNS boolean
LANGUAGE sql STABLE
AS $$
    SELECT EXISTS (
        SELECT FROM pg_catalog.pg_class AS r JOIN pg_catalog.pg_namespace AS n ON n.oid = r.relnamespace
         WHERE n.nspname = split_part(p_view, '.', 1) AND r.relname = split_part(p_view, '.', 2)
           AND has_schema_privilege(n.oid, 'USAGE') AND has_table_privilege(r.oid, 'SELECT'))
$$;

-- What a reader may read: the changes of the views it may read (read access to a view's changes
-- follows read access to the view). The condition runs as the caller; the view reads as its owner.
CREATE VIEW cv.view_changes_readable WITH (security_barrier) AS
    SELECT c.* FROM cv.view_changes AS c WHERE cv.may_read_view(c.view);
COMMENT ON VIEW cv.view_changes_readable IS
    'cv.view_changes of the views the current role may read (streamviews subscribe reads this).';

-- cv.view_change_delta_sql: the expression of a change's delta over the netted row `p`: after minus
-- before for each output that has one (count, sum), a missing side (a new or a deleted group) and a
-- NULL sum counting as 0; NULL when no output has one. Built once per view and flush, so the delta
-- costs a few operators per change, not a function call.
CREATE FUNCTION cv.view_change_delta_sql(p_columns text[]) RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
    SELECT coalesce(string_agg(format(
        'jsonb_build_object(%L, coalesce((p.after ->> %L)::numeric, 0) - coalesce((p.before ->> %L)::numeric, 0))',
        c, c, c), ' || '), 'NULL::jsonb')
      FROM unnest(p_columns) AS c
$$;

-- cv.view_changes_payload: the NOTIFY payload {"views": {"schema.view": last_position, ...}}; when
-- that would pass NOTIFY's 8000-byte limit, the names alone {"views": ["schema.view", ...]}, and
-- {"views": null} when even they would (read cv.view_change_positions then).
CREATE FUNCTION cv.view_changes_payload(p_positions jsonb) RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE WHEN octet_length(full_text) < 8000 THEN full_text
                WHEN octet_length(names) < 8000 THEN names
                ELSE '{"views": null}' END
      FROM (SELECT jsonb_build_object('views', p_positions)::text AS full_text,
                   jsonb_build_object('views', (SELECT jsonb_agg(k ORDER BY k) FROM jsonb_object_keys(p_positions) AS k))::text
                       AS names) AS t
$$;

-- cv.record_view_changes: the transaction's netted changes into cv.view_changes. Views in name
-- order, each view's position row advanced by this transaction (and locked until it ends); within
-- a view, positions follow the group keys. Changes whose before equals their after are dropped.
-- Returns {"schema.view": last_position} of the views it recorded, and notifies them. Called at
-- commit by the deferred trigger below; a test may call it through SET CONSTRAINTS ALL IMMEDIATE.
CREATE FUNCTION cv.record_view_changes() RETURNS jsonb
LANGUAGE plpgsql
AS $$
DECLARE
    changed record;
    stamp timestamptz := clock_timestamp();
    last_position bigint;
    deltas text[];
    positions jsonb := '{}';
BEGIN
    IF to_regclass('pg_temp.cv_pending_changes') IS NULL THEN
        RETURN positions;
    END IF;
    FOR changed IN
        SELECT p.view, count(*) AS n FROM pg_temp.cv_pending_changes AS p
         WHERE p.before IS DISTINCT FROM p.after GROUP BY p.view ORDER BY p.view
    LOOP
        UPDATE cv.view_change_positions AS v SET last = v.last + changed.n
         WHERE v.view = changed.view AND v.recording
        RETURNING v.last, v.delta_columns INTO last_position, deltas;
        IF NOT FOUND THEN  -- dropped, or turned off, in this transaction
            CONTINUE;
        END IF;
        EXECUTE 'INSERT INTO cv.view_changes (view, position, key, before, after, delta, committed_at)'
             || ' SELECT $1, $2 + row_number() OVER (ORDER BY p.key), p.key::jsonb, p.before, p.after, '
             || cv.view_change_delta_sql(deltas) || ', $3'
             || ' FROM pg_temp.cv_pending_changes AS p WHERE p.view = $1 AND p.before IS DISTINCT FROM p.after'
            USING changed.view, last_position - changed.n, stamp;
        positions := positions || jsonb_build_object(changed.view, last_position);
    END LOOP;
    DELETE FROM pg_temp.cv_pending_changes;
    PERFORM set_config('cv.changes_pending', 'off', true);  -- a later capture arms the flush again
    IF positions <> '{}' THEN
        PERFORM pg_notify('streamviews_changes', cv.view_changes_payload(positions));
    END IF;
    RETURN positions;
END
$$;

-- cv.flush_view_changes: the deferred constraint trigger that runs cv.record_view_changes at commit.
CREATE FUNCTION cv.flush_view_changes() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM cv.record_view_changes();
    RETURN NULL;
END
$$;

-- cv.arm_view_changes: once per transaction (and again after a flush), make sure the session's
-- netting table exists and arm the flush at commit: a row in pg_temp.cv_pending_flush, whose
-- deferred constraint trigger runs cv.flush_view_changes. Both roll back with a savepoint, and so
-- does the transaction-local setting that says it is armed.
CREATE FUNCTION cv.arm_view_changes() RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    IF current_setting('cv.changes_pending', true) = 'on' THEN
        RETURN;
    END IF;
    IF to_regclass('pg_temp.cv_pending_flush') IS NULL THEN
        CREATE TEMP TABLE cv_pending_changes (
            view   text COLLATE "C" NOT NULL,
            key    text COLLATE "C" NOT NULL,  -- the group key's JSON text: compared as bytes, fast
            before jsonb,
            after  jsonb,
            PRIMARY KEY (view, key)
        ) ON COMMIT DELETE ROWS;
        CREATE TEMP TABLE cv_pending_flush (armed boolean) ON COMMIT DELETE ROWS;
        CREATE CONSTRAINT TRIGGER flush_view_changes AFTER INSERT ON pg_temp.cv_pending_flush
            DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION cv.flush_view_changes();
    END IF;
    INSERT INTO pg_temp.cv_pending_flush VALUES (true);
    PERFORM set_config('cv.changes_pending', 'on', true);
END
$$;

-- cv.capture_view_changes: the storage tables' statement-level AFTER trigger. TG_ARGV[0] is the
-- view's name, TG_ARGV[1] a SELECT of (key, row) over the transition table `cv_rows AS s`: the
-- group key and the row as the read view shows it. INSERT and DELETE triggers name their new or old
-- rows cv_rows; the UPDATE trigger names its new rows so and its old rows cv_old (a CTE of that
-- name shadows the transition table to project them). Each group's first before and last after are
-- kept in pg_temp.cv_pending_changes.
CREATE FUNCTION cv.capture_view_changes() RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    project text := TG_ARGV[1];
BEGIN
    IF NOT EXISTS (SELECT FROM cv_rows) THEN
        RETURN NULL;
    END IF;
    PERFORM cv.arm_view_changes();
    IF TG_OP = 'INSERT' THEN
        EXECUTE 'INSERT INTO pg_temp.cv_pending_changes AS p (view, key, before, after)'
             || ' SELECT $1, n.key::text, NULL, n.row FROM (' || project || ') AS n'
             || ' ON CONFLICT (view, key) DO UPDATE SET after = excluded.after' USING TG_ARGV[0];
    ELSIF TG_OP = 'DELETE' THEN
        EXECUTE 'INSERT INTO pg_temp.cv_pending_changes AS p (view, key, before, after)'
             || ' SELECT $1, o.key::text, o.row, NULL FROM (' || project || ') AS o'
             || ' ON CONFLICT (view, key) DO UPDATE SET after = NULL' USING TG_ARGV[0];
    ELSE
        EXECUTE 'INSERT INTO pg_temp.cv_pending_changes AS p (view, key, before, after)'
             || ' SELECT $1, n.key::text, o.row, n.row FROM (' || project || ') AS n'
             || ' JOIN (WITH cv_rows AS (SELECT * FROM cv_old) ' || project || ') AS o ON o.key = n.key'
             || ' ON CONFLICT (view, key) DO UPDATE SET after = excluded.after' USING TG_ARGV[0];
    END IF;
    RETURN NULL;
END
$$;

-- cv.prune_view_changes: retention, run by the runner's housekeeping: delete changes committed more
-- than p_older_than ago; returns how many. The hook for sinks: once sinks relay change streams,
-- a change not yet relayed must be kept whatever its age: bound the deletion here by each view's
-- lowest position its sinks have not relayed.
CREATE FUNCTION cv.prune_view_changes(p_older_than interval) RETURNS bigint
LANGUAGE sql
AS $$
    WITH gone AS (DELETE FROM cv.view_changes WHERE committed_at < now() - p_older_than RETURNING 1)
    SELECT count(*) FROM gone
$$;

GRANT USAGE ON SCHEMA cv TO sv_reader;
GRANT SELECT ON cv.view_changes_readable, cv.view_change_positions TO sv_reader, sv_writer;
GRANT SELECT, INSERT, DELETE ON cv.view_changes TO sv_writer;
GRANT UPDATE ON cv.view_change_positions TO sv_writer;
REVOKE ALL ON FUNCTION cv.record_view_changes(), cv.arm_view_changes(), cv.prune_view_changes(interval),
    cv.flush_view_changes(), cv.capture_view_changes() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION cv.record_view_changes(), cv.arm_view_changes(), cv.prune_view_changes(interval),
    cv.flush_view_changes(), cv.capture_view_changes() TO sv_writer;
