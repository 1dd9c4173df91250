-- The social streams and views, maintained by the continuous-view engine (pipelines.cv).
-- Applied by dbsetup on every start; an unchanged definition is left as it is.

-- A like is a member of the set of (object, user) pairs: liking twice changes nothing, an unlike
-- removes the pair. Events: Kafka topic `likes`, record key = the object id as text, JSON
-- {"oid": 42, "uid": 7, "ts": "2026-11-22T10:00:00Z", "action": "like" | "unlike"}; without `ts` the
-- record's timestamp is taken, without `action` it is a like.
CREATE STREAM likes (
    oid bigint NOT NULL CONSTRAINT id_out_of_range CHECK (oid > 0),
    uid bigint NOT NULL CONSTRAINT id_out_of_range CHECK (uid > 0),
    ts  timestamptz NOT NULL
) WITH (
    topic = 'likes', key = 'oid, uid', kafka_key = 'oid',
    action_field = 'action', insert_actions = 'like', delete_actions = 'unlike',
    timestamp_column = 'ts', max_event_bytes = '4096'
);

-- Following likewise: the set of (follower, followed) pairs. Events: topic `follows`, record key =
-- the follower, {"uid": 7, "target": 42, "ts": ..., "action": "follow" | "unfollow"}.
CREATE STREAM follows (
    uid    bigint NOT NULL CONSTRAINT id_out_of_range CHECK (uid > 0),
    target bigint NOT NULL CONSTRAINT id_out_of_range CHECK (target > 0),
    ts     timestamptz NOT NULL,
    CONSTRAINT self_follow CHECK (uid <> target)
) WITH (
    topic = 'follows', key = 'uid, target', kafka_key = 'uid',
    action_field = 'action', insert_actions = 'follow', delete_actions = 'unfollow',
    timestamp_column = 'ts', max_event_bytes = '4096'
);

-- Rows of app.likes, captured by Debezium (connectors/app-social.json), feed the same stream: an
-- insert (or a snapshot read) is a like, a delete an unlike. A delete's row image holds only the key;
-- `created_at` then takes the commit time.
CREATE STREAM app_likes (
    oid        bigint NOT NULL CONSTRAINT id_out_of_range CHECK (oid > 0),
    uid        bigint NOT NULL CONSTRAINT id_out_of_range CHECK (uid > 0),
    created_at timestamptz NOT NULL
) WITH (topic = 'cdc.app.likes', format = 'debezium', into = 'likes', timestamp_column = 'created_at');

-- Rows of app.follows likewise, into the follows stream.
CREATE STREAM app_follows (
    uid        bigint NOT NULL CONSTRAINT id_out_of_range CHECK (uid > 0),
    target     bigint NOT NULL CONSTRAINT id_out_of_range CHECK (target > 0),
    created_at timestamptz NOT NULL,
    CONSTRAINT self_follow CHECK (uid <> target)
) WITH (topic = 'cdc.app.follows', format = 'debezium', into = 'follows', timestamp_column = 'created_at');

-- Who likes an object, and how many.
CREATE CONTINUOUS VIEW social.object_likes AS
    SELECT oid, count(*) AS like_count, array_agg(DISTINCT uid) AS likers
    FROM likes GROUP BY oid;

-- What a user likes.
CREATE CONTINUOUS VIEW social.user_likes AS
    SELECT uid, array_agg(DISTINCT oid) AS liked_objects
    FROM likes GROUP BY uid;

-- Whom a user follows.
CREATE CONTINUOUS VIEW social.user_following AS
    SELECT uid, array_agg(DISTINCT target) AS following
    FROM follows GROUP BY uid;

-- Who follows a user.
CREATE CONTINUOUS VIEW social.user_followers AS
    SELECT target AS uid, array_agg(DISTINCT uid) AS followers
    FROM follows GROUP BY target;

-- Likes per object and hour, with an approximate count of distinct likers (HyperLogLog: merging
-- is idempotent; an unlike lowers `likes` but cannot be removed from the sketch). Kept 30 days.
CREATE CONTINUOUS VIEW social.object_likes_hourly WITH (ttl = '30 days') AS
    SELECT oid, date_trunc('hour', ts) AS hour, count(*) AS likes,
           hll_add_agg(hll_hash_bigint(uid)) AS likers_hll
    FROM likes GROUP BY oid, hour;
