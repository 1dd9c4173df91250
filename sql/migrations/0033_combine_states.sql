-- why: combine(col) in a view over a view (issue 25, item 3) merges the upstream's stored aggregate
-- states (avg's count and sum, a variance's power sums, a HyperLogLog, a t-digest, a top-k summary)
-- so that minute -> hour -> day rollups keep the raw aggregate's exact or approximate semantics;
-- the change stream only carried rows as users read them (finalized). A view read by a combine()
-- reader (pipelines/cv/frontend/combine.py) now also records, per change, its stored states before
-- and after, in two columns of their own: the sinks' JSON (before, after) does not change, and a view
-- nobody combines records nothing more.
--
-- How: the capture triggers of such a view (pipelines/cv/views/change_capture.py) project the states
-- into the netted row under the key `_cv_states` (the session's netting table keeps its shape); at
-- commit cv.record_view_changes splits them out into before_states / after_states when the view's
-- position row says `states`.

ALTER TABLE cv.view_changes ADD COLUMN before_states jsonb, ADD COLUMN after_states jsonb;
COMMENT ON COLUMN cv.view_changes.before_states IS
    'The group''s stored aggregate states before the change (only for views a combine() reader reads).';
COMMENT ON COLUMN cv.view_changes.after_states IS
    'The group''s stored aggregate states after the change (only for views a combine() reader reads).';

ALTER TABLE cv.view_change_positions ADD COLUMN states boolean NOT NULL DEFAULT false;
COMMENT ON COLUMN cv.view_change_positions.states IS
    'True while a combine() reader reads the view: its changes carry the stored states too.';

-- cv.record_view_changes: as migration 0020's, and for a view whose position row says `states`, the
-- netted rows' `_cv_states` moved out of before/after into before_states/after_states (the rows
-- users read stay as they were). The states take part in netting: a change that moved only a
-- state (a sketch that took a value its estimate does not show) is recorded, as its readers need.
CREATE OR REPLACE FUNCTION cv.record_view_changes() RETURNS jsonb
LANGUAGE plpgsql
AS $$
DECLARE
    changed record;
    stamp timestamptz := clock_timestamp();
    last_position bigint;
    deltas text[];
    with_states boolean;
    rows_sql text;
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
        RETURNING v.last, v.delta_columns, v.states INTO last_position, deltas, with_states;
        IF NOT FOUND THEN  -- dropped, or turned off, in this transaction
            CONTINUE;
        END IF;
        rows_sql := CASE WHEN with_states
            THEN '(SELECT p.view, p.key, p.before - ''_cv_states'' AS before, p.after - ''_cv_states'' AS after,'
                 || ' p.before -> ''_cv_states'' AS before_states, p.after -> ''_cv_states'' AS after_states'
                 || ' FROM pg_temp.cv_pending_changes AS p WHERE p.view = $1 AND p.before IS DISTINCT FROM p.after)'
            ELSE '(SELECT p.view, p.key, p.before, p.after, NULL::jsonb AS before_states, NULL::jsonb AS after_states'
                 || ' FROM pg_temp.cv_pending_changes AS p WHERE p.view = $1 AND p.before IS DISTINCT FROM p.after)'
            END;
        EXECUTE 'INSERT INTO cv.view_changes'
             || ' (view, position, key, before, after, delta, committed_at, before_states, after_states)'
             || ' SELECT $1, $2 + row_number() OVER (ORDER BY p.key), p.key::jsonb, p.before, p.after, '
             || cv.view_change_delta_sql(deltas) || ', $3, p.before_states, p.after_states'
             || ' FROM ' || rows_sql || ' AS p'
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

REVOKE ALL ON FUNCTION cv.record_view_changes() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION cv.record_view_changes() TO sv_writer;
