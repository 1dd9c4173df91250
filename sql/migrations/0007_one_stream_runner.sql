-- why: the per-topic pipelines (likes, follows, cdc_likes, cdc_follows), each in its own consumer
-- group, are replaced by one stream runner that consumes every declared stream in the group
-- `streamviews-streams`. The offsets they stored are where the runner must resume, or it would read
-- those topics again from the start (harmless for the keyed streams' state, but not for HyperLogLog
-- sketches, which cannot forget a replayed like). Their dead-letter counts move along with them.

INSERT INTO ops.kafka_offsets (group_id, topic, partition, next_offset, updated_at)
SELECT 'streamviews-streams', topic, partition, next_offset, updated_at
FROM ops.kafka_offsets
WHERE group_id IN ('streamviews-likes', 'streamviews-follows', 'streamviews-cdc_likes', 'streamviews-cdc_follows')
ON CONFLICT (group_id, topic, partition) DO NOTHING;

INSERT INTO ops.dead_letters (group_id, topic, reason, count, last_at)
SELECT 'streamviews-streams', topic, reason, sum(count), max(last_at)
FROM ops.dead_letters
WHERE group_id IN ('streamviews-likes', 'streamviews-follows', 'streamviews-cdc_likes', 'streamviews-cdc_follows')
GROUP BY topic, reason
ON CONFLICT (group_id, topic, reason) DO UPDATE SET count = ops.dead_letters.count + excluded.count;

DELETE FROM ops.kafka_offsets
WHERE group_id IN ('streamviews-likes', 'streamviews-follows', 'streamviews-cdc_likes', 'streamviews-cdc_follows');
DELETE FROM ops.dead_letters
WHERE group_id IN ('streamviews-likes', 'streamviews-follows', 'streamviews-cdc_likes', 'streamviews-cdc_follows');
