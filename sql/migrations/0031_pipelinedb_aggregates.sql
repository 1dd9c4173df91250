-- why: PipelineDB's aggregates in continuous views (issue 26, item 2). The weighted top-K,
-- topk_agg(x, k, weight), adds weights to the Misra-Gries summaries of 0009 instead of ones; and the
-- functions PipelineDB users call on an aggregate's result (set_cardinality, topk_values,
-- topk_freqs) exist under their names, in public so that a view's definition and any query reach
-- them without a schema. The other aggregates (keyed_max/min, first_values, set_agg, array_agg,
-- string_agg, json_agg, hll_union_agg) need no function of their own: see
-- pipelines/cv/frontend/pipelinedb_calls.py.

-- `summary` with a batch's values added, each counting its weight (values and weights side by side,
-- as two array_agg of the same rows). NULL values and weights that are NULL or not positive count
-- nothing: Misra-Gries bounds each count's error by W/(capacity+1), W the total positive weight.
CREATE OR REPLACE FUNCTION cv.topk_add_weighted(summary jsonb, batch anyarray, weights bigint[], capacity int) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT trimmed
    FROM (
        SELECT jsonb_agg(jsonb_build_array(to_jsonb(x), n)) AS counted
        FROM (
            SELECT x, sum(w)::bigint AS n FROM unnest(batch, weights) AS b(x, w)
            WHERE x IS NOT NULL AND w > 0 GROUP BY x
        ) AS b
    ) AS batch_counts,
    cv.topk_trim(coalesce(summary || counted, summary, counted), capacity) AS trimmed
$$;

-- The number of values in a set_agg(x) (PipelineDB's set_cardinality); NULL for NULL (no values yet).
CREATE OR REPLACE FUNCTION public.set_cardinality(s anyarray) RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT cardinality(s)::bigint $$;

-- The values of a topk_agg(...) result, most frequent first, as a jsonb array (values are kept as
-- jsonb: numbers stay numbers and text stays text).
CREATE OR REPLACE FUNCTION public.topk_values(topk jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN (SELECT coalesce(jsonb_agg(e -> 'value' ORDER BY o), '[]') FROM jsonb_array_elements(topk) WITH ORDINALITY AS u(e, o));

-- The estimated counts (weights) of a topk_agg(...) result, in topk_values' order.
CREATE OR REPLACE FUNCTION public.topk_freqs(topk jsonb) RETURNS bigint[]
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN (SELECT coalesce(array_agg((e ->> 'count')::bigint ORDER BY o), '{}') FROM jsonb_array_elements(topk) WITH ORDINALITY AS u(e, o));
