-- why: PipelineDB users merge a view's stored summaries across its rows in plain queries:
-- `SELECT hll_cardinality(combine(hll_agg)) FROM v`, `SELECT topk(combine(topk_agg)) FROM v`
-- (its cont_hll_agg and cont_topk_agg regression cases). Inside view definitions combine() is the
-- catalog's (pipelines/cv/frontend/combine.py); in a plain query it needs a SQL aggregate over the
-- types a view shows its summaries as. Two of them show a mergeable summary: hll_agg's hll, and
-- topk_agg's top-k list. (A finalized number, an average say, cannot be merged from what the view
-- shows: combine() in a view over the view keeps those exact.)

-- combine(hll): the union of HyperLogLogs (NULLs skipped), as hll_union_agg.
CREATE AGGREGATE public.combine(hll) (
    SFUNC = hll_union,
    STYPE = hll,
    PARALLEL = SAFE
);
COMMENT ON AGGREGATE public.combine(hll) IS 'The union of hll_agg outputs (PipelineDB''s combine over a view''s rows).';

-- combine(jsonb) of topk_agg outputs ([{"value": v, "count": c}, ...], most frequent first): the
-- counts of each value summed, the largest k kept (k: the longest list merged), most frequent first
-- and, among equal counts, in the order values were first met. A list of another shape is an error.
CREATE FUNCTION cv.topk_lists_add(state jsonb, topk jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    IF topk IS NULL THEN
        RETURN state;
    END IF;
    IF jsonb_typeof(topk) <> 'array' OR EXISTS (
        SELECT FROM jsonb_array_elements(topk) AS e
         WHERE jsonb_typeof(e) <> 'object' OR NOT (e ? 'value' AND e ? 'count')) THEN
        RAISE EXCEPTION 'combine(jsonb) merges topk_agg outputs ([{"value": ..., "count": ...}, ...]), not %', left(topk::text, 80)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN jsonb_build_object(
        'k', greatest(coalesce((state ->> 'k')::int, 0), jsonb_array_length(topk)),
        'entries', coalesce(state -> 'entries', '[]') || topk);
END
$$;

CREATE FUNCTION cv.topk_lists_final(state jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN (
    SELECT coalesce(jsonb_agg(jsonb_build_object('value', value, 'count', n) ORDER BY n DESC, first), '[]')
      FROM (SELECT e -> 'value' AS value, sum((e ->> 'count')::bigint) AS n, min(o) AS first
              FROM jsonb_array_elements(state -> 'entries') WITH ORDINALITY AS u(e, o)
             GROUP BY e -> 'value'
             ORDER BY n DESC, first
             LIMIT (state ->> 'k')::int) AS merged
);

CREATE AGGREGATE public.combine(jsonb) (
    SFUNC = cv.topk_lists_add,
    STYPE = jsonb,
    FINALFUNC = cv.topk_lists_final,
    PARALLEL = SAFE
);
COMMENT ON AGGREGATE public.combine(jsonb) IS 'The top-k of topk_agg outputs merged (PipelineDB''s combine over a view''s rows).';
GRANT EXECUTE ON FUNCTION cv.topk_lists_add(jsonb, jsonb), cv.topk_lists_final(jsonb) TO PUBLIC;
