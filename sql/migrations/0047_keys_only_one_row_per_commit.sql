-- why: recording keys only (0046) halved what an upsert sink costs the runner per changed group, and
-- what was left was the insert of one cv.view_changes row per changed group (about 3.6 µs each, WAL
-- and the primary key's index included: `python -m loadgen.change_capture`). A view recording keys
-- only now records one row per commit: `keys` holds the commit's changed groups' keys, in the order
-- they were captured, and the row's position is the last of theirs. Positions still count changes:
-- the position row advances by the number of keys, the i-th key of n is at position - n + i, and a
-- reader's lag (last - its position) is still in changes. The relay numbers the keys back out
-- (pipelines.cv.relay.records). Such a row's `key` says how many groups it holds ({"groups": n});
-- before, after and delta are NULL.

-- The keys of a commit's changes, for a view recording keys only (NULL on every other row).
ALTER TABLE cv.view_changes ADD COLUMN keys jsonb[];

-- cv.record_view_changes: as 0046's; a view recording keys only gets one row per commit.
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
        IF NOT with_images THEN  -- one row: the commit's keys, positions last_position - n + 1 .. last_position
            INSERT INTO cv.view_changes (view, position, key, keys, committed_at)
                SELECT changed.view, last_position, jsonb_build_object('groups', changed.n), array_agg(p.key), stamp
                  FROM pg_temp.cv_view_changes_pending AS p WHERE p.view = changed.view;
            positions := positions || jsonb_build_object(changed.view, last_position);
            CONTINUE;
        END IF;
        changed_only := ' AND p.before IS DISTINCT FROM p.after';  -- a no-op of a group is no change
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
