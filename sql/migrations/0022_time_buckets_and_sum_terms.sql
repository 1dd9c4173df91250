-- why: PipelineDB users group their views by `minute(ts)`, `hour(ts)`, ... and `date_round(ts,
-- '5 minutes')`, which PostgreSQL does not have ("function minute(...) does not exist"), so their
-- definitions stopped at the first one (issue 26). And `avg(x)` over `real` kept its sum in `real`,
-- where PostgreSQL's own avg(real) adds up in double precision (51773744.00000 instead of
-- 51773744.00004): a view's sum and avg now add up cv.sum_term(x), which is x in the type
-- PostgreSQL's avg accumulates it in (sum(real) is then read back as real).
--
-- The bucket helpers truncate in UTC whatever the session's time zone, so that they are IMMUTABLE
-- for real (timezone(text, timestamptz) and date_trunc(text, timestamp) are): a view's groups do not
-- depend on the runner's or the reader's TimeZone setting, and they can be used in indexes.
-- PipelineDB truncated in the session's time zone (UTC on its servers by default) while declaring
-- them IMMUTABLE. For local buckets write date_trunc('day', ts, 'Europe/Paris') (STABLE, as PostgreSQL
-- declares it). Over `timestamp` (without time zone) each returns a timestamp, truncated as it is.

-- The value a view's sum(x) and avg(x) add up, in the type PostgreSQL's avg(x) accumulates it in:
-- real as double precision, every other type PostgreSQL sums as itself (inlined: no call per row).
CREATE FUNCTION cv.sum_term(x real) RETURNS double precision
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN x::double precision;

CREATE FUNCTION cv.sum_term(x double precision) RETURNS double precision
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN x;

CREATE FUNCTION cv.sum_term(x smallint) RETURNS smallint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN x;

CREATE FUNCTION cv.sum_term(x integer) RETURNS integer
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN x;

CREATE FUNCTION cv.sum_term(x bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN x;

CREATE FUNCTION cv.sum_term(x numeric) RETURNS numeric
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN x;

CREATE FUNCTION cv.sum_term(x interval) RETURNS interval
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN x;

CREATE FUNCTION cv.sum_term(x money) RETURNS money
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN x;

-- PipelineDB's second(ts) .. year(ts): ts truncated to the start of its second .. year, in UTC.
CREATE FUNCTION public.second(ts timestamp with time zone) RETURNS timestamp with time zone
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN date_trunc('second', ts AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';

CREATE FUNCTION public.minute(ts timestamp with time zone) RETURNS timestamp with time zone
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN date_trunc('minute', ts AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';

CREATE FUNCTION public.hour(ts timestamp with time zone) RETURNS timestamp with time zone
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN date_trunc('hour', ts AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';

CREATE FUNCTION public.day(ts timestamp with time zone) RETURNS timestamp with time zone
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN date_trunc('day', ts AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';

CREATE FUNCTION public.month(ts timestamp with time zone) RETURNS timestamp with time zone
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN date_trunc('month', ts AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';

CREATE FUNCTION public.year(ts timestamp with time zone) RETURNS timestamp with time zone
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN date_trunc('year', ts AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';

-- The same over timestamp without time zone: truncated as written.
CREATE FUNCTION public.second(ts timestamp) RETURNS timestamp
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN date_trunc('second', ts);

CREATE FUNCTION public.minute(ts timestamp) RETURNS timestamp
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN date_trunc('minute', ts);

CREATE FUNCTION public.hour(ts timestamp) RETURNS timestamp
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN date_trunc('hour', ts);

CREATE FUNCTION public.day(ts timestamp) RETURNS timestamp
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN date_trunc('day', ts);

CREATE FUNCTION public.month(ts timestamp) RETURNS timestamp
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN date_trunc('month', ts);

CREATE FUNCTION public.year(ts timestamp) RETURNS timestamp
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN date_trunc('year', ts);

-- PipelineDB's date_round(ts, step): ts rounded down to a multiple of step counted from
-- 2000-01-01 00:00 UTC, step measured as the time from 2000-01-01 to 2000-01-01 + step (so
-- '2 months' is 60 days, '1 year' 366). NULL ts gives NULL; a NULL step or an infinite ts gives ts
-- (as PipelineDB's); a zero step is a division by zero. Unlike PipelineDB's, which truncated toward
-- 2000, a time before 2000 is rounded down too.
CREATE FUNCTION public.date_round(ts timestamp with time zone, step interval) RETURNS timestamp with time zone
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE
    WHEN step IS NULL OR NOT isfinite(ts) THEN ts
    ELSE timestamptz '2000-01-01 00:00:00+00' + interval '1 microsecond' * (
        floor(
            extract(epoch FROM ts - timestamptz '2000-01-01 00:00:00+00') * 1000000
            / abs(extract(epoch FROM (timestamp '2000-01-01' + step) - timestamp '2000-01-01') * 1000000)
        ) * abs(extract(epoch FROM (timestamp '2000-01-01' + step) - timestamp '2000-01-01') * 1000000)
    )::double precision
END;

CREATE FUNCTION public.date_round(ts timestamp, step interval) RETURNS timestamp
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN (public.date_round(ts AT TIME ZONE 'UTC', step)) AT TIME ZONE 'UTC';
