-- why: continuous views offer topk_agg(x, k), the approximately most frequent values of each group.
-- An exact answer needs every value's count, which grows without bound; a Misra-Gries summary
-- (Agarwal et al., "Mergeable summaries", 2012) keeps at most `capacity` counts and can be merged,
-- so the engine adds each batch to a stored row with INSERT ... ON CONFLICT DO UPDATE and a sliding
-- window merges its steps' summaries at read time.
--
-- A summary is a jsonb array of [value, count] pairs, count descending then value, at most
-- `capacity` of them; values are to_jsonb(x), so numbers stay numbers and text stays text. Counts
-- are underestimates: over N values summarized, true - N/(capacity+1) <= estimate <= true for every
-- value, so any value seen more than N/(capacity+1) times is present. NULL means no value yet.

-- The capacity of a summary for topk_agg(x, k): ten counters per value asked for, at least 100, so
-- each count is off by at most N/(10k+1) (N/101 for k <= 10). pipelines/cv/aggregate_calls.py
-- (topk_capacity) applies the same rule when it translates a view.
CREATE OR REPLACE FUNCTION cv.topk_capacity(k int) RETURNS int
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT greatest(10 * k, 100) $$;

-- The Misra-Gries step shared by add and merge: sum the counts of values listed more than once; if
-- more than `capacity` values remain, subtract the (capacity+1)-th largest count from every count
-- and keep those still positive. Each subtraction of c takes at least (capacity+1)*c from the total,
-- which is what bounds the error by N/(capacity+1). '[]' when every count cancelled out, NULL for
-- NULL. It returns a set (of one row) only so that the planner inlines it into its callers: a
-- function called from a SQL function's body is planned again on every call, which doubled the cost.
CREATE OR REPLACE FUNCTION cv.topk_trim(entries jsonb, capacity int) RETURNS SETOF jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN entries IS NOT NULL THEN coalesce(
        jsonb_agg(jsonb_build_array(value, count - cut) ORDER BY count DESC, value) FILTER (WHERE count > cut),
        '[]'
    ) END
    FROM (
        SELECT value, count, coalesce(nth_value(count, capacity + 1) OVER (
            ORDER BY count DESC, value ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING
        ), 0) AS cut
        FROM (
            SELECT e -> 0 AS value, sum((e ->> 1)::bigint)::bigint AS count
            FROM jsonb_array_elements(entries) AS e
            GROUP BY e -> 0
        ) AS totals
    ) AS ranked
$$;

-- `summary` with a batch's values added, NULL elements skipped: how a batch updates a stored row.
-- NULL while nothing was ever added, like other aggregates over no rows.
CREATE OR REPLACE FUNCTION cv.topk_add(summary jsonb, batch anyarray, capacity int) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT trimmed
    FROM (
        SELECT jsonb_agg(jsonb_build_array(to_jsonb(x), n)) AS counted
        FROM (SELECT x, count(*) AS n FROM unnest(batch) AS x WHERE x IS NOT NULL GROUP BY x) AS b
    ) AS batch_counts,
    cv.topk_trim(coalesce(summary || counted, summary, counted), capacity) AS trimmed
$$;

-- The summary of two streams from theirs (the bound holds over the combined stream); NULL on one
-- side returns the other. Fits ON CONFLICT DO UPDATE SET s = cv.topk_merge(v.s, excluded.s, c).
-- Its body is bound when it is created (RETURN, not a quoted body looked up at each call), so the
-- query role, which cannot look names up in schema cv, can still merge a sliding window's steps.
CREATE OR REPLACE FUNCTION cv.topk_merge(a jsonb, b jsonb, capacity int) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE
    WHEN a IS NULL THEN b
    WHEN b IS NULL THEN a
    ELSE (SELECT merged FROM cv.topk_trim(a || b, capacity) AS merged)
END;

-- Merges many summaries, NULLs skipped: a sliding window combines its steps' summaries at read time.
CREATE OR REPLACE AGGREGATE cv.topk_merge_agg(jsonb, int) (
    SFUNC = cv.topk_merge,
    STYPE = jsonb,
    PARALLEL = SAFE
);

-- What topk_agg(x, k) reads: the k largest counts as [{"value": v, "count": c}, ...], count
-- descending then value ascending so ties always come out in the same order.
CREATE OR REPLACE FUNCTION cv.topk_top(summary jsonb, k int) RETURNS jsonb
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
    SELECT coalesce(jsonb_agg(jsonb_build_object('value', e -> 0, 'count', n) ORDER BY n DESC, e -> 0), '[]')
    FROM (
        SELECT e, (e ->> 1)::bigint AS n
        FROM jsonb_array_elements(summary) AS e
        ORDER BY n DESC, e -> 0
        LIMIT k
    ) AS top
$$;
