-- why: an upsert sink needs of a change only its key: the relay reads the group's row as it is when
-- it publishes (the value a compacted topic keeps anyway), and a group gone from the view is a
-- tombstone. Recording every change's before and after as JSON was most of what recording cost the
-- runner per changed group (`python -m loadgen.change_capture`), and it bounded issue 25's sink
-- figures. A view whose only readers are such sinks (cv.change_readers.images false for each, and no
-- `changes = true` of its own) now records keys only: its capture triggers project the group key
-- alone (a third trigger argument, 'keys'), and its changes carry before and after NULL.
--
-- Every other reader (a view over the view, a `changes` sink, a sink whose filter reads (old), the
-- option `changes = true`) still makes the view record both images (pipelines.cv.catalog.change_streams
-- decides, and sets cv.view_change_positions.images with the triggers).

-- A reader that needs the rows of each change (default: every reader there was before this migration).
ALTER TABLE cv.change_readers ADD COLUMN images boolean NOT NULL DEFAULT true;
-- The view's capture records before and after images (false: keys only), as its triggers were made.
ALTER TABLE cv.view_change_positions ADD COLUMN images boolean NOT NULL DEFAULT true;

-- cv.capture_view_changes: as 0043's; with a third argument 'keys', each changed group's key alone,
-- before and after NULL (the projection of TG_ARGV[1] gives a NULL row then). An UPDATE of the
-- storage keeps each group's key, so its new rows' keys are its changes.
CREATE OR REPLACE FUNCTION cv.capture_view_changes() RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    project text := TG_ARGV[1];
    changes text;
    captured text;
    mark text := chr(31) || TG_ARGV[0] || chr(31);  -- a view's name between unit separators
    keys_only boolean := TG_NARGS > 2 AND TG_ARGV[2] = 'keys';
BEGIN
    IF NOT EXISTS (SELECT FROM cv_rows) THEN
        RETURN NULL;
    END IF;
    PERFORM cv.arm_view_changes();
    changes := CASE WHEN keys_only  -- the new rows' keys (an UPDATE keeps a group's key), or the old rows'
        THEN 'SELECT n.key, NULL::jsonb AS before, NULL::jsonb AS after FROM (' || project || ') AS n'
        ELSE CASE TG_OP
        WHEN 'INSERT' THEN 'SELECT n.key, NULL::jsonb AS before, n.row AS after FROM (' || project || ') AS n'
        WHEN 'DELETE' THEN 'SELECT o.key, o.row AS before, NULL::jsonb AS after FROM (' || project || ') AS o'
        ELSE 'SELECT n.key, o.row AS before, n.row AS after FROM (' || project || ') AS n'
             || ' JOIN (WITH cv_rows AS (SELECT * FROM cv_old) ' || project || ') AS o ON o.key = n.key'
        END END;
    captured := coalesce(current_setting('cv.captured_views', true), '');
    IF strpos(captured, mark) = 0 THEN
        EXECUTE 'INSERT INTO pg_temp.cv_view_changes_pending (view, key, before, after)'
             || ' SELECT $1, c.key, c.before, c.after FROM (' || changes || ') AS c' USING TG_ARGV[0];
        PERFORM set_config('cv.captured_views', captured || mark, true);
    ELSE
        EXECUTE 'WITH c AS MATERIALIZED (' || changes || '),'
             || ' netted AS (UPDATE pg_temp.cv_view_changes_pending AS p SET after = c.after FROM c'
             || '  WHERE p.view = $1 AND p.key = c.key RETURNING p.key)'
             || ' INSERT INTO pg_temp.cv_view_changes_pending (view, key, before, after)'
             || ' SELECT $1, c.key, c.before, c.after FROM c WHERE NOT EXISTS (SELECT FROM netted WHERE netted.key = c.key)'
             USING TG_ARGV[0];
    END IF;
    RETURN NULL;
END
$$;

