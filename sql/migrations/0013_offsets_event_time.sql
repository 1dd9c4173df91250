-- why: operators ask how fresh each stream's views are, and `make status` / `streamviews status`
-- must answer from PostgreSQL alone (no Prometheus needed). The newest Kafka timestamp a consumer
-- group committed per partition is stored with its offset, in the batch's own transaction, so it
-- is exactly as durable as the views it describes and survives restarts.

ALTER TABLE ops.kafka_offsets ADD COLUMN last_event_at timestamptz;
COMMENT ON COLUMN ops.kafka_offsets.last_event_at IS
    'Newest Kafka timestamp of the records committed in the partition (the producer''s CreateTime unless the topic uses LogAppendTime); NULL: none carried one yet.';
