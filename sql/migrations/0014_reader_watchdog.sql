-- why: the reader role's statement_timeout and idle_in_transaction_session_timeout (ROLE_TIMEOUTS in
-- pipelines/settings.py) are only defaults: a session may SET them off and then run a query that pins
-- a core without end (a pathological regex, a huge generate_series), or sit idle in a transaction
-- holding back vacuum. PostgreSQL cannot forbid those SETs to a role, so this function, which the
-- stream runner calls at every housekeeping round (PIPELINE_EXPIRE_INTERVAL_S, 60 s by default),
-- cancels reader statements running past `max_statement` and ends reader sessions idle in a
-- transaction past `max_idle`. Both bounds sit well above the role defaults, so it only ever meets
-- sessions that lifted them. It runs as the owner, which dbsetup makes a member of sv_reader: that
-- membership is what lets it see those sessions in pg_stat_activity and signal them, and nothing more.

CREATE FUNCTION ops.stop_overrunning_reads(
    max_statement interval DEFAULT '30 seconds',
    max_idle      interval DEFAULT '5 minutes'
) RETURNS TABLE (pid int, action text, running interval)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog
AS $$
DECLARE
    s record;
BEGIN
    FOR s IN
        SELECT a.pid, a.state, a.query_start, a.state_change
          FROM pg_stat_activity AS a
         WHERE a.usename = 'sv_reader' AND a.backend_type = 'client backend'
    LOOP
        IF s.state = 'active' AND clock_timestamp() - s.query_start > max_statement THEN
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

REVOKE ALL ON FUNCTION ops.stop_overrunning_reads(interval, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION ops.stop_overrunning_reads(interval, interval) TO sv_writer;