-- cv.record_view_changes: as 0043's; a view recording keys only (images false) keeps every captured
-- key, since its before and after are both NULL and cannot tell a no-op from a change.
CREATE OR REPLACE FUNCTION cv.record_view_changes() RETURNS jsonb
LANGUAGE plpgsql
AS $$
DECLARE
    changed record;
    stamp timestamptz := clock_timestamp();
    last_position bigint;
    deltas text[];
    with_states boolean;
    with_images boolean;
    changed_only text;
    rows_sql text;
    positions jsonb := '{}';
BEGIN
    IF to_regclass('pg_temp.cv_pending_changes') IS NOT NULL THEN  -- captured before 0043: first before kept
        PERFORM cv.arm_view_changes();
        UPDATE pg_temp.cv_view_changes_pending AS p SET before = o.before FROM pg_temp.cv_pending_changes AS o
         WHERE p.view = o.view AND p.key = o.key::jsonb;
        INSERT INTO pg_temp.cv_view_changes_pending (view, key, before, after)
            SELECT o.view, o.key::jsonb, o.before, o.after FROM pg_temp.cv_pending_changes AS o
             WHERE NOT EXISTS (SELECT FROM pg_temp.cv_view_changes_pending AS p
                                WHERE p.view = o.view AND p.key = o.key::jsonb);
        DELETE FROM pg_temp.cv_pending_changes;
    END IF;
    IF to_regclass('pg_temp.cv_view_changes_pending') IS NULL THEN
        RETURN positions;
    END IF;
    FOR changed IN
        SELECT p.view, count(*) AS n FROM pg_temp.cv_view_changes_pending AS p
          LEFT JOIN cv.view_change_positions AS v ON v.view = p.view
         WHERE p.before IS DISTINCT FROM p.after OR NOT v.images GROUP BY p.view ORDER BY p.view
    LOOP
        UPDATE cv.view_change_positions AS v SET last = v.last + changed.n
         WHERE v.view = changed.view AND v.recording
        RETURNING v.last, v.delta_columns, v.states, v.images INTO last_position, deltas, with_states, with_images;
        IF NOT FOUND THEN  -- dropped, or turned off, in this transaction
            CONTINUE;
        END IF;
        changed_only := CASE WHEN with_images THEN ' AND p.before IS DISTINCT FROM p.after' ELSE '' END;
        rows_sql := CASE WHEN with_states
            THEN '(SELECT p.key, p.before - ''_cv_states'' AS before, p.after - ''_cv_states'' AS after,'
                 || ' p.before -> ''_cv_states'' AS before_states, p.after -> ''_cv_states'' AS after_states'
                 || ' FROM pg_temp.cv_view_changes_pending AS p WHERE p.view = $1' || changed_only || ')'
            ELSE '(SELECT p.key, p.before, p.after, NULL::jsonb AS before_states, NULL::jsonb AS after_states'
                 || ' FROM pg_temp.cv_view_changes_pending AS p WHERE p.view = $1' || changed_only || ')'
            END;
        EXECUTE 'INSERT INTO cv.view_changes'
             || ' (view, position, key, before, after, delta, committed_at, before_states, after_states)'
             || ' SELECT $1, $2 + row_number() OVER (), p.key, p.before, p.after, '
             || cv.view_change_delta_sql(deltas) || ', $3, p.before_states, p.after_states'
             || ' FROM ' || rows_sql || ' AS p'
            USING changed.view, last_position - changed.n, stamp;
        positions := positions || jsonb_build_object(changed.view, last_position);
    END LOOP;
    DELETE FROM pg_temp.cv_view_changes_pending;
    PERFORM set_config('cv.changes_pending', 'off', true);  -- a later capture arms the flush again
    PERFORM set_config('cv.captured_views', '', true);
    IF positions <> '{}' THEN
        PERFORM pg_notify('streamviews_changes', cv.view_changes_payload(positions));
    END IF;
    RETURN positions;
END
$$;
