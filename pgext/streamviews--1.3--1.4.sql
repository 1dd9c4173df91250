-- streamviews 1.4: PipelineDB's freq(f, 'literal') and bucket_agg (issue 26); see sketches.c and buckets.c.
\echo Use "ALTER EXTENSION streamviews UPDATE" to load this file. \quit

-- freq(sketch, text): an unknown-typed literal (freq(f, '42')) resolves here rather than failing to
-- resolve freq(bytea, anyelement); it is read as the type the sketch counts (noted in its header since
-- 1.4), so '042' finds the integer 42. A text column's value is read the same way.
CREATE FUNCTION public.freq(sketch bytea, val text) RETURNS bigint
AS 'MODULE_PATHNAME', 'sv_freq_text' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

-- bucket_agg(x, bucket [, ts]) as a view keeps it: a batch's rows added to a stored state, and two
-- states merged, the newer (or the later ts) winning each value both hold; the view's runner calls them.
CREATE FUNCTION bucket_add(state bytea, vals anyarray, buckets smallint[], ts timestamptz[]) RETURNS bytea
AS 'MODULE_PATHNAME', 'sv_bucket_add' LANGUAGE C IMMUTABLE PARALLEL SAFE;
CREATE FUNCTION bucket_merge(older bytea, newer bytea) RETURNS bytea
AS 'MODULE_PATHNAME', 'sv_bucket_merge' LANGUAGE C IMMUTABLE PARALLEL SAFE;

-- What users call on a view's bucket_agg column, under PipelineDB's names: the buckets holding a
-- value (ascending), how many distinct values each holds (same order), and one bucket's count.
CREATE FUNCTION public.bucket_ids(state bytea) RETURNS smallint[]
AS 'MODULE_PATHNAME', 'sv_bucket_ids' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION public.bucket_cardinalities(state bytea) RETURNS integer[]
AS 'MODULE_PATHNAME', 'sv_bucket_cardinalities' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION public.bucket_cardinality(state bytea, bucket smallint) RETURNS bigint
AS 'MODULE_PATHNAME', 'sv_bucket_cardinality' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
