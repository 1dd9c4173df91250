-- why: audit events land in one table per shard (a partition of Kafka topic `audit`) and UTC day,
-- created on first write and dropped for retention, and a ctid-block puller copies them into
-- Elasticsearch. These tables are the ledger both sides share: the writer records, in each batch's
-- own transaction, how far it has filled each table; the puller records how far it has indexed.
-- The log tables themselves are made by audit.create_log / audit.ensure_table (sql/functions/audit.sql).

CREATE SCHEMA audit AUTHORIZATION sv_owner;
COMMENT ON SCHEMA audit IS 'Audit log: per-shard, per-day tables, their ledger, and the search puller''s checkpoints.';

CREATE TABLE audit.tables (
    table_name   text        PRIMARY KEY,   -- schema-qualified: audit.shard03_20261122
    log_schema   text        NOT NULL,
    shard        int         NOT NULL CHECK (shard >= 0),
    day          date        NOT NULL,
    hi_block     bigint      NOT NULL DEFAULT 0 CHECK (hi_block >= 0),
    seq          bigint      NOT NULL DEFAULT 0 CHECK (seq >= 0),
    rows         bigint      NOT NULL DEFAULT 0 CHECK (rows >= 0),
    created_at   timestamptz NOT NULL DEFAULT now(),
    committed_at timestamptz,
    UNIQUE (log_schema, shard, day)
);
COMMENT ON TABLE audit.tables IS 'One row per audit table, updated by its single writer in each batch''s transaction.';
COMMENT ON COLUMN audit.tables.hi_block IS 'Highest heap block holding a committed row; later batches only add rows at or above it, or record a rewind.';
COMMENT ON COLUMN audit.tables.seq IS 'Batches committed into the table.';

CREATE TABLE audit.table_rewinds (
    table_name text   NOT NULL REFERENCES audit.tables ON DELETE CASCADE,
    seq        bigint NOT NULL,
    block      bigint NOT NULL CHECK (block >= 0),
    PRIMARY KEY (table_name, seq)
);
COMMENT ON TABLE audit.table_rewinds IS 'Batches whose rows landed below hi_block (free space reused), so the puller re-reads from block.';

CREATE TABLE audit.pull_checkpoints (
    table_name       text        PRIMARY KEY REFERENCES audit.tables ON DELETE CASCADE,
    next_block       bigint      NOT NULL CHECK (next_block >= 0),
    seq              bigint      NOT NULL CHECK (seq >= 0),
    rewind_seq       bigint      NOT NULL DEFAULT 0,
    rows_before      bigint      NOT NULL DEFAULT 0,
    rows_indexed     bigint      NOT NULL DEFAULT 0,
    synced_commit_at timestamptz,
    updated_at       timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE audit.pull_checkpoints IS 'How far the ctid-block puller has indexed each table into Elasticsearch.';
COMMENT ON COLUMN audit.pull_checkpoints.next_block IS 'First block not known to be fully indexed (the last partly filled block is read again).';
COMMENT ON COLUMN audit.pull_checkpoints.seq IS 'Writer batches whose rows are all indexed.';
COMMENT ON COLUMN audit.pull_checkpoints.rows_before IS 'Rows in the blocks before next_block.';

CREATE TABLE audit.index_deletions (
    log_schema text        NOT NULL,
    day        date        NOT NULL,
    dropped_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (log_schema, day)
);
COMMENT ON TABLE audit.index_deletions IS 'Days whose tables retention dropped and whose Elasticsearch index is still to be deleted.';

GRANT USAGE ON SCHEMA audit TO sv_writer, sv_reader, sv_indexer;
GRANT SELECT ON audit.tables, audit.table_rewinds TO sv_writer, sv_reader, sv_indexer;
GRANT SELECT ON audit.pull_checkpoints, audit.index_deletions TO sv_reader;
GRANT SELECT, INSERT, UPDATE ON audit.pull_checkpoints TO sv_indexer;
GRANT SELECT, DELETE ON audit.index_deletions TO sv_indexer;
