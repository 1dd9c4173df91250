-- streamviews 1.1: Bloom filters and count-min sketches (PipelineDB's bloom_agg and freq_agg), and
-- PipelineDB's names for reading t-digests (dist_agg); see sketches.c. A new database runs 1.0's
-- script, then this one (CREATE EXTENSION follows the update path: one declaration of each function).
\echo Use "ALTER EXTENSION streamviews UPDATE" to load this file. \quit

-- How a view adds a batch's values to a stored filter (NULL: a new one for at most n distinct values
-- at false-positive rate p) and merges two; the view's runner calls them.
CREATE FUNCTION bloom_add(bloom bytea, vals anyarray, p double precision, n bigint) RETURNS bytea
AS 'MODULE_PATHNAME', 'sv_bloom_add' LANGUAGE C IMMUTABLE PARALLEL SAFE;
CREATE FUNCTION bloom_union(a bytea, b bytea) RETURNS bytea
AS 'MODULE_PATHNAME', 'sv_bloom_union' LANGUAGE C IMMUTABLE PARALLEL SAFE;
-- The same for count-min sketches of width ceil(e / eps) and depth ceil(ln(1 / (1 - p))).
CREATE FUNCTION freq_add(sketch bytea, vals anyarray, eps double precision, p double precision) RETURNS bytea
AS 'MODULE_PATHNAME', 'sv_freq_add' LANGUAGE C IMMUTABLE PARALLEL SAFE;
CREATE FUNCTION freq_merge(a bytea, b bytea) RETURNS bytea
AS 'MODULE_PATHNAME', 'sv_freq_merge' LANGUAGE C IMMUTABLE PARALLEL SAFE;

-- What users call on a view's bloom_agg / freq_agg / dist_agg column, under PipelineDB's names, in
-- public so that view definitions and queries reach them without a schema.
-- bloom_contains: false when the value was never added; true when it was, or (rate p) by chance.
CREATE FUNCTION public.bloom_contains(bloom bytea, val anyelement) RETURNS boolean
AS 'MODULE_PATHNAME', 'sv_bloom_contains' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
-- bloom_cardinality: the number of distinct values added, estimated from the bits set.
CREATE FUNCTION public.bloom_cardinality(bloom bytea) RETURNS bigint
AS 'MODULE_PATHNAME', 'sv_bloom_cardinality' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
-- freq: how often the value was added; never under the truth, over it by at most eps * total with
-- probability p.
CREATE FUNCTION public.freq(sketch bytea, val anyelement) RETURNS bigint
AS 'MODULE_PATHNAME', 'sv_freq' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
-- freq_total: the number of values added (PipelineDB's cmsketch_total).
CREATE FUNCTION public.freq_total(sketch bytea) RETURNS bigint
AS 'MODULE_PATHNAME', 'sv_freq_total' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
-- Merging many filters / sketches (NULLs skipped): a sliding window's steps, or a query over a view.
CREATE AGGREGATE public.bloom_union_agg(bytea) (SFUNC = bloom_union, STYPE = bytea, PARALLEL = SAFE);
CREATE AGGREGATE public.freq_merge_agg(bytea) (SFUNC = freq_merge, STYPE = bytea, PARALLEL = SAFE);

-- dist_agg keeps a t-digest (extension tdigest); these read it as PipelineDB's dist_quantile and
-- dist_cdf did: the value at quantile q, and the share of values at or below x.
CREATE FUNCTION public.dist_quantile(dist public.tdigest, q double precision) RETURNS double precision
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT public.tdigest_percentile(dist, q) $$;
CREATE FUNCTION public.dist_cdf(dist public.tdigest, x double precision) RETURNS double precision
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT public.tdigest_percentile_of(dist, x) $$;
