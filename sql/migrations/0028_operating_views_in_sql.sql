-- why: PipelineDB users operate their views from SQL: statistics per view and per stream
-- (pipeline_query_stats / pipeline_stream_stats), `truncate_continuous_view`, and `activate` /
-- `deactivate` (issue 26, item 4). Here they had to read logs, metrics or `streamviews status`.
-- This migration gives the same in SQL, in a `pipelinedb` schema under PipelineDB's names:
--   * statistics written by the stream runner in each batch's own transaction (so they are exact:
--     a rolled-back batch counts nothing), one row per (view or stream, runner session) so that
--     writers (runners, their threads) never wait on each other for a statistics row;
--   * deactivate/activate of a STREAM pauses and resumes its consumption: its Kafka position stays
--     in ops.kafka_offsets, so nothing is lost; of a VIEW, PipelineDB's meaning: the view is left
--     out (through the quarantine of 0015, reason 'deactivated', never retried by itself) and
--     activation resumes it: rebuilt from a keyed stream's state, or with the events it did not see
--     recorded as a gap (cv.view_gaps), as PipelineDB's deactivated views did not see them;
--   * truncate_continuous_view empties a view over an append-only stream under its stream's lock.

CREATE TABLE cv.paused_streams (
    stream    text PRIMARY KEY REFERENCES cv.streams (name) ON DELETE CASCADE,
    paused_at timestamptz NOT NULL DEFAULT now(),
    paused_by text NOT NULL DEFAULT current_user
);
COMMENT ON TABLE cv.paused_streams IS
    'Streams deactivated: no runner consumes their topics; their positions stay in ops.kafka_offsets.';

