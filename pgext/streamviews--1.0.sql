-- streamviews 1.0: C functions for the query functions of continuous views (sql/functions/).
\echo Use "CREATE EXTENSION streamviews" to load this file. \quit

-- The values common to two bigint[] columns, each read from the row with the given key of a table
-- or plain view (its table's unique index on one bigint column), each value once, in the order of
-- the smaller array; '{}' when a row is missing or its array is empty. The left row is read first,
-- and the right one only when the left array holds something. STABLE: both reads use the calling
-- query's snapshot. PARALLEL RESTRICTED: it opens relations by itself.
CREATE FUNCTION keyed_arrays_intersection(
    left_relation regclass, left_key bigint, left_column name,
    right_relation regclass, right_key bigint, right_column name
) RETURNS bigint[]
AS 'MODULE_PATHNAME', 'keyed_arrays_intersection'
LANGUAGE C STABLE STRICT PARALLEL RESTRICTED;
