-- why: recording a view's changes cost about twice the view's own update per changed group
-- (`python -m loadgen.change_capture`), and that cost bounds issue 25's sink and rollup figures.
-- Part of it was bookkeeping, not the change: every captured row went through a unique index of
-- the session's netting table (ON CONFLICT), its key was turned into text and parsed back, the
-- flush sorted the changes by that text, and the delta was built as one JSON object per output and
-- concatenated. Now:
--
--   * the netting table (pg_temp.cv_view_changes_pending) has no index: a view's first capture in
--     a transaction appends its rows (nothing to net against). Only a later statement on the same
--     view (emptied groups deleted, min/max fixed, the other half of an INSERT ... ON CONFLICT,
--     another batch in the same transaction) merges into them, by a hash join on the key: a group
--     keeps its first before and takes the last after, as before. Which views were captured in the
--     transaction is a transaction-local setting, which a savepoint's rollback restores with the
--     rows it rolls back;
--   * the key stays jsonb, and a commit's changes are numbered in the order they were captured
--     (positions still order a view's changes across commits; within one commit, each group has
--     one change, and no reader relies on their order);
--   * the delta is one jsonb_build_object of every output that has one.
--
-- Sessions that captured into the former table (pg_temp.cv_pending_changes) in a transaction still
-- open when this migration commits have those rows moved over at their flush, so no change is lost
-- across the upgrade.

-- cv.arm_view_changes: as 0020's: once per transaction (and again after a flush), make sure the
-- session's netting table exists and arm the flush at commit (a row in pg_temp.cv_pending_flush,
-- whose deferred constraint trigger runs cv.flush_view_changes). The flush table of a session that
-- armed before this migration is kept.
CREATE OR REPLACE FUNCTION cv.arm_view_changes() RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    IF to_regclass('pg_temp.cv_view_changes_pending') IS NULL THEN  -- checked first: a session armed before 0043
        CREATE TEMP TABLE cv_view_changes_pending (
            view   text NOT NULL,
            key    jsonb NOT NULL,
            before jsonb,
            after  jsonb
        ) ON COMMIT DELETE ROWS;
    END IF;
    IF current_setting('cv.changes_pending', true) = 'on' THEN
        RETURN;
    END IF;
    IF to_regclass('pg_temp.cv_pending_flush') IS NULL THEN
        CREATE TEMP TABLE cv_pending_flush (armed boolean) ON COMMIT DELETE ROWS;
        CREATE CONSTRAINT TRIGGER flush_view_changes AFTER INSERT ON pg_temp.cv_pending_flush
            DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION cv.flush_view_changes();
    END IF;
    INSERT INTO pg_temp.cv_pending_flush VALUES (true);
    PERFORM set_config('cv.changes_pending', 'on', true);
    PERFORM set_config('cv.captured_views', '', true);
END
$$;

-- cv.capture_view_changes: the storage tables' statement-level AFTER trigger, arguments as 0020's
-- (TG_ARGV[0] the view, TG_ARGV[1] a SELECT of (key, row) over the transition table `cv_rows AS s`).
-- The statement's changes as (key, before, after): its new rows, its old rows, or both joined on the
-- key (the UPDATE trigger's old rows are projected through a CTE named cv_rows over cv_old). They are
-- appended when the view has no pending change in this transaction; otherwise merged: a pending
-- group takes the new after (NULL for a delete) and keeps its before, a new group is appended.
CREATE OR REPLACE FUNCTION cv.capture_view_changes() RETURNS trigger
LANGUAGE plpgsql
AS $$
DECLARE
    project text := TG_ARGV[1];
    changes text;
    captured text;
    mark text := chr(31) || TG_ARGV[0] || chr(31);  -- a view's name between unit separators
BEGIN
    IF NOT EXISTS (SELECT FROM cv_rows) THEN
        RETURN NULL;
    END IF;
    PERFORM cv.arm_view_changes();
    changes := CASE TG_OP
        WHEN 'INSERT' THEN 'SELECT n.key, NULL::jsonb AS before, n.row AS after FROM (' || project || ') AS n'
        WHEN 'DELETE' THEN 'SELECT o.key, o.row AS before, NULL::jsonb AS after FROM (' || project || ') AS o'
        ELSE 'SELECT n.key, o.row AS before, n.row AS after FROM (' || project || ') AS n'
             || ' JOIN (WITH cv_rows AS (SELECT * FROM cv_old) ' || project || ') AS o ON o.key = n.key'
        END;
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

-- cv.view_change_delta_sql: the expression of a change's delta over the netted row `p`, as 0020's
-- (after minus before for each output that has one, a missing side or a NULL sum counting as 0;
-- NULL when no output has one), as one jsonb_build_object.
CREATE OR REPLACE FUNCTION cv.view_change_delta_sql(p_columns text[]) RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE WHEN cardinality(p_columns) = 0 THEN 'NULL::jsonb' ELSE 'jsonb_build_object(' || string_agg(format(
        '%L, coalesce((p.after ->> %L)::numeric, 0) - coalesce((p.before ->> %L)::numeric, 0)',
        c, c, c), ', ' ORDER BY ordinality) || ')' END
      FROM unnest(p_columns) WITH ORDINALITY AS c
$$;

-- cv.record_view_changes: as 0033's, over the new netting table: per view in name order, the
-- changes that changed something numbered under its position row (advanced by their count, the row
-- locked until commit), inserted into cv.view_changes with their delta (and states, when a
-- combine() reader reads the view), then one NOTIFY. Rows a session captured into 0020's table
-- before this migration are moved over first.
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
         WHERE p.before IS DISTINCT FROM p.after GROUP BY p.view ORDER BY p.view
    LOOP
        UPDATE cv.view_change_positions AS v SET last = v.last + changed.n
         WHERE v.view = changed.view AND v.recording
        RETURNING v.last, v.delta_columns, v.states INTO last_position, deltas, with_states;
        IF NOT FOUND THEN  -- dropped, or turned off, in this transaction
            CONTINUE;
        END IF;
        rows_sql := CASE WHEN with_states
            THEN '(SELECT p.key, p.before - ''_cv_states'' AS before, p.after - ''_cv_states'' AS after,'
                 || ' p.before -> ''_cv_states'' AS before_states, p.after -> ''_cv_states'' AS after_states'
                 || ' FROM pg_temp.cv_view_changes_pending AS p WHERE p.view = $1 AND p.before IS DISTINCT FROM p.after)'
            ELSE '(SELECT p.key, p.before, p.after, NULL::jsonb AS before_states, NULL::jsonb AS after_states'
                 || ' FROM pg_temp.cv_view_changes_pending AS p WHERE p.view = $1 AND p.before IS DISTINCT FROM p.after)'
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
