-- why: the continuous-view engine keeps its definitions in the database, next to the data they
-- produce, so every pipeline process reads the same catalog and a new view takes effect in the
-- same transaction that backfills it. `cv` holds the catalog, the state of keyed streams and the
-- engine's helper functions; view tables live in their own schemas (e.g. social).

CREATE SCHEMA cv AUTHORIZATION sv_owner;
COMMENT ON SCHEMA cv IS 'Continuous-view engine: stream and view catalog, keyed-stream state.';

CREATE TABLE cv.streams (
    name       text PRIMARY KEY,
    topic      text NOT NULL,
    definition text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE cv.streams IS 'Streams: a Kafka topic with a declared column list (CREATE STREAM ...).';

CREATE TABLE cv.views (
    name       text PRIMARY KEY,
    stream     text NOT NULL REFERENCES cv.streams (name),
    definition text NOT NULL,
    types      jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE cv.views IS 'Continuous views (CREATE CONTINUOUS VIEW ...) with their resolved column types.';

-- Bumped by every definition change; pipelines compare it in each batch and reload when it moved.
CREATE TABLE cv.catalog (
    version bigint NOT NULL,
    one     boolean PRIMARY KEY DEFAULT true CHECK (one)
);
INSERT INTO cv.catalog (version) VALUES (1);

GRANT USAGE ON SCHEMA cv TO sv_writer;
GRANT SELECT ON cv.streams, cv.views, cv.catalog TO sv_writer;

-- The members of `cur` not in `removed`, order kept: how a batch's retractions leave a set.
CREATE FUNCTION cv.set_remove(cur anyarray, removed anyarray) RETURNS anyarray
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT ARRAY(SELECT x FROM unnest(cur) AS x WHERE x <> ALL (removed)) $$;
