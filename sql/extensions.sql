-- Extensions the schema relies on. Run by the superuser (none is a trusted extension) before the
-- migrations, on every `dbsetup`; each statement is idempotent.

-- hll: approximate distinct counts whose merges are commutative and idempotent (replays are harmless).
CREATE EXTENSION IF NOT EXISTS hll;

-- rum: GIN-like indexes that also carry ordering information (ranked text search, "@>" on arrays).
CREATE EXTENSION IF NOT EXISTS rum;

-- tdigest: approximate percentiles (percentile_cont in continuous views) from digests that merge.
CREATE EXTENSION IF NOT EXISTS tdigest;

-- TimescaleDB when the server offers it (production image) and preloads it; plain PostgreSQL otherwise.
-- Schema code asks `ops.has_timescaledb()` instead of repeating this test.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'timescaledb')
       AND current_setting('shared_preload_libraries') LIKE '%timescaledb%' THEN
        CREATE EXTENSION IF NOT EXISTS timescaledb;
    END IF;
END
$$;
