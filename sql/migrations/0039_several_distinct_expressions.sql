-- why: a view may keep DISTINCT aggregates over several expressions, each with reference counts of
-- its own: `cv.<schema>__<view>__refs` for the first (as before), `__refs2`, `__refs3`, ... for the
-- others (pipelines.cv.views.compiler.refs_table). The functions that find a view's tables by name
-- knew only `__refs`: truncate_continuous_view left the others' counts (a value seen before the
-- truncate would not count again), and a replay neither dropped nor swapped them. Each is redefined
-- as it was, finding `__refs[0-9]*`; nothing else changes (their grants stay).

-- cv.truncate_continuous_view: every row of a view over an append-only stream deleted (its storage,
-- every reference-count table and min/max value counts), as migration 0028 defined it.
CREATE OR REPLACE FUNCTION cv.truncate_continuous_view(p_name text) RETURNS text
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
           AND substr(relname, length(v_storage) + 1) ~ '^(__refs[0-9]*|__m[0-9]+)?$'
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

-- cv.drop_replay_shadow: drop a shadow view whole (read view, tables, catalog row), as migration 0032
-- defined it.
CREATE OR REPLACE FUNCTION cv.drop_replay_shadow(p_shadow text) RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_table text;
BEGIN
    EXECUTE format('DROP VIEW IF EXISTS %I.%I', split_part(p_shadow, '.', 1), split_part(p_shadow, '.', 2));
    FOR v_table IN
        SELECT relname FROM pg_class
         WHERE relnamespace = 'cv'::regnamespace AND relkind = 'r'
           AND relname ~ ('^' || replace(p_shadow, '.', '__') || '(__refs[0-9]*|__m[0-9]+)?$')
    LOOP
        EXECUTE format('DROP TABLE cv.%I', v_table);
    END LOOP;
    DELETE FROM cv.views WHERE name = p_shadow;
END
$$;

-- cv.swap_replay: put a finished shadow's tables' rows in the view's, as migration 0032 defined it.
CREATE OR REPLACE FUNCTION cv.swap_replay(p_view text) RETURNS text
LANGUAGE plpgsql
AS $$
DECLARE
    v_replay cv.replays;
    v_stream text;
    v_table text;
    v_columns text;
    v_storage text := replace(p_view, '.', '__');
    v_shadow_storage text;
    v_groups bigint;
BEGIN
    SELECT r.* INTO v_replay FROM cv.replays AS r JOIN cv.backfills AS b ON b.view = r.shadow
     WHERE r.view = p_view AND r.ended_at IS NULL AND b.done_at IS NOT NULL
       AND NOT EXISTS (SELECT FROM cv.view_failures AS f WHERE f.view = r.shadow);
    IF v_replay.id IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT stream INTO v_stream FROM cv.views WHERE name = p_view;
    PERFORM pg_advisory_xact_lock(17238, hashtext(v_stream));  -- the stream's lock, (0x4356, hashtext(stream))
    IF NOT EXISTS (SELECT FROM cv.replays WHERE id = v_replay.id AND ended_at IS NULL)
       OR EXISTS (SELECT FROM cv.view_failures WHERE view = v_replay.shadow) THEN
        RETURN NULL;  -- ended meanwhile (cancelled, or swapped by another runner), or just quarantined
    END IF;
    IF EXISTS (SELECT FROM cv.view_gaps WHERE view = v_replay.shadow) THEN
        PERFORM cv.replay_ended_by_runner(p_view, 'failed: it missed live events while quarantined; replay again', NULL);
        RETURN 'failed';
    END IF;
    v_shadow_storage := replace(v_replay.shadow, '.', '__');
    FOR v_table IN
        SELECT relname FROM pg_class
         WHERE relnamespace = 'cv'::regnamespace AND relkind = 'r'
           AND relname ~ ('^' || v_storage || '(__refs[0-9]*|__m[0-9]+)?$')
         ORDER BY relname
    LOOP
        SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum) INTO v_columns
          FROM pg_attribute AS a
         WHERE a.attrelid = format('cv.%I', v_table)::regclass AND a.attnum > 0 AND NOT a.attisdropped
           AND a.attgenerated = ''
           AND EXISTS (SELECT FROM pg_attribute AS s
                        WHERE s.attrelid = format('cv.%I', v_shadow_storage || substr(v_table, length(v_storage) + 1))::regclass
                          AND s.attname = a.attname AND NOT s.attisdropped);
        EXECUTE format('DELETE FROM cv.%I', v_table);
        EXECUTE format('INSERT INTO cv.%I (%s) SELECT %s FROM cv.%I', v_table, v_columns, v_columns,
                       v_shadow_storage || substr(v_table, length(v_storage) + 1));
    END LOOP;
    EXECUTE format('SELECT count(*) FROM cv.%I', v_storage) INTO v_groups;
    PERFORM cv.replay_ended_by_runner(p_view, 'swapped', v_groups);
    RETURN 'swapped';
END
$$;
