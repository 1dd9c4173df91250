-- why: a view computed wrongly (a bug fixed since, a definition that was wrong) could only be dropped
-- and created again, which loses every reader's view for the time its backfill takes and its
-- identity (grants, sinks, views over it, change positions). `streamviews replay V --from T`
-- (issue 27, item 4) recomputes V from T while readers keep reading the old result: a hidden
-- *shadow* view with V's definition and `backfill = T` is maintained by the live runner and caught
-- up by the backfill thread like any new view (migration 0029); once its backfill is done, one
-- transaction under the stream's exclusive lock (no batch in flight: both have seen the same live
-- events) replaces V's storage rows by the shadow's with DELETE + INSERT, and drops the shadow.
-- DELETE + INSERT, not TRUNCATE: V's change-capture triggers (migration 0020) net the two per group,
-- so its change stream, its sinks and the views over it get the diff, nothing more.
--
-- The shadows' read views live in schema cv_replay (their storage in cv, as every view's), which no
-- user names: `streamviews list` leaves them out, status shows them as "<view> (replay)". The
-- stream runner writes as sv_writer, which may not drop tables: it swaps the rows itself and ends
-- the replay through a SECURITY DEFINER function (pipelines/cv/catalog/replays.py).

CREATE SCHEMA cv_replay AUTHORIZATION sv_owner;
COMMENT ON SCHEMA cv_replay IS
    'The read views of replays'' shadow views (cv.replays); never read by applications.';
GRANT USAGE ON SCHEMA cv_replay TO sv_writer, sv_reader;  -- name lookups; SELECT is not granted

CREATE TABLE cv.replays (
    id         bigserial PRIMARY KEY,
    view       text NOT NULL REFERENCES cv.views (name) ON DELETE CASCADE,
    shadow     text NOT NULL UNIQUE,
    rule       text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    ended_at   timestamptz,
    outcome    text,
    groups     bigint
);
CREATE UNIQUE INDEX replays_one_running ON cv.replays (view) WHERE ended_at IS NULL;
COMMENT ON TABLE cv.replays IS
    'Replays of views (streamviews replay): the shadow view recomputing `view` from `rule` (earliest or a '
    'timestamptz) while it runs; ended_at and outcome (swapped, cancelled: why) once it ended.';
GRANT SELECT ON cv.replays TO sv_writer, sv_reader;

-- cv.drop_replay_shadow: drop a shadow view whole: its read view, its tables (storage, reference
-- counts, min/max value counts, named as pipelines.cv.catalog.views.view_tables finds them) and its
-- catalog row (its backfill goes with it; the catch-up's offsets are forgotten by
-- cv.forget_backfill_offsets). The caller holds the stream's lock exclusively.
CREATE FUNCTION cv.drop_replay_shadow(p_shadow text) RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    v_table text;
BEGIN
    EXECUTE format('DROP VIEW IF EXISTS %I.%I', split_part(p_shadow, '.', 1), split_part(p_shadow, '.', 2));
    FOR v_table IN
        SELECT relname FROM pg_class
         WHERE relnamespace = 'cv'::regnamespace AND relkind = 'r'
           AND relname ~ ('^' || replace(p_shadow, '.', '__') || '(__refs|__m[0-9]+)?$')
    LOOP
        EXECUTE format('DROP TABLE cv.%I', v_table);
    END LOOP;
    DELETE FROM cv.views WHERE name = p_shadow;
END
$$;

-- cv.end_replay: end the running replay of a view without a swap (`outcome` says why) and drop its
-- shadow; false when none runs. Called by `streamviews replay V --cancel` and by the trigger below.
CREATE FUNCTION cv.end_replay(p_view text, p_outcome text) RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
    v_shadow text;
BEGIN
    UPDATE cv.replays SET ended_at = now(), outcome = p_outcome
     WHERE view = p_view AND ended_at IS NULL
    RETURNING shadow INTO v_shadow;
    IF v_shadow IS NULL THEN
        RETURN false;
    END IF;
    PERFORM cv.drop_replay_shadow(v_shadow);
    RETURN true;
