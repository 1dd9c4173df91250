-- streamviews 1.7: PipelineDB's hll_agg(x) as an aggregate of its own (issue 26).
\echo Use "ALTER EXTENSION streamviews UPDATE" to load this file. \quit

-- hll_agg(x): the HyperLogLog of the rows' values (NULLs skipped) with PipelineDB's 2^14 registers,
-- so a query over a table computes what a continuous view keeps for hll_agg(x) (a view adds a batch
-- at a time itself, as hll_add_agg(hll_hash_any(x), 14)). NULL over no values.
CREATE FUNCTION hll_agg_add(state public.hll, val anyelement) RETURNS public.hll
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN val IS NULL THEN state
        ELSE public.hll_add(coalesce(state, public.hll_empty(14)), public.hll_hash_any(val)) END
$$;
CREATE AGGREGATE public.hll_agg(anyelement) (
    SFUNC = hll_agg_add, STYPE = public.hll, COMBINEFUNC = public.hll_union, PARALLEL = SAFE
);
