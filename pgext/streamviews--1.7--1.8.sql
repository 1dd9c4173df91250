-- streamviews 1.8: lower_backend_priority(nice), for the backfill's own backend (issue 27).
\echo Use "ALTER EXTENSION streamviews UPDATE" to load this file. \quit

-- lower_backend_priority(p_nice): the calling backend's nice value raised to p_nice (0..19) when it
-- is lower, never lowered (that would need privilege); returns the nice value now in effect. A
-- view's backfill calls it once per connection with PIPELINE_BACKFILL_NICE, so that the SQL of its
-- batches gives way to the live runner's as its Python does (pgext/priority.c). The value lasts as
-- long as the backend, i.e. the connection: EXECUTE is for the roles that run backfills only
-- (sql/extensions.sql), since a backend kept by a connection pooler would stay niced for others.
CREATE FUNCTION lower_backend_priority(p_nice integer) RETURNS integer
AS 'MODULE_PATHNAME', 'sv_lower_backend_priority' LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION lower_backend_priority(integer) IS
    'Raises the calling backend''s nice value to p_nice (0..19), never lowers it; returns the value in effect.'
    ' The backfill''s sessions call it so that their SQL gives way to the live runner''s.';
REVOKE EXECUTE ON FUNCTION lower_backend_priority(integer) FROM PUBLIC;
