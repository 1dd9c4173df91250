-- why: every definition bumps the one catalog version (cv.catalog), and every stream's maintenance
-- plan was keyed by it: one definition made every stream of every runner recompile its plan, each
-- re-parsing every stream's definition. With 200 streams defined, one unrelated definition stalled
-- every stream for 24 s. A stream's plan depends only on its own definition, its views and which of
-- them are quarantined, so each stream now has a version of its own, `plan_version`, moved by
-- triggers whenever one of those changes: whatever code path changes them (definitions, drops,
-- quarantines, resumes), the plans that depend on the change, and only those, are rebuilt.
-- cv.catalog.version still moves with every change: the runners' subscriptions follow it.

ALTER TABLE cv.streams ADD COLUMN plan_version bigint NOT NULL DEFAULT 0;
COMMENT ON COLUMN cv.streams.plan_version IS
    'Moves whenever the stream''s definition, its views or their quarantine change: its maintenance plan is rebuilt then.';

-- cv.streams_plan_moved: a stream's own definition or topic changed (BEFORE UPDATE on cv.streams).
CREATE FUNCTION cv.streams_plan_moved() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF NEW.definition IS DISTINCT FROM OLD.definition OR NEW.topic IS DISTINCT FROM OLD.topic THEN
        NEW.plan_version := OLD.plan_version + 1;
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER plan_moved BEFORE UPDATE ON cv.streams
    FOR EACH ROW EXECUTE FUNCTION cv.streams_plan_moved();

-- cv.views_plan_moved: a view of the stream was created, changed, dropped, quarantined or resumed
-- (AFTER each row on cv.views and cv.view_failures; both carry the stream's name).
CREATE FUNCTION cv.views_plan_moved() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    UPDATE cv.streams SET plan_version = plan_version + 1
     WHERE name IN (CASE WHEN TG_OP <> 'INSERT' THEN OLD.stream END, CASE WHEN TG_OP <> 'DELETE' THEN NEW.stream END);
    RETURN NULL;
END
$$;

CREATE TRIGGER plan_moved AFTER INSERT OR UPDATE OR DELETE ON cv.views
    FOR EACH ROW EXECUTE FUNCTION cv.views_plan_moved();
-- Only what changes the plan: a retry noted by cv.retry_view_later updates the row and does not.
CREATE TRIGGER plan_moved AFTER INSERT OR DELETE ON cv.view_failures
    FOR EACH ROW EXECUTE FUNCTION cv.views_plan_moved();
