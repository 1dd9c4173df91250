-- streamviews 1.2: PipelineDB's bloom_agg, freq_agg and set_agg as aggregates of their own, so that a
-- query over a table or a view's rows computes what a continuous view keeps (a view does not call
-- them: it adds a batch at a time through bloom_add / freq_add, see sketches.c).
\echo Use "ALTER EXTENSION streamviews UPDATE" to load this file. \quit

-- The transition functions: one value added to a filter or sketch, made with PipelineDB's defaults
-- (2 arguments) or the given parameters (4); inside an aggregate the state is changed in place.
CREATE FUNCTION bloom_add_value(bloom bytea, val anyelement) RETURNS bytea
AS 'MODULE_PATHNAME', 'sv_bloom_add_value' LANGUAGE C IMMUTABLE PARALLEL SAFE;
CREATE FUNCTION bloom_add_value(bloom bytea, val anyelement, p double precision, n bigint) RETURNS bytea
AS 'MODULE_PATHNAME', 'sv_bloom_add_value' LANGUAGE C IMMUTABLE PARALLEL SAFE;
CREATE FUNCTION freq_add_value(sketch bytea, val anyelement) RETURNS bytea
AS 'MODULE_PATHNAME', 'sv_freq_add_value' LANGUAGE C IMMUTABLE PARALLEL SAFE;
CREATE FUNCTION freq_add_value(sketch bytea, val anyelement, eps double precision, p double precision) RETURNS bytea
AS 'MODULE_PATHNAME', 'sv_freq_add_value' LANGUAGE C IMMUTABLE PARALLEL SAFE;

-- bloom_agg(x [, p, n]) and freq_agg(x [, eps, p]): the filter / sketch of the rows (NULLs skipped).
CREATE AGGREGATE public.bloom_agg(anyelement) (
    SFUNC = bloom_add_value, STYPE = bytea, COMBINEFUNC = bloom_union, PARALLEL = SAFE
);
CREATE AGGREGATE public.bloom_agg(anyelement, double precision, bigint) (
    SFUNC = bloom_add_value, STYPE = bytea, COMBINEFUNC = bloom_union, PARALLEL = SAFE
);
CREATE AGGREGATE public.freq_agg(anyelement) (
    SFUNC = freq_add_value, STYPE = bytea, COMBINEFUNC = freq_merge, PARALLEL = SAFE
);
CREATE AGGREGATE public.freq_agg(anyelement, double precision, double precision) (
    SFUNC = freq_add_value, STYPE = bytea, COMBINEFUNC = freq_merge, PARALLEL = SAFE
);

-- set_agg(x): the distinct values in the order they first come, NULL once if any; NULL over no rows.
CREATE FUNCTION set_add(vals anycompatiblearray, val anycompatible) RETURNS anycompatiblearray
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN val IS NULL THEN CASE WHEN array_position(vals, NULL) IS NULL THEN array_append(vals, val) ELSE vals END
        WHEN val = ANY(vals) THEN vals
        ELSE array_append(vals, val)
    END
$$;
CREATE AGGREGATE public.set_agg(anycompatible) (SFUNC = set_add, STYPE = anycompatiblearray);
