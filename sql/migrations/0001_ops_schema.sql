-- why: exactly-once delivery stores each consumer's Kafka position in the same transaction as the
-- rows it produced, so every pipeline needs one shared, writer-owned place for offsets. The `ops`
-- schema (created by the migration runner, which keeps its ledger there) holds such operational
-- state; query users (sv_reader) never see it.

COMMENT ON SCHEMA ops IS 'Operational state of the pipelines: Kafka offsets, checkpoints, migrations.';

-- The next offset to consume, per consumer group and partition: a consumer seeks here on assignment.
CREATE TABLE ops.kafka_offsets (
    group_id    text        NOT NULL,
    topic       text        NOT NULL,
    partition   integer     NOT NULL CHECK (partition >= 0),
    next_offset bigint      NOT NULL CHECK (next_offset >= 0),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_id, topic, partition)
);
COMMENT ON TABLE ops.kafka_offsets IS
    'Next Kafka offset per (group, topic, partition), written in the same transaction as the data.';

GRANT USAGE ON SCHEMA ops TO sv_writer, sv_indexer;
GRANT SELECT, INSERT, UPDATE ON ops.kafka_offsets TO sv_writer;

-- True when TimescaleDB is installed in this database: the one test schema code uses to choose
-- hypertables over native partitioning.
CREATE FUNCTION ops.has_timescaledb() RETURNS boolean
LANGUAGE sql STABLE
AS $$ SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'timescaledb') $$;
