-- streamviews 1.3: PipelineDB's keyed_max / keyed_min and first_values(n, x) as aggregates of their
-- own, for queries over tables or a view's rows (a view keeps them itself, batch by batch).
\echo Use "ALTER EXTENSION streamviews UPDATE" to load this file. \quit

-- keyed_max(key, value) / keyed_min(key, value): the value at the greatest / least non-NULL key; a
-- tie of keys keeps the least value (as a continuous view does, whatever the order of rows).
CREATE FUNCTION keyed_max_step(state internal, k anyelement, v anycompatible) RETURNS internal
AS 'MODULE_PATHNAME', 'sv_keyed_max_step' LANGUAGE C IMMUTABLE;
CREATE FUNCTION keyed_min_step(state internal, k anyelement, v anycompatible) RETURNS internal
AS 'MODULE_PATHNAME', 'sv_keyed_min_step' LANGUAGE C IMMUTABLE;
CREATE FUNCTION keyed_final(state internal, k anyelement, v anycompatible) RETURNS anycompatible
AS 'MODULE_PATHNAME', 'sv_keyed_final' LANGUAGE C IMMUTABLE;
CREATE AGGREGATE public.keyed_max(anyelement, anycompatible) (
    SFUNC = keyed_max_step, STYPE = internal, FINALFUNC = keyed_final, FINALFUNC_EXTRA
);
CREATE AGGREGATE public.keyed_min(anyelement, anycompatible) (
    SFUNC = keyed_min_step, STYPE = internal, FINALFUNC = keyed_final, FINALFUNC_EXTRA
);

-- first_values(n, x): the n least values of x, ascending, NULLs last (PipelineDB's form; a view also
-- takes first_values(n) WITHIN GROUP (ORDER BY x [DESC])). Each step keeps at most n values.
CREATE FUNCTION first_values_add(vals anycompatiblearray, n integer, val anycompatible) RETURNS anycompatiblearray
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT ARRAY(SELECT e FROM unnest(array_append(vals, val)) AS e ORDER BY e NULLS LAST LIMIT n) $$;
CREATE AGGREGATE public.first_values(integer, anycompatible) (SFUNC = first_values_add, STYPE = anycompatiblearray);
