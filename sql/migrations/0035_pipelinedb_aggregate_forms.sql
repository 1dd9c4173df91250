-- why: PipelineDB's aggregate forms its regression suite runs that were refused or answered otherwise
-- (issue 26): topk(t) and topk_values(t) read a topk_agg as PipelineDB's did (rows of (value,
-- frequency), a PostgreSQL array of values), and ties in a top-K come in the order values were first
-- counted, as PipelineDB's filtered space-saving kept them, instead of by value.

-- The Misra-Gries step of 0009, its entries kept in their order among equal counts: a value already
-- in the summary (the left side of `a || b`) stays before one first counted later. Ordering ties by
-- value, as 0009 did, put 3 before 4 where PipelineDB, having counted 4 first, listed 4 first.
CREATE OR REPLACE FUNCTION cv.topk_trim(entries jsonb, capacity int) RETURNS SETOF jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN entries IS NOT NULL THEN coalesce(
        jsonb_agg(jsonb_build_array(value, count - cut) ORDER BY count DESC, first) FILTER (WHERE count > cut),
        '[]'
    ) END
    FROM (
        SELECT value, count, first, coalesce(nth_value(count, capacity + 1) OVER (
            ORDER BY count DESC, first ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING
        ), 0) AS cut
        FROM (
            SELECT e -> 0 AS value, sum((e ->> 1)::bigint)::bigint AS count, min(o) AS first
            FROM jsonb_array_elements(entries) WITH ORDINALITY AS u(e, o)
            GROUP BY e -> 0
        ) AS totals
    ) AS ranked
$$;

-- 0009's cv.topk_add, a batch's values listed in the order they first come in the batch (ties then
-- keep that order).
CREATE OR REPLACE FUNCTION cv.topk_add(summary jsonb, batch anyarray, capacity int) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT trimmed
    FROM (
        SELECT jsonb_agg(jsonb_build_array(to_jsonb(x), n) ORDER BY first) AS counted
        FROM (
            SELECT x, count(*) AS n, min(o) AS first FROM unnest(batch) WITH ORDINALITY AS b(x, o)
            WHERE x IS NOT NULL GROUP BY x
        ) AS b
    ) AS batch_counts,
    cv.topk_trim(coalesce(summary || counted, summary, counted), capacity) AS trimmed
$$;

-- 0031's weighted add, in the same order.
CREATE OR REPLACE FUNCTION cv.topk_add_weighted(summary jsonb, batch anyarray, weights bigint[], capacity int) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT trimmed
    FROM (
        SELECT jsonb_agg(jsonb_build_array(to_jsonb(x), n) ORDER BY first) AS counted
        FROM (
            SELECT x, sum(w)::bigint AS n, min(o) AS first FROM unnest(batch, weights) WITH ORDINALITY AS b(x, w, o)
            WHERE x IS NOT NULL AND w > 0 GROUP BY x
        ) AS b
    ) AS batch_counts,
    cv.topk_trim(coalesce(summary || counted, summary, counted), capacity) AS trimmed
$$;

-- What topk_agg(x, k) reads: the k largest counts as [{"value": v, "count": c}, ...], count
-- descending, ties in the summary's order (the value counted first, first).
CREATE OR REPLACE FUNCTION cv.topk_top(summary jsonb, k int) RETURNS jsonb
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
    SELECT coalesce(jsonb_agg(jsonb_build_object('value', e -> 0, 'count', n) ORDER BY n DESC, o), '[]')
    FROM (
        SELECT e, (e ->> 1)::bigint AS n, o
        FROM jsonb_array_elements(summary) WITH ORDINALITY AS u(e, o)
        ORDER BY n DESC, o
        LIMIT k
    ) AS top
$$;

-- PipelineDB's topk(t): a topk_agg's values and their estimated counts, one row each, most frequent
-- first. Values come as text (a summary keeps numbers and text as jsonb); cast them as needed.
CREATE OR REPLACE FUNCTION public.topk(topk jsonb) RETURNS TABLE (value text, frequency bigint)
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
    SELECT e ->> 'value', (e ->> 'count')::bigint FROM jsonb_array_elements(topk) WITH ORDINALITY AS u(e, o) ORDER BY o
$$;

-- topk_values(t): the values of a topk_agg, most frequent first, as PipelineDB's array ({1,2,3}) in
-- text (0031 returned a jsonb array; `topk_values(t)::int[]` gives the values' own type).
DROP FUNCTION IF EXISTS public.topk_values(jsonb);
CREATE FUNCTION public.topk_values(topk jsonb) RETURNS text[]
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN (SELECT coalesce(array_agg(e ->> 'value' ORDER BY o), '{}') FROM jsonb_array_elements(topk) WITH ORDINALITY AS u(e, o));
