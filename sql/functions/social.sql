-- The query functions of the social views: each is one primary-key read (friends_who_like: two, in
-- one statement), callable by the read-only role. Unknown ids give 0 or an empty array, never an
-- error or NULL.
-- PL/pgSQL rather than SQL functions: a non-inlined SQL function is re-planned on every call, while
-- PL/pgSQL keeps its plans for the session.

-- How many users like object `oid`.
CREATE OR REPLACE FUNCTION social.like_count(oid bigint) RETURNS bigint
LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE
AS $$
DECLARE n bigint;
BEGIN
    SELECT v.like_count INTO n FROM social.object_likes AS v WHERE v.oid = $1;
    RETURN coalesce(n, 0);
END
$$;

-- The users who like object `oid`.
CREATE OR REPLACE FUNCTION social.likers(oid bigint) RETURNS bigint[]
LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE
AS $$
DECLARE ids bigint[];
BEGIN
    SELECT v.likers INTO ids FROM social.object_likes AS v WHERE v.oid = $1;
    RETURN coalesce(ids, '{}');
END
$$;

-- The objects user `uid` likes.
CREATE OR REPLACE FUNCTION social.liked_objects(uid bigint) RETURNS bigint[]
LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE
AS $$
DECLARE ids bigint[];
BEGIN
    SELECT v.liked_objects INTO ids FROM social.user_likes AS v WHERE v.uid = $1;
    RETURN coalesce(ids, '{}');
END
$$;

-- The users `uid` follows.
CREATE OR REPLACE FUNCTION social.following(uid bigint) RETURNS bigint[]
LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE
AS $$
DECLARE ids bigint[];
BEGIN
    SELECT v.following INTO ids FROM social.user_following AS v WHERE v.uid = $1;
    RETURN coalesce(ids, '{}');
END
$$;

-- The users who follow `uid`.
CREATE OR REPLACE FUNCTION social.followers(uid bigint) RETURNS bigint[]
LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE
AS $$
DECLARE ids bigint[];
BEGIN
    SELECT v.followers INTO ids FROM social.user_followers AS v WHERE v.uid = $1;
    RETURN coalesce(ids, '{}');
END
$$;

-- Which of the users `uid` follows like object `oid`: following(uid) ∩ likers(oid), as a set (order
-- unspecified). Both rows are read in one statement: each statement adds to a PL/pgSQL call a good
-- part of what a primary-key read costs. When either array is small, which is nearly always (most
-- objects have a few likers, most users follow fewer than 100), each element of the smaller one is
-- looked up in the larger: no rows are built from the larger array, which for a user who follows
-- thousands would cost more than both reads. Two large arrays go through a hashed INTERSECT, linear
-- in their sizes.
CREATE OR REPLACE FUNCTION social.friends_who_like(uid bigint, oid bigint) RETURNS bigint[]
LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE
AS $$
DECLARE
    fans bigint[];
    friends bigint[];
BEGIN
    SELECT v.likers, u.following INTO fans, friends
      FROM social.object_likes AS v, social.user_following AS u
     WHERE v.oid = $2 AND u.uid = $1;
    IF fans IS NULL OR friends IS NULL THEN
        RETURN '{}';
    ELSIF least(cardinality(fans), cardinality(friends)) > 32 THEN
        RETURN ARRAY(SELECT l FROM unnest(fans) AS l INTERSECT SELECT f FROM unnest(friends) AS f);
    ELSIF cardinality(fans) <= cardinality(friends) THEN
        RETURN ARRAY(SELECT l FROM unnest(fans) AS l WHERE l = ANY (friends));
    END IF;
    RETURN ARRAY(SELECT f FROM unnest(friends) AS f WHERE f = ANY (fans));
END
$$;

GRANT EXECUTE ON FUNCTION
    social.like_count(bigint), social.likers(bigint), social.liked_objects(bigint),
    social.following(bigint), social.followers(bigint), social.friends_who_like(bigint, bigint)
TO sv_reader, sv_writer;
