-- why: one view that could not be maintained (its join table dropped, a privilege revoked, an
-- aggregate that cannot run) failed the stream runner's whole batch, and every stream of its consumer
-- group stopped with it, retrying forever. A failure is now confined to what failed. A view that fails
-- for a reason no event causes is *quarantined*: recorded here, in the transaction of the batch it
-- failed in, left out of its stream's maintenance, and retried now and then until it runs again. A
-- stream whose own state cannot be written is *held*: its offsets are not advanced (nothing of it is
-- lost) while the other streams go on. Both are visible in `streamviews status` and the metrics.
--
-- The runner writes as sv_writer, which may not change the catalog: quarantining and resuming a view
-- go through the SECURITY DEFINER functions below. Every runner process sees the change through its
-- stream's plan version (migration 0018), which moves with cv.view_failures; the global catalog
-- version does not move, so no definition waits on a batch that quarantines.

CREATE TABLE cv.view_failures (
    view        text PRIMARY KEY REFERENCES cv.views (name) ON DELETE CASCADE,
    stream      text NOT NULL,
    sqlstate    text,
    reason      text NOT NULL,
    failed_at   timestamptz NOT NULL DEFAULT now(),
    missed_from jsonb NOT NULL,
    attempts    integer NOT NULL DEFAULT 0,
    retry_at    timestamptz NOT NULL
);
COMMENT ON TABLE cv.view_failures IS
    'Quarantined continuous views: not maintained since failed_at, retried at retry_at (see migration 0015).';
COMMENT ON COLUMN cv.view_failures.missed_from IS
    'Where the view stopped: {"<topic>": {"<partition>": <next offset>}} of its stream when it failed.';

-- An append-only view that resumed after a quarantine did not see the events in between: the range
-- is kept so that status says so and a replay can recompute exactly that range.
CREATE TABLE cv.view_gaps (
    view        text NOT NULL REFERENCES cv.views (name) ON DELETE CASCADE,
    stream      text NOT NULL,
    reason      text NOT NULL,
    failed_at   timestamptz NOT NULL,
    resumed_at  timestamptz NOT NULL DEFAULT now(),
    missed_from jsonb NOT NULL,
    missed_to   jsonb NOT NULL,
    PRIMARY KEY (view, failed_at)
);
COMMENT ON TABLE cv.view_gaps IS
    'Events an append-only view missed while quarantined: offsets missed_from (inclusive) to missed_to (exclusive).';

CREATE TABLE cv.stream_failures (
    stream    text PRIMARY KEY REFERENCES cv.streams (name) ON DELETE CASCADE,
    group_id  text NOT NULL,
    sqlstate  text,
    reason    text NOT NULL,
    failed_at timestamptz NOT NULL DEFAULT now(),
    last_at   timestamptz NOT NULL DEFAULT now(),
    attempts  integer NOT NULL DEFAULT 1
);
COMMENT ON TABLE cv.stream_failures IS
    'Streams held back by the runner: their state could not be written; their offsets wait (nothing is lost).';

GRANT SELECT ON cv.view_failures, cv.view_gaps TO sv_writer, sv_reader;
GRANT SELECT, INSERT, UPDATE, DELETE ON cv.stream_failures TO sv_writer;
GRANT SELECT ON cv.stream_failures TO sv_reader;

-- Quarantine a view (idempotent: a second runner failing on it finds it recorded). Returns true when
-- this call recorded it. `missed_from` is its stream's position at the failed batch's start.
CREATE FUNCTION cv.quarantine_view(
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
    RETURN FOUND;
END
$$;

-- A retry of a quarantined view failed again: note why, and when to try next.
CREATE FUNCTION cv.retry_view_later(p_view text, p_sqlstate text, p_reason text, p_retry_after interval)
RETURNS void
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    UPDATE cv.view_failures
       SET sqlstate = p_sqlstate, reason = left(p_reason, 1000), attempts = attempts + 1,
           retry_at = now() + p_retry_after
     WHERE view = p_view
$$;

-- A quarantined view runs again. `p_missed_to` is its stream's position now, for an append-only
-- stream (the events between are recorded as a gap); NULL when the view was rebuilt from its keyed
-- stream's state, which leaves nothing missed.
CREATE FUNCTION cv.resume_view(p_view text, p_missed_to jsonb) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    f cv.view_failures;
BEGIN
    DELETE FROM cv.view_failures WHERE view = p_view RETURNING * INTO f;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF p_missed_to IS NOT NULL THEN
        INSERT INTO cv.view_gaps (view, stream, reason, failed_at, missed_from, missed_to)
        VALUES (f.view, f.stream, f.reason, f.failed_at, f.missed_from, p_missed_to)
        ON CONFLICT DO NOTHING;
    END IF;
END
$$;

REVOKE ALL ON FUNCTION cv.quarantine_view(text, text, text, jsonb, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION cv.retry_view_later(text, text, text, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION cv.resume_view(text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION cv.quarantine_view(text, text, text, jsonb, interval) TO sv_writer;
GRANT EXECUTE ON FUNCTION cv.retry_view_later(text, text, text, interval) TO sv_writer;
GRANT EXECUTE ON FUNCTION cv.resume_view(text, jsonb) TO sv_writer;
