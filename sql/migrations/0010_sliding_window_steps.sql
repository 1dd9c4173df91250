-- why: a sliding-window view (WHERE ts > now() - interval '5 minutes') keeps its aggregates per step
-- of the window and merges the steps that overlap the window when it is read (pipelines.cv.windows).
-- The step of a row is computed in the maintenance statements and must be the same function
-- everywhere, so it lives here, once.

-- The start of the step `ts` falls in, steps being 1/60 of `width` aligned on the Unix epoch (so
-- every view with the same width has the same steps). IMMUTABLE: extract(epoch) and to_timestamp do
-- not depend on the session's time zone.
CREATE FUNCTION cv.window_step(ts timestamptz, width interval) RETURNS timestamptz
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
    SELECT to_timestamp(floor(extract(epoch FROM ts) / (extract(epoch FROM width) / 60))
                        * (extract(epoch FROM width) / 60))
$$;
COMMENT ON FUNCTION cv.window_step(timestamptz, interval) IS
    'Start of the sliding-window step (1/60 of width) that ts falls in.';
