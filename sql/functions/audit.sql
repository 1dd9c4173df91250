-- The audit log's functions: creating the per-shard, per-day tables (writer), recording how far
-- each batch filled them (writer), retention (puller service / retention command), and the
-- queries of the read-only role. Identifiers are composed from integers, dates and a validated
-- schema name with format('%I'); no event content ever reaches dynamic SQL.

-- audit.block_of: the heap block of a tuple id ("line number" = block + offset).
CREATE OR REPLACE FUNCTION audit.block_of(t tid) RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT ((t::text)::point)[0]::bigint $$;

-- audit.check_log_schema: a log's schema name, validated, or an error naming it.
CREATE OR REPLACE FUNCTION audit.check_log_schema(log_schema text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT
AS $$
BEGIN
    IF log_schema !~ '^[a-z_][a-z0-9_]{0,62}$' THEN
        RAISE EXCEPTION 'audit: log schema name % must match ^[a-z_][a-z0-9_]{0,62}$', quote_literal(log_schema)
            USING ERRCODE = 'invalid_schema_name';
    END IF;
    RETURN log_schema;
END
$$;

-- audit.create_log: one audit log = a schema with the partitioned parent `<schema>.events`.
-- Level 1 is the shard (LIST), level 2 the UTC day (RANGE on ts), so a query on the parent prunes
-- by time. Indexes declared on the parent exist on every table: BRIN on ts (tiny, rows arrive in
-- time order) and a B-tree on (uid, ts) for a user's rows in a time range, paged in ts order.
-- Idempotent; dbsetup creates the `audit` log, tests create throwaway ones.
CREATE OR REPLACE FUNCTION audit.create_log(log_schema text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM audit.check_log_schema(log_schema);
    EXECUTE format('CREATE SCHEMA IF NOT EXISTS %I', log_schema);
    EXECUTE format(
        'CREATE TABLE IF NOT EXISTS %I.events ('
        '    shard   smallint    NOT NULL,'
        '    ts      timestamptz NOT NULL,'
        '    uid     bigint      NOT NULL,'
        '    content text        NOT NULL,'
        '    fields  jsonb'
        ') PARTITION BY LIST (shard)', log_schema);
    EXECUTE format('COMMENT ON TABLE %I.events IS %L', log_schema,
        'Audit events; one table per shard (Kafka partition) and UTC day. fields: the optional string fields.');
    EXECUTE format('CREATE INDEX IF NOT EXISTS events_ts_brin ON %I.events USING brin (ts)', log_schema);
    EXECUTE format('CREATE INDEX IF NOT EXISTS events_uid_ts ON %I.events (uid, ts)', log_schema);
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO sv_writer, sv_reader, sv_indexer', log_schema);
    EXECUTE format('GRANT SELECT ON %I.events TO sv_reader, sv_indexer', log_schema);
END
$$;

-- audit.table_name: the schema-qualified name of a shard's table for a day, e.g. audit.shard03_20261122.
CREATE OR REPLACE FUNCTION audit.table_name(log_schema text, shard int, day date) RETURNS text
LANGUAGE sql IMMUTABLE STRICT
AS $$ SELECT format('%s.shard%s_%s', log_schema, lpad(shard::text, 2, '0'), to_char(day, 'YYYYMMDD')) $$;

-- audit.ensure_table: the table of (shard, day), created on first use and registered in
-- audit.tables. Called by the shard's writer inside its batch transaction, so a table and the
-- batch that needed it commit together. Creating a partition locks its parent briefly; creators
-- of one log take turns on an advisory lock, and a lock wait over 10 s fails the batch (retried).
CREATE OR REPLACE FUNCTION audit.ensure_table(log_schema text, shard int, day date) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET lock_timeout = '10s'
AS $$
DECLARE
    qualified text := audit.table_name(audit.check_log_schema(log_schema), shard, day);
    sub text := format('events_shard%s', lpad(shard::text, 2, '0'));
    leaf text := split_part(qualified, '.', 2);
BEGIN
    IF shard < 0 OR shard > 32767 THEN
        RAISE EXCEPTION 'audit.ensure_table: shard % out of range', shard;
    END IF;
    IF EXISTS (SELECT 1 FROM audit.tables t WHERE t.table_name = qualified) THEN
        RETURN qualified;
    END IF;
    IF to_regclass(format('%I.events', log_schema)) IS NULL THEN
        RAISE EXCEPTION 'audit.ensure_table: no audit log in schema % (SELECT audit.create_log(...))', log_schema;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('audit.ensure_table'), hashtext(log_schema));
    IF EXISTS (SELECT 1 FROM audit.tables t WHERE t.table_name = qualified) THEN
        RETURN qualified;
    END IF;
    EXECUTE format('CREATE TABLE IF NOT EXISTS %I.%I PARTITION OF %I.events FOR VALUES IN (%s) PARTITION BY RANGE (ts)',
        log_schema, sub, log_schema, shard);
    EXECUTE format('CREATE TABLE %I.%I PARTITION OF %I.%I FOR VALUES FROM (%L) TO (%L)',
        log_schema, leaf, log_schema, sub,
        to_char(day, 'YYYY-MM-DD') || ' 00:00:00+00', to_char(day + 1, 'YYYY-MM-DD') || ' 00:00:00+00');
    EXECUTE format('GRANT INSERT, SELECT ON %I.%I TO sv_writer', log_schema, leaf);
    EXECUTE format('GRANT SELECT ON %I.%I TO sv_reader, sv_indexer', log_schema, leaf);
    INSERT INTO audit.tables (table_name, log_schema, shard, day) VALUES (qualified, log_schema, shard, day);
    RETURN qualified;
END
$$;

-- audit.record_batch: called by the writer right after it COPYed `copied` rows into `tbl`, in the
-- same transaction. It finds where those rows landed with a TID range scan from the table's
-- hi_block up (only this batch's blocks) and raises hi_block to the highest one. Rows landing below
-- hi_block (free space reused after vacuum cleaned an aborted batch) are recorded as a rewind, so
-- the puller reads that part again; see pipelines/audit/puller.py for why this leaves no holes.
CREATE OR REPLACE FUNCTION audit.record_batch(tbl text, copied bigint) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    entry audit.tables;
    landed bigint;
    top tid;
    low tid;
BEGIN
    SELECT * INTO entry FROM audit.tables WHERE table_name = tbl FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'audit.record_batch: % is not a registered audit table', tbl;
    END IF;
    EXECUTE format('SELECT count(*), max(ctid) FROM %s WHERE ctid >= $1 AND xmin = pg_current_xact_id()::xid',
        tbl::regclass)
        INTO landed, top USING format('(%s,0)', entry.hi_block)::tid;
    IF landed < copied THEN
        EXECUTE format('SELECT min(ctid) FROM %s WHERE xmin = pg_current_xact_id()::xid', tbl::regclass) INTO low;
        INSERT INTO audit.table_rewinds (table_name, seq, block) VALUES (tbl, entry.seq + 1, audit.block_of(low));
    END IF;
    UPDATE audit.tables
       SET hi_block = greatest(hi_block, coalesce(audit.block_of(top), 0)),
           seq = seq + 1,
           rows = rows + copied,
           committed_at = clock_timestamp()
     WHERE table_name = tbl
    RETURNING hi_block INTO entry.hi_block;
    RETURN entry.hi_block;
END
$$;

-- audit.drop_expired: retention. Drops a log's tables of days before `before` and queues their
-- days in audit.index_deletions, in one transaction, so the Elasticsearch side is deleted even if
-- the process dies right after. Returns the tables dropped. A `before` later than the log's
-- configured retention allows (audit.retention; 30 days when the log has no row) is refused.
CREATE OR REPLACE FUNCTION audit.drop_expired(log_schema text, before date) RETURNS SETOF text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET lock_timeout = '30s'
AS $$
DECLARE
    entry audit.tables;
    kept integer;
BEGIN
    PERFORM audit.check_log_schema(log_schema);
    SELECT r.days INTO kept FROM audit.retention r WHERE r.log_schema = drop_expired.log_schema;
    -- Days are UTC days, like the tables'.
    IF before > (now() AT TIME ZONE 'UTC')::date - coalesce(kept, 30) THEN
        RAISE EXCEPTION 'audit.drop_expired: log % keeps % days: nothing from % on may be dropped (asked: before %)',
            log_schema, coalesce(kept, 30), (now() AT TIME ZONE 'UTC')::date - coalesce(kept, 30), before
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    FOR entry IN
        SELECT * FROM audit.tables t WHERE t.log_schema = drop_expired.log_schema AND t.day < before
        ORDER BY t.day, t.shard
    LOOP
        EXECUTE format('DROP TABLE IF EXISTS %I.%I', entry.log_schema, split_part(entry.table_name, '.', 2));
        DELETE FROM audit.tables WHERE table_name = entry.table_name;
        INSERT INTO audit.index_deletions (log_schema, day) VALUES (entry.log_schema, entry.day)
            ON CONFLICT DO NOTHING;
        RETURN NEXT entry.table_name;
    END LOOP;
END
$$;

-- audit.check_pattern: a search's regex, or an error if it holds a back-reference (\1 to \9, or
-- \k<name>, which PostgreSQL does not have). A back-reference takes the regex engine off its
-- automaton onto backtracking: `(.*)(.*)\2\1 $` spends half a second on one 512-character content,
-- and a user's day of rows runs to the statement timeout. Refused up front instead, in one line, as
-- invalid_regular_expression (2201B). Conservative: a backslash-digit escape inside brackets is
-- refused too; a pattern that opens with ***= is a literal string and passes.
CREATE OR REPLACE FUNCTION audit.check_pattern(pattern text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
DECLARE
    reference text := substring(pattern FROM '(?:^|[^\\])(?:\\\\)*(\\(?:[1-9]|k))');
BEGIN
    IF reference IS NOT NULL AND left(pattern, 4) <> '***=' THEN
        RAISE EXCEPTION 'audit: pattern "%" has a back-reference (%), which the regex engine cannot bound; search without it',
            replace(pattern, E'\n', ' '), reference
            USING ERRCODE = 'invalid_regular_expression';
    END IF;
    RETURN pattern;
END
$$;

-- audit.user_events_filter: the WHERE clause user_events, user_events_estimate and user_events_count
-- share, over parameters $1 user_id, $2 since, $3 until, $4 contains, $5 pattern. (EXECUTE ... USING
-- plans with the values, so the NULL tests fold away and the estimate sees the same predicate.)
CREATE OR REPLACE FUNCTION audit.user_events_filter() RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
SELECT ' WHERE e.uid = $1 AND e.ts >= $2 AND e.ts < $3'
       '   AND ($4::text IS NULL OR strpos(lower(e.content), lower($4)) > 0)'
       '   AND ($5::text IS NULL OR e.content ~* $5)'
$$;

-- audit.user_events: a user's (user_id) audit rows in [since, until), ordered by ts, one page at a time.
-- `contains` is a case-insensitive substring, `pattern` a case-insensitive POSIX regex without
-- back-references (audit.check_pattern); either may be NULL. Paging is keyset: pass the
-- `next_cursor` of a page's last row as `after` to get the next page; rows are ordered by (ts,
-- table, ctid), a total order, so pages neither overlap nor skip rows, however many share a
-- timestamp.
CREATE OR REPLACE FUNCTION audit.user_events(
    user_id bigint,
    since timestamptz,
    until timestamptz,
    contains text DEFAULT NULL,
    pattern text DEFAULT NULL,
    after text DEFAULT NULL,
    page_size int DEFAULT 50,
    log_schema text DEFAULT 'audit'
) RETURNS TABLE (ts timestamptz, uid bigint, content text, fields jsonb, pg_table text, pg_ctid tid, next_cursor text)
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    after_ts timestamptz;
    after_table oid;
    after_ctid tid;
BEGIN
    IF page_size NOT BETWEEN 1 AND 10000 THEN
        RAISE EXCEPTION 'audit.user_events: page_size % is not between 1 and 10000', page_size;
    END IF;
    IF after IS NOT NULL THEN
        BEGIN
            after_ts := split_part(after, '|', 1)::timestamptz;
            after_table := split_part(after, '|', 2)::oid;
            after_ctid := split_part(after, '|', 3)::tid;
        EXCEPTION WHEN others THEN
            RAISE EXCEPTION 'audit.user_events: % is not a cursor returned by this function', quote_literal(after);
        END;
    END IF;
    RETURN QUERY EXECUTE format(
        'SELECT e.ts, e.uid, e.content, e.fields, e.tableoid::regclass::text, e.ctid,'
        '       to_char(e.ts AT TIME ZONE ''UTC'', ''YYYY-MM-DD"T"HH24:MI:SS.US"Z"'') || ''|'' || e.tableoid || ''|'' || e.ctid'
        '  FROM %I.events e %s'
        '   AND ($6::timestamptz IS NULL OR (e.ts >= $6 AND (e.ts, e.tableoid, e.ctid) > ($6, $7, $8)))'
        ' ORDER BY e.ts, e.tableoid, e.ctid'
        ' LIMIT $9', audit.check_log_schema(log_schema), audit.user_events_filter())
        USING user_id, since, until, contains, audit.check_pattern(pattern), after_ts, after_table, after_ctid, page_size;
END
$$;

-- audit.user_events_estimate: how many rows audit.user_events would page through, from the
-- planner's statistics (EXPLAIN), in about a millisecond: for "about N results" and page counts.
CREATE OR REPLACE FUNCTION audit.user_events_estimate(
    user_id bigint,
    since timestamptz,
    until timestamptz,
    contains text DEFAULT NULL,
    pattern text DEFAULT NULL,
    log_schema text DEFAULT 'audit'
) RETURNS bigint
LANGUAGE plpgsql VOLATILE  -- EXPLAIN is only allowed in volatile functions
AS $$
DECLARE
    plan json;
BEGIN
    EXECUTE format('EXPLAIN (FORMAT JSON) SELECT 1 FROM %I.events e %s',
        audit.check_log_schema(log_schema), audit.user_events_filter())
        INTO plan USING user_id, since, until, contains, audit.check_pattern(pattern);
    RETURN (plan -> 0 -> 'Plan' ->> 'Plan Rows')::numeric::bigint;
END
$$;

-- audit.user_events_count: the exact count of the same rows (reads them all; the estimate is cheap).
CREATE OR REPLACE FUNCTION audit.user_events_count(
    user_id bigint,
    since timestamptz,
    until timestamptz,
    contains text DEFAULT NULL,
    pattern text DEFAULT NULL,
    log_schema text DEFAULT 'audit'
) RETURNS bigint
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    n bigint;
BEGIN
    EXECUTE format(
        'SELECT count(*) FROM %I.events e %s', audit.check_log_schema(log_schema), audit.user_events_filter())
        INTO n USING user_id, since, until, contains, audit.check_pattern(pattern);
    RETURN n;
END
$$;

REVOKE ALL ON FUNCTION audit.create_log(text), audit.ensure_table(text, int, date),
    audit.record_batch(text, bigint), audit.drop_expired(text, date) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION audit.ensure_table(text, int, date), audit.record_batch(text, bigint) TO sv_writer;
GRANT EXECUTE ON FUNCTION audit.drop_expired(text, date) TO sv_indexer;

-- The default log, written by `python -m pipelines.audit.writer` and pulled by `python -m pipelines.audit.puller`.
SELECT audit.create_log('audit');
