-- streamviews 1.5: dist_cdf as PipelineDB computed it (issue 26).
\echo Use "ALTER EXTENSION streamviews UPDATE" to load this file. \quit

-- dist_cdf(d, x): the share of values at or below x, by PipelineDB's interpolation over the digest's
-- centroids (each centroid spread evenly between the points that split it from its neighbours, in
-- proportion to their weights; 0 below the least centroid, 1 above the greatest). 1.1 called the
-- tdigest extension's tdigest_percentile_of, whose interpolation halves a centroid's count in
-- integers: past every centroid of one value it answered 0.5/N too much (0.059 where the exact share
-- and PipelineDB say 0.05 and 0.054). The centroids are read from the digest's text form, which lists
-- them with their means and counts.
CREATE OR REPLACE FUNCTION public.dist_cdf(dist public.tdigest, x double precision) RETURNS double precision
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
DECLARE
    means double precision[];
    weights double precision[];
    total double precision;
    lo double precision;
    hi double precision;
    a_mean double precision;
    a_weight double precision := 0;
    b_mean double precision;
    b_weight double precision := 0;
    left_ double precision;
    right_ double precision := 0;
    so_far double precision := 0;
BEGIN
    SELECT array_agg(c[1]::float8 ORDER BY c[1]::float8, o), array_agg(c[2]::float8 ORDER BY c[1]::float8, o)
    INTO means, weights
    FROM regexp_matches(dist::text, '\(([^,]+), ([^)]+)\)', 'g') WITH ORDINALITY AS m(c, o);
    IF coalesce(cardinality(means), 0) = 0 THEN
        RETURN NULL;
    END IF;
    total := (SELECT sum(w) FROM unnest(weights) AS w);
    lo := means[1];
    hi := means[cardinality(means)];
    IF x < lo THEN
        RETURN 0;
    ELSIF x > hi THEN
        RETURN 1;
    ELSIF cardinality(means) = 1 THEN
        RETURN CASE WHEN hi = lo THEN 0.5 ELSE (x - lo) / (hi - lo) END;
    END IF;
    a_mean := lo;
    b_mean := lo;
    FOR i IN 1 .. cardinality(means) + 1 LOOP
        left_ := b_mean - (a_mean + right_);
        a_mean := b_mean;
        a_weight := b_weight;
        IF i <= cardinality(means) THEN
            b_mean := means[i];
            b_weight := weights[i];
            right_ := (b_mean - a_mean) * a_weight / (a_weight + b_weight);
        ELSE
            right_ := hi - a_mean;  -- past the last centroid: up to the greatest value
        END IF;
        IF x < a_mean + right_ THEN
            RETURN greatest((so_far + a_weight * (x - (a_mean - left_)) / (left_ + right_)) / total, 0);
        END IF;
        so_far := so_far + a_weight;
    END LOOP;
    RETURN 1;
END
$$;
