-- The social streams and views, maintained by the continuous-view engine (pipelines.cv).
-- Applied by dbsetup on every start; an unchanged definition is left as it is.

-- A like is a member of the set of (object, user) pairs: liking twice changes nothing, an unlike
-- removes the pair. Events: Kafka topic `likes`, key = object id.
CREATE STREAM likes (oid bigint, uid bigint, ts timestamptz)
    WITH (topic = 'likes', key = 'oid, uid');

-- Following likewise: the set of (follower, followed) pairs. Events: topic `follows`, key = follower.
CREATE STREAM follows (uid bigint, target bigint, ts timestamptz)
    WITH (topic = 'follows', key = 'uid, target');

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
