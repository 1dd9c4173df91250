"""Why a ported PipelineDB case does not pass in full, in a line a PipelineDB user would accept.

The report (tests/pipelinedb_regress/report.py) prints each case's reason above the mechanical list
of its refused and differing statements. A case that passes needs none; "not done yet" is no reason.
"""

from __future__ import annotations

REASONS: dict[str, str] = {
    "cont_complex_types": (
        "bloom_contains(b, (1, 2, 'world')) of a row PipelineDB typed from its untyped literal: ours hashes the "
        "row as the view stored it and finds it; PipelineDB's hashed 'world' as unknown and did not"
    ),
    "cont_dist_agg": (
        "dist_quantile and dist_cdf are t-digest estimates: this t-digest (the Debian tdigest extension) and "
        "PipelineDB's interpolate differently on one group holding a repeated value; both are within the "
        "documented error of the exact answer"
    ),
    "cont_distinct": (
        "DISTINCT ON keeps the row first in an order, which a stream does not have: refused with what to write "
        "(keyed_max(ts, x) ... GROUP BY the DISTINCT ON expressions); combine() in a plain SELECT merges the "
        "summaries a view shows (hll, top-k), and an exact distinct count is shown finalized: combine it in a "
        "continuous view over the view, which keeps the sets"
    ),
    "cont_grouping_sets": (
        "GROUPING SETS, ROLLUP and CUBE are refused with what to write instead: one view per grouping (each "
        "kept as PipelineDB kept its grouping set's rows)"
    ),
    "cont_hll_agg": (
        "hll_print is the hll extension's (Debian postgresql-hll), whose text differs from PipelineDB's own "
        "HyperLogLog's; it returns cstring, which a view cannot store as a column"
    ),
    "cont_hs_agg": (
        "dense_rank() WITHIN GROUP counts the distinct rows before the hypothetical one, which a view keeps "
        "only as a set: it is refused with what to write (count(DISTINCT x) FILTER (WHERE x < c) + 1); rank, "
        "percent_rank and cume_dist are kept"
    ),
    "cont_json_agg": (
        "array_sort() of JSON texts sorts by the database's collation: this one is C.UTF-8, PipelineDB's test "
        "ran in en_US, which orders quoted strings otherwise; the values are the same"
    ),
    "cont_limit": "LIMIT is refused in a view with what to write: apply it when reading the view",
    "cont_object_agg": (
        "array_sort() of JSON texts sorts by the database's collation (C.UTF-8 here, en_US in PipelineDB's "
        "run); json_object_int_sum, an aggregate of PipelineDB's own, is not provided: sum(v) over a stream "
        "of (key, v) events gives its counts"
    ),
    "cont_os_agg": (
        "percentile_cont over a stream is a t-digest estimate (13.32 where PipelineDB's estimate said 13.3 "
        "and the exact answer is 13.37); percentile_disc and mode are refused (they need every value)"
    ),
    "cont_pk": (
        "WITH (pk = 'count'): a view's rows are keyed by its GROUP BY columns; pk may name that column "
        "only, and the refusal says so"
    ),
    "cont_set_agg": (
        "array_agg(DISTINCT x) lists its set in the values' order, as PostgreSQL's own array_agg(DISTINCT) does "
        "({1,a,NULL}); PipelineDB's listed the values in the order they first came ({a,1,NULL})"
    ),
    "cont_subselect": (
        "json_array_elements() in a view: set-returning functions (one event in, many rows out) are refused; "
        "send one event per element"
    ),
    "cont_sw_count": (
        "count(*) over a sliding window with no row in it reads 0, PostgreSQL's count over no rows, where "
        "PipelineDB's combine of no stored step gave NULL"
    ),
    "delta_streams": (
        "combine() of a t-digest, Bloom, count-min or exact distinct count over output_of(): a change of those "
        "summaries is not its state after minus before; the refusal says to combine FROM the view instead"
    ),
    "stream_table_join": (
        "GROUP BY a json column is refused (json has no equality: group by its text or declare jsonb); a "
        "function declared VOLATILE (plpgsql's default) is refused in a view, which evaluates it at every "
        "batch; EXISTS (SELECT ...) is refused with the join to write instead"
    ),
    "keyed_min_max": (
        "keyed_max/keyed_min keep the least value among rows whose keys tie and skip a NULL key, so any "
        "batching gives one answer; PipelineDB kept the last row's value on a tie (1001 where ours is 2) and, "
        "when the first row's key was NULL, that row's value for ever (1 where ours is NULL)"
    ),
    "ttl_expiration": (
        "a view's name is a plain lower-case identifier here: the quoted MyTTLCV is refused (write myttlcv); "
        "set_ttl runs as ALTER CONTINUOUS VIEW ... SET (ttl, ttl_column), ttl_expire as the runner's expiry, "
        "and the reads of PipelineDB's matrel and catalog have no meaning here"
    ),
    "output_streams": (
        "(old)/(new) are per committed batch, as issue 25 defines a view's change stream (the harness "
        "applies each INSERT of a case that reads output_of() alone, as PipelineDB's one transaction per "
        "INSERT did); a view over output_of() has no arrival_timestamp of its own and joins no table, so "
        "the view joining os_t0 is refused, the DROP TABLE os_t0 PipelineDB refused drops it here and the "
        "later one finds none; combine() in a plain query merges HyperLogLog and top-K states, and a "
        "view's avg is its value there, not a state; DROP of a view that other views read is refused "
        "naming them (drop them first)"
    ),
    "cont_transform": (
        "an outputfunc that is a trigger function (ct_tg, insert_into_b: PL/pgSQL run per output row inside "
        "PipelineDB's worker) is refused with what to write: a transform's rows reach a stream through "
        "outputfunc = pipelinedb.insert_into_stream('s'), a view through output_of, a topic through a sink; "
        "so the rows those triggers wrote (ct2, ct_stream_insert0) are not there"
    ),
    "create_cont_view": (
        "a view without GROUP BY reads one row before its first event (count 0), as PostgreSQL's own "
        "SELECT count(*) answers, where PipelineDB showed none; a sliding window over an expression "
        "(to_timestamp(x) > clock_timestamp() - ...) is refused with what to write: a timestamptz column; "
        "plain ALTER VIEW ... RENAME / SET SCHEMA of a continuous view is refused (sql/guards.sql): the "
        "harness drops the view and defines it again under the new name, where it starts empty"
    ),
    "cont_view_namespace": (
        "streams have one name here (no schema), and plain ALTER SCHEMA ... RENAME or DROP SCHEMA ... CASCADE "
        "of a schema holding continuous views is refused (sql/guards.sql): drop them with DROP CONTINUOUS VIEW "
        "first (the harness does, before DROP SCHEMA ... CASCADE); the case's view defined again in the "
        "dropped schema (test_cvn_schema0.test_cvn0) is therefore not made"
    ),
    "typed_streams": (
        "a view without aggregates keeps each distinct row, keyed by its columns, and json has no equality in "
        "PostgreSQL: the views showing a json column (stj1, stj3, stj4) are refused with what to write "
        "(the column as jsonb, or ::text)"
    ),
    "first_values": (
        "first_values(n, a, b, ...) over several columns (an array of composite rows) is refused with what to "
        "write: first_values(n) WITHIN GROUP (ORDER BY a, b) of one column, or one call per column; over a "
        "table too, first_values takes one column here"
    ),
}