END
$$;

-- cv.replayed_view_changed: DROP of a view drops its shadow; any change of its definition
-- (CREATE OR REPLACE, ALTER) cancels its replay, whose shadow computes the old definition; a shadow
-- dropped by name ends its replay. BEFORE each row of cv.views: the definition holds the stream's
-- lock exclusively already.
CREATE FUNCTION cv.replayed_view_changed() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF starts_with(OLD.name, 'cv_replay.') THEN
        IF TG_OP = 'DELETE' THEN
            UPDATE cv.replays SET ended_at = now(), outcome = 'cancelled: its shadow view was dropped'
             WHERE shadow = OLD.name AND ended_at IS NULL;
            RETURN OLD;
        END IF;
        RETURN NEW;
    END IF;
    IF TG_OP = 'DELETE' THEN
        PERFORM cv.end_replay(OLD.name, 'cancelled: the view was dropped');
        RETURN OLD;
    END IF;
    IF NEW.definition IS DISTINCT FROM OLD.definition THEN
        PERFORM cv.end_replay(OLD.name, 'cancelled: the view was redefined');
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER replayed_view_changed BEFORE DELETE OR UPDATE OF definition ON cv.views
    FOR EACH ROW EXECUTE FUNCTION cv.replayed_view_changed();

-- cv.replay_ended_by_runner: what the runner may do to a replay's catalog (it may not drop
-- tables): end it with `outcome` ('swapped': the view then holds `p_groups` groups, and its gaps
-- from the replay's start on are filled, so forgotten) and drop its shadow.
CREATE FUNCTION cv.replay_ended_by_runner(p_view text, p_outcome text, p_groups bigint) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_rule text;
BEGIN
    UPDATE cv.replays SET groups = p_groups WHERE view = p_view AND ended_at IS NULL RETURNING rule INTO v_rule;
    IF p_outcome = 'swapped' AND v_rule = 'earliest' THEN
        DELETE FROM cv.view_gaps WHERE view = p_view;
    ELSIF p_outcome = 'swapped' THEN
        DELETE FROM cv.view_gaps WHERE view = p_view AND failed_at >= v_rule::timestamptz;
    END IF;
    PERFORM cv.end_replay(p_view, p_outcome);
END
$$;
REVOKE ALL ON FUNCTION cv.replay_ended_by_runner(text, text, bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION cv.replay_ended_by_runner(text, text, bigint) TO sv_writer;

-- cv.swap_replay: once the shadow's backfill is done, put its result in the view and drop it; the
-- outcome ('swapped', 'failed'), or NULL when there is nothing to do yet (no replay, not caught up,
-- the shadow quarantined). Called by the batch that finishes the shadow's catch-up, which holds the
-- stream's lock exclusively already. The stream's lock exclusively (no batch in flight, so view and
-- shadow have seen the same live events) is all it needs: every definition of the stream's views
-- takes it too. It runs as its caller (the runner's sv_writer, which writes both storages): the
-- view's change capture records the swap in the caller's own session tables.
-- Per table of the view, DELETE then INSERT from the shadow's (the view's columns, by name):
-- readers keep seeing the old rows until the commit, then all the new ones. A shadow that missed
-- live events (quarantined, then resumed: cv.view_gaps) cannot be swapped: the replay fails.
CREATE FUNCTION cv.swap_replay(p_view text) RETURNS text
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
           AND relname ~ ('^' || v_storage || '(__refs|__m[0-9]+)?$')
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
REVOKE ALL ON FUNCTION cv.swap_replay(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION cv.swap_replay(text) TO sv_writer;
REVOKE ALL ON FUNCTION cv.drop_replay_shadow(text), cv.end_replay(text, text) FROM PUBLIC;
