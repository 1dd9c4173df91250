-- why: a Kafka topic deleted and created again under the same name starts its offsets from 0, but
-- a consumer group's stored position still pointed into the old topic: a runner restarted after
-- the recreation resumed at the old offset and silently skipped the new topic's first records
-- (or all of them). Kafka gives every topic a unique id (KIP-516); the id of the topic a position
-- was stored for is now kept beside it, and a consumer that finds the topic's id changed reads the
-- new topic from its beginning, logs it and counts it (streamviews_topic_recreations_total).

ALTER TABLE ops.kafka_offsets ADD COLUMN topic_id text;
COMMENT ON COLUMN ops.kafka_offsets.topic_id IS
    'Kafka''s id of the topic the offset belongs to; NULL: stored before it was kept (or never known).';
