-- why: audit.drop_expired(log, before) dropped whatever tables were older than `before`, so the
-- indexer role, which runs retention, could drop today's audit data by passing a date in the future.
-- The retention each log keeps now lives here, written by dbsetup from AUDIT_RETENTION_DAYS (the
-- owner's side), and drop_expired refuses a `before` that would cut into it.

CREATE TABLE audit.retention (
    log_schema text PRIMARY KEY,
    days       integer NOT NULL CHECK (days > 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE audit.retention IS
    'Days of audit rows each log keeps: audit.drop_expired never drops a younger table (set by dbsetup).';

GRANT SELECT ON audit.retention TO sv_indexer;
