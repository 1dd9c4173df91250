-- streamviews 1.6: bloom_contains(b, 'literal') (issue 26).
\echo Use "ALTER EXTENSION streamviews UPDATE" to load this file. \quit

-- bloom_contains(bloom, text): an untyped literal (bloom_contains(b, 'hello')) resolves here rather
-- than failing to resolve bloom_contains(bytea, anyelement). A filter hashes its values' text form and
-- does not know their type, so the text is hashed as written: '42' finds the integer 42, '042' not.
CREATE FUNCTION public.bloom_contains(bloom bytea, val text) RETURNS boolean
AS 'MODULE_PATHNAME', 'sv_bloom_contains' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