CREATE TABLE cv.view_stats (
    view         text NOT NULL REFERENCES cv.views (name) ON DELETE CASCADE,
    runner       text NOT NULL,
    executions   bigint NOT NULL DEFAULT 0,
    input_rows   bigint NOT NULL DEFAULT 0,
    errors       bigint NOT NULL DEFAULT 0,
    exec_ms      double precision NOT NULL DEFAULT 0,
    last_update  timestamptz,
    PRIMARY KEY (view, runner)
);
COMMENT ON TABLE cv.view_stats IS
    'Per view and runner session (host:pid:backend pid; '''' for failures isolation recorded): batches applied, rows read, time.';

CREATE TABLE cv.stream_stats (
    stream        text NOT NULL REFERENCES cv.streams (name) ON DELETE CASCADE,
    runner        text NOT NULL,
    input_batches bigint NOT NULL DEFAULT 0,
    input_rows    bigint NOT NULL DEFAULT 0,
    last_update   timestamptz,
    PRIMARY KEY (stream, runner)
);
COMMENT ON TABLE cv.stream_stats IS
    'Per stream and runner session: batches and changes applied (after decoding; dead letters are in ops).';

GRANT SELECT ON cv.paused_streams TO sv_writer, sv_reader;
GRANT SELECT, INSERT, UPDATE ON cv.view_stats, cv.stream_stats TO sv_writer;
GRANT SELECT ON cv.view_stats, cv.stream_stats TO sv_reader;

-- A failure isolation records counts as an error of the view (0015's functions, now also counting).
CREATE OR REPLACE FUNCTION cv.count_view_error(p_view text) RETURNS void
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    INSERT INTO cv.view_stats (view, runner, errors) SELECT p_view, '', 1 WHERE EXISTS (SELECT FROM cv.views WHERE name = p_view)
    ON CONFLICT (view, runner) DO UPDATE SET errors = cv.view_stats.errors + 1
$$;

CREATE OR REPLACE FUNCTION cv.quarantine_view(
    p_view text, p_sqlstate text, p_reason text, p_missed_from jsonb, p_retry_after interval
) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    INSERT INTO cv.view_failures (view, stream, sqlstate, reason, missed_from, retry_at)
    SELECT v.name, v.stream, p_sqlstate, left(p_reason, 1000), p_missed_from, now() + p_retry_after
      FROM cv.views AS v WHERE v.name = p_view
    ON CONFLICT (view) DO NOTHING;
    IF FOUND THEN
        PERFORM cv.count_view_error(p_view);
        RETURN true;
    END IF;
    RETURN false;
END
$$;

CREATE OR REPLACE FUNCTION cv.retry_view_later(p_view text, p_sqlstate text, p_reason text, p_retry_after interval)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE cv.view_failures
       SET sqlstate = p_sqlstate, reason = left(p_reason, 1000), attempts = attempts + 1,
           retry_at = now() + p_retry_after
     WHERE view = p_view;
    PERFORM cv.count_view_error(p_view);
END
$$;

-- cv.lock_stream_exclusively: what a definition does before it changes a stream's views (the
-- catalog's step 3, pipelines/cv/catalog/locks.py): wait for the batch in flight, hold the next.
-- The key is the catalog's: (0x4356, hashtext(stream)).
CREATE FUNCTION cv.lock_stream_exclusively(p_stream text) RETURNS void
LANGUAGE sql VOLATILE
AS $$
    SELECT pg_advisory_xact_lock(17238, hashtext(p_stream))
$$;

-- cv.stream_positions: where the runners stand in a stream's topics (its own and those feeding it),
-- {"topic": {"partition": next_offset}}, as isolation records a quarantined view's missed events.
CREATE FUNCTION cv.stream_positions(p_stream text) RETURNS jsonb
LANGUAGE sql STABLE
AS $$
    SELECT coalesce(jsonb_object_agg(topic, partitions), '{}')
      FROM (SELECT o.topic, jsonb_object_agg(o.partition::text, o.next_offset) AS partitions
              FROM ops.kafka_offsets AS o
             WHERE o.topic IN (SELECT s.topic FROM cv.streams AS s WHERE s.name = p_stream
                                OR s.definition ~* ('\minto\s*=\s*''' || p_stream || ''''))
             GROUP BY o.topic) AS t
$$;

-- cv.deactivate: a stream stops being consumed (runners drop its topics at their next catalog check,
-- within PIPELINE_CATALOG_POLL_S); a view stops being maintained. Returns what it did, in a line.
CREATE FUNCTION cv.deactivate(p_name text) RETURNS text
LANGUAGE plpgsql VOLATILE
SET lock_timeout = '10s'
AS $$
DECLARE
    v_view text := CASE WHEN p_name LIKE '%.%' THEN p_name ELSE 'public.' || p_name END;
    v_stream text;
BEGIN
    IF EXISTS (SELECT FROM cv.streams WHERE name = p_name) THEN
        INSERT INTO cv.paused_streams (stream) VALUES (p_name) ON CONFLICT DO NOTHING;
        IF NOT FOUND THEN
            RETURN format('stream %s is already deactivated', p_name);
        END IF;
        UPDATE cv.catalog SET version = version + 1;
        RETURN format('stream %s deactivated: its topic is no longer read; activate it to go on from where it stopped', p_name);
    END IF;
    SELECT stream INTO v_stream FROM cv.views WHERE name = v_view;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no stream or continuous view named %', p_name USING ERRCODE = 'undefined_object';
    END IF;
    PERFORM cv.lock_stream_exclusively(v_stream);
    INSERT INTO cv.view_failures (view, stream, sqlstate, reason, missed_from, retry_at)
    VALUES (v_view, v_stream, NULL, 'deactivated', cv.stream_positions(v_stream), 'infinity')
    ON CONFLICT (view) DO UPDATE SET reason = 'deactivated', retry_at = 'infinity';
    RETURN format('view %s deactivated: events of %s are not applied to it until it is activated', v_view, v_stream);
END
$$;
COMMENT ON FUNCTION cv.deactivate(text) IS
    'Pause a stream (its position is kept) or leave a view out (it misses the events until activated).';

-- cv.activate: a stream is consumed again from its stored position; a deactivated (or quarantined)
-- view is resumed by the runner's next sweep (PIPELINE_VIEW_RETRY_S at most), as isolation resumes
-- a quarantined view: rebuilt from a keyed stream's state, or with a recorded gap.
CREATE FUNCTION cv.activate(p_name text) RETURNS text
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_view text := CASE WHEN p_name LIKE '%.%' THEN p_name ELSE 'public.' || p_name END;
BEGIN
    IF EXISTS (SELECT FROM cv.streams WHERE name = p_name) THEN
        DELETE FROM cv.paused_streams WHERE stream = p_name;
        IF NOT FOUND THEN
            RETURN format('stream %s is already active', p_name);
        END IF;
        UPDATE cv.catalog SET version = version + 1;
        RETURN format('stream %s activated: its topic is read again from where it stopped', p_name);
    END IF;
    IF NOT EXISTS (SELECT FROM cv.views WHERE name = v_view) THEN
        RAISE EXCEPTION 'no stream or continuous view named %', p_name USING ERRCODE = 'undefined_object';
    END IF;
    UPDATE cv.view_failures SET retry_at = now() WHERE view = v_view;
    IF NOT FOUND THEN
        RETURN format('view %s is already active', v_view);
    END IF;
    RETURN format('view %s activated: the stream runner resumes it at its next retry sweep', v_view);
END
$$;

-- cv.truncate_continuous_view: every row of a view over an append-only stream deleted (its
-- reference counts and value counts too), under its stream's lock, so no batch is half in. Deleted
-- rows are recorded in its change stream like any other (its sinks publish tombstones). A view over
-- a keyed stream is refused: its rows are the stream's state aggregated, and later deletes of keys
-- would take away what is no longer there.
CREATE FUNCTION cv.truncate_continuous_view(p_name text) RETURNS text
LANGUAGE plpgsql VOLATILE
SET lock_timeout = '10s'
AS $$
DECLARE
    v_view text := CASE WHEN p_name LIKE '%.%' THEN p_name ELSE 'public.' || p_name END;
    v_stream text;
    v_table text;
    v_storage text;
    v_rows bigint := 0;
    v_n bigint;
BEGIN
    SELECT stream INTO v_stream FROM cv.views WHERE name = v_view;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no continuous view named %', v_view USING ERRCODE = 'undefined_object';
    END IF;
    IF EXISTS (SELECT FROM cv.streams WHERE name = v_stream AND to_regclass(format('cv.%I', 'state_' || v_stream)) IS NOT NULL) THEN
        RAISE EXCEPTION 'view % reads keyed stream %: its rows are the stream''s current state; delete the keys from the stream instead', v_view, v_stream
            USING ERRCODE = 'feature_not_supported';
    END IF;
    PERFORM cv.lock_stream_exclusively(v_stream);
    v_storage := replace(v_view, '.', '__');  -- the storage table, pipelines.cv.model.storage_name
    FOR v_table IN
        SELECT relname FROM pg_class
         WHERE relnamespace = 'cv'::regnamespace AND relkind = 'r' AND left(relname, length(v_storage)) = v_storage
           AND substr(relname, length(v_storage) + 1) ~ '^(__refs|__m[0-9]+)?$'
         ORDER BY relname
    LOOP
        EXECUTE format('DELETE FROM cv.%I', v_table);
        GET DIAGNOSTICS v_n = ROW_COUNT;
        IF v_table = v_storage THEN
            v_rows := v_n;
        END IF;
    END LOOP;
    RETURN format('view %s truncated: %s rows deleted', v_view, v_rows);
END
$$;

REVOKE ALL ON FUNCTION cv.deactivate(text), cv.activate(text), cv.truncate_continuous_view(text),
    cv.lock_stream_exclusively(text), cv.count_view_error(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION cv.count_view_error(text) TO sv_writer;

-- PipelineDB's names, for definitions and scripts written for it.
CREATE SCHEMA pipelinedb;
COMMENT ON SCHEMA pipelinedb IS 'PipelineDB 1.0''s operating functions and statistics views, over streamviews'' own (cv.*).';

CREATE FUNCTION pipelinedb.activate(name text) RETURNS text LANGUAGE sql VOLATILE AS $$ SELECT cv.activate(name) $$;
CREATE FUNCTION pipelinedb.deactivate(name text) RETURNS text LANGUAGE sql VOLATILE AS $$ SELECT cv.deactivate(name) $$;
CREATE FUNCTION pipelinedb.truncate_continuous_view(name text) RETURNS text LANGUAGE sql VOLATILE
AS $$ SELECT cv.truncate_continuous_view(name) $$;
REVOKE ALL ON FUNCTION pipelinedb.activate(text), pipelinedb.deactivate(text),
    pipelinedb.truncate_continuous_view(text) FROM PUBLIC;

-- Per view, summed over runner processes; a role sees the views it may read (as for changes, 0020). `type` is PipelineDB's process kind; here one kind does it all.
CREATE VIEW pipelinedb.query_stats WITH (security_barrier) AS
    SELECT v.name, 'view'::text AS type,
           coalesce(sum(s.input_rows), 0)::bigint AS input_rows,
           coalesce(sum(s.executions), 0)::bigint AS executions,
           coalesce(sum(s.errors), 0)::bigint AS errors,
           coalesce(sum(s.exec_ms), 0)::bigint AS exec_ms,
           max(s.last_update) AS last_update,
           f.reason AS stopped_because
      FROM cv.views AS v
      LEFT JOIN cv.view_stats AS s ON s.view = v.name
      LEFT JOIN cv.view_failures AS f ON f.view = v.name
     WHERE cv.may_read_view(v.name)
     GROUP BY v.name, f.reason;
COMMENT ON VIEW pipelinedb.query_stats IS
    'Per continuous view: rows read, batches applied, failures, time spent, last update, why it is not maintained (if so).';

CREATE VIEW pipelinedb.stream_stats AS
    SELECT s.name,
           coalesce(sum(t.input_rows), 0)::bigint AS input_rows,
           coalesce(sum(t.input_batches), 0)::bigint AS input_batches,
           max(t.last_update) AS last_update,
           (p.stream IS NOT NULL) AS deactivated
      FROM cv.streams AS s
      LEFT JOIN cv.stream_stats AS t ON t.stream = s.name
      LEFT JOIN cv.paused_streams AS p ON p.stream = s.name
     GROUP BY s.name, p.stream;
COMMENT ON VIEW pipelinedb.stream_stats IS 'Per stream: changes and batches applied, last update, deactivated or not.';

-- view_stats: the name issue 26 users look for, the same rows as query_stats.
CREATE VIEW pipelinedb.view_stats AS SELECT * FROM pipelinedb.query_stats;

GRANT USAGE ON SCHEMA pipelinedb TO sv_reader, sv_writer;
GRANT SELECT ON pipelinedb.query_stats, pipelinedb.stream_stats, pipelinedb.view_stats TO sv_reader, sv_writer;
