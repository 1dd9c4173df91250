-- why: PipelineDB's cont_activate regression case deactivates a view, inserts, activates it and
-- inserts again: the events after activate() count, and activate() and deactivate() answer true.
-- Migration 0028's activate left a deactivated view to the runner's next retry sweep (up to
-- PIPELINE_VIEW_RETRY_S), so events that arrived before it were missed too, and both functions
-- answered a sentence, which scripts written for PipelineDB read as a value they did not expect.
--
-- Now a view deactivated over an append-only stream is resumed by activate() itself: under its
-- stream's exclusive lock (no batch in flight), its failure row goes (which moves the stream's
-- plan version, migration 0018: the next batch includes it) and the events it missed are recorded
-- as a gap (cv.view_gaps), as isolation records them. A view over a keyed stream is still rebuilt
-- from the stream's state by the runner's sweep (the state is the source; SQL cannot rebuild it here),
-- and so is a view quarantined for a failure (its retry tells whether it runs again).
-- pipelinedb.activate / pipelinedb.deactivate answer true, PipelineDB's value, and say the sentence
-- as a NOTICE; cv.activate / cv.deactivate keep answering it.

-- cv.activate: a stream consumed again from its stored position; a deactivated view over an
-- append-only stream resumed now; any other stopped view resumed by the runner's next sweep.
CREATE OR REPLACE FUNCTION cv.activate(p_name text) RETURNS text
LANGUAGE plpgsql VOLATILE
SET lock_timeout = '10s'
AS $$
DECLARE
    v_view text := CASE WHEN p_name LIKE '%.%' THEN p_name ELSE 'public.' || p_name END;
    v_stream text;
    v_reason text;
BEGIN
    IF EXISTS (SELECT FROM cv.streams WHERE name = p_name) THEN
        DELETE FROM cv.paused_streams WHERE stream = p_name;
        IF NOT FOUND THEN
            RETURN format('stream %s is already active', p_name);
        END IF;
        UPDATE cv.catalog SET version = version + 1;
        RETURN format('stream %s activated: its topic is read again from where it stopped', p_name);
    END IF;
    SELECT stream INTO v_stream FROM cv.views WHERE name = v_view;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no stream or continuous view named %', p_name USING ERRCODE = 'undefined_object';
    END IF;
    SELECT reason INTO v_reason FROM cv.view_failures WHERE view = v_view;
    IF NOT FOUND THEN
        RETURN format('view %s is already active', v_view);
    END IF;
    IF v_reason = 'deactivated' AND to_regclass(format('cv.%I', 'state_' || v_stream)) IS NULL THEN
        PERFORM cv.lock_stream_exclusively(v_stream);
        PERFORM cv.resume_view(v_view, cv.stream_positions(v_stream));
        RETURN format('view %s activated: events of %s from now on are applied to it', v_view, v_stream);
    END IF;
    UPDATE cv.view_failures SET retry_at = now() WHERE view = v_view;
    RETURN format('view %s activated: the stream runner resumes it at its next retry sweep', v_view);
END
$$;

DROP FUNCTION pipelinedb.activate(text);
DROP FUNCTION pipelinedb.deactivate(text);
-- PipelineDB's activate(name) and deactivate(name): true, what PipelineDB answered; what was done
-- is said as a NOTICE (psql shows it).
CREATE FUNCTION pipelinedb.activate(name text) RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    RAISE NOTICE '%', cv.activate(name);
    RETURN true;
END
$$;
CREATE FUNCTION pipelinedb.deactivate(name text) RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    RAISE NOTICE '%', cv.deactivate(name);
    RETURN true;
END
$$;
REVOKE ALL ON FUNCTION pipelinedb.activate(text), pipelinedb.deactivate(text) FROM PUBLIC;
