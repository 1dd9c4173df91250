-- Extensions the schema relies on, and the grants only the superuser can make. Run by the superuser
-- (none of the extensions is trusted) before the migrations, on every `dbsetup`; each statement is
-- idempotent.

-- hll: approximate distinct counts whose merges are commutative and idempotent (replays are harmless).
CREATE EXTENSION IF NOT EXISTS hll;

-- rum: GIN-like indexes that also carry ordering information (ranked text search, "@>" on arrays).
CREATE EXTENSION IF NOT EXISTS rum;

-- tdigest: approximate percentiles (percentile_cont in continuous views) from digests that merge.
CREATE EXTENSION IF NOT EXISTS tdigest;

-- streamviews: the project's own C functions (pgext/), for the query functions' hot reads
-- (social.friends_who_like). Built and installed by `python -m stack up` or the postgres image;
-- UPDATE moves a database to the installed version. Every role calling the query functions needs
-- the schema; the functions check permissions on the relations they read themselves.
CREATE EXTENSION IF NOT EXISTS streamviews;
ALTER EXTENSION streamviews UPDATE;
GRANT USAGE ON SCHEMA streamviews TO sv_owner, sv_writer, sv_reader;
-- lower_backend_priority (1.8): for the roles a stream runner and its backfill connect as only. A
-- backend's nice value lasts as long as it does, which behind a pooler outlives the client.
GRANT EXECUTE ON FUNCTION streamviews.lower_backend_priority(integer) TO sv_owner, sv_writer;

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

-- Advisory locks for the roles doing the work only. The pipelines, the puller and retention
-- serialise on advisory locks; any role could otherwise take the same key (they show in pg_locks)
-- and hold every batch until it lets go. Functions of pg_catalog keep their grants per database,
-- so this holds in this database only.
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure FROM pg_proc p
        WHERE p.pronamespace = 'pg_catalog'::regnamespace
          AND p.proname ~ '^pg_(try_)?advisory_(xact_)?lock(_shared)?$'
    LOOP
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO sv_owner, sv_writer, sv_indexer', f);
    END LOOP;
END
$$;
