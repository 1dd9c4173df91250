-- why: a view must aggregate, so the cleaned, enriched events themselves (a filter and a join per
-- event, no aggregation) could not reach another topic or another view (issue 25, item 4).
-- PipelineDB had continuous transforms for that. Here a transform's output is a change stream
-- like a view's (migration 0020): one change per event that passes, before NULL, after the
-- projected row, recorded by the batch's own transaction (the one that stores the Kafka offsets),
-- so sinks and views read it with no code of their own, exactly once.
--
-- A change stream was owned by a view only (cv.view_change_positions.view referenced cv.views).
-- It is owned by a view or a transform now: the foreign key gives way to triggers that keep what
-- it guaranteed. A position row needs an owner; dropping the owner drops its position row, hence
-- its changes (0020's trigger) and its readers (0023's cascade). A name is a view's or a
-- transform's, never both: the change stream and the relation users read are named by it.

CREATE TABLE cv.transforms (
    name       text PRIMARY KEY,
    stream     text NOT NULL REFERENCES cv.streams (name),  -- DROP STREAM refuses while a transform reads it
    definition text NOT NULL,
    columns    jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE cv.transforms IS
    'Continuous transforms: each event of the stream that passes, projected, recorded in cv.view_changes under the name.';
COMMENT ON COLUMN cv.transforms.columns IS
    'The output columns as [[name, type], ...], as PostgreSQL resolved them when the transform was defined.';

-- A transform changes its stream's maintenance plan as a view does (0018's function reads `stream`).
CREATE TRIGGER plan_moved AFTER INSERT OR UPDATE OR DELETE ON cv.transforms
    FOR EACH ROW EXECUTE FUNCTION cv.views_plan_moved();

ALTER TABLE cv.view_change_positions DROP CONSTRAINT view_change_positions_view_fkey;
COMMENT ON COLUMN cv.view_change_positions.view IS
    'The owner of the change stream: a continuous view (cv.views) or a transform (cv.transforms).';

-- cv.change_stream_owned: a position row's name must be a view's or a transform's (what the
-- foreign key checked). BEFORE INSERT OR UPDATE OF view on cv.view_change_positions.
CREATE FUNCTION cv.change_stream_owned() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF NOT EXISTS (SELECT FROM cv.views WHERE name = NEW.view)
       AND NOT EXISTS (SELECT FROM cv.transforms WHERE name = NEW.view) THEN
        RAISE EXCEPTION 'change stream %: no continuous view or transform of that name', NEW.view
            USING ERRCODE = 'foreign_key_violation';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER owned BEFORE INSERT OR UPDATE OF view ON cv.view_change_positions
    FOR EACH ROW EXECUTE FUNCTION cv.change_stream_owned();

-- cv.change_stream_owner_dropped: a view or transform dropped takes its position row with it
-- (what ON DELETE CASCADE did), and so its changes and readers. AFTER DELETE on both tables.
CREATE FUNCTION cv.change_stream_owner_dropped() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    DELETE FROM cv.view_change_positions WHERE view = OLD.name;
    RETURN NULL;
END
$$;

CREATE TRIGGER change_stream_dropped AFTER DELETE ON cv.views
    FOR EACH ROW EXECUTE FUNCTION cv.change_stream_owner_dropped();
CREATE TRIGGER change_stream_dropped AFTER DELETE ON cv.transforms
    FOR EACH ROW EXECUTE FUNCTION cv.change_stream_owner_dropped();

-- cv.change_stream_name_free: a new view's or transform's name is not the other kind's.
-- BEFORE INSERT on both tables (TG_TABLE_NAME says which).
CREATE FUNCTION cv.change_stream_name_free() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    IF TG_TABLE_NAME = 'views' AND EXISTS (SELECT FROM cv.transforms WHERE name = NEW.name) THEN
        RAISE EXCEPTION '% is a continuous transform; a view needs a name of its own', NEW.name
            USING ERRCODE = 'duplicate_object';
    ELSIF TG_TABLE_NAME = 'transforms' AND EXISTS (SELECT FROM cv.views WHERE name = NEW.name) THEN
        RAISE EXCEPTION '% is a continuous view; a transform needs a name of its own', NEW.name
            USING ERRCODE = 'duplicate_object';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER name_free BEFORE INSERT ON cv.views
    FOR EACH ROW EXECUTE FUNCTION cv.change_stream_name_free();
CREATE TRIGGER name_free BEFORE INSERT ON cv.transforms
    FOR EACH ROW EXECUTE FUNCTION cv.change_stream_name_free();

-- The runner reads the transforms of its streams; readers see them in status.
GRANT SELECT ON cv.transforms TO sv_writer, sv_reader;
