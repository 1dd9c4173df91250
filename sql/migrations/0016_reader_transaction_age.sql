-- why: ops.stop_overrunning_reads (migration 0014) bounds a reader's statements and its idle spells
-- in a transaction, but not the transaction: a REPEATABLE READ reader that runs `SELECT 1` every few
-- minutes is never idle for 5 minutes nor busy for 30 s, and holds its snapshot, and with it vacuum's
-- horizon over every table, for as long as it likes. PostgreSQL 15 has no transaction_timeout (17
-- has), so the watchdog gains a third bound, `max_transaction`, on the age of a reader's transaction
-- (pg_stat_activity.xact_start), whether a statement is running in it or it sits idle. A session
-- past it is terminated: cancelling would stop a statement and leave an idle transaction open.
-- The function is replaced with the new argument (a default, like the other two: the stream runner
-- calls it without arguments) and granted as before.

DROP FUNCTION ops.stop_overrunning_reads(interval, interval);

-- ops.stop_overrunning_reads: every reader session past a bound, stopped and returned with what was
-- done and how long it had run. A transaction older than `max_transaction` ends its session first
-- ('terminated old transaction', whatever its state); otherwise a statement running past
-- `max_statement` is cancelled ('cancelled') and a session idle in a transaction past `max_idle` is
-- terminated ('terminated'). SECURITY DEFINER: as the owner, a member of sv_reader (0014).
CREATE FUNCTION ops.stop_overrunning_reads(
    max_statement   interval DEFAULT '30 seconds',
    max_idle        interval DEFAULT '5 minutes',
    max_transaction interval DEFAULT '10 minutes'
) RETURNS TABLE (pid int, action text, running interval)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog
AS $$
DECLARE
    s record;
BEGIN
    -- pg_stat_activity is read once per transaction and then kept: read it afresh, in case the
    -- caller's transaction had already looked.
    PERFORM pg_stat_clear_snapshot();
    FOR s IN
        SELECT a.pid, a.state, a.xact_start, a.query_start, a.state_change
          FROM pg_stat_activity AS a
         WHERE a.usename = 'sv_reader' AND a.backend_type = 'client backend'
    LOOP
        IF s.xact_start IS NOT NULL AND clock_timestamp() - s.xact_start > max_transaction THEN
            PERFORM pg_terminate_backend(s.pid);
            pid := s.pid; action := 'terminated old transaction'; running := clock_timestamp() - s.xact_start;
            RETURN NEXT;
        ELSIF s.state = 'active' AND clock_timestamp() - s.query_start > max_statement THEN
            PERFORM pg_cancel_backend(s.pid);
            pid := s.pid; action := 'cancelled'; running := clock_timestamp() - s.query_start;
            RETURN NEXT;
        ELSIF s.state LIKE 'idle in transaction%' AND clock_timestamp() - s.state_change > max_idle THEN
            PERFORM pg_terminate_backend(s.pid);
            pid := s.pid; action := 'terminated'; running := clock_timestamp() - s.state_change;
            RETURN NEXT;
        END IF;
    END LOOP;
END
$$;

REVOKE ALL ON FUNCTION ops.stop_overrunning_reads(interval, interval, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ops.stop_overrunning_reads(interval, interval, interval) TO sv_writer;
