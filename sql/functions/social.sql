-- The query functions of the social views: each is one primary-key read (friends_who_like: two),
-- callable by the read-only role. Unknown ids give 0 or an empty array, never an error or NULL.
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
-- unspecified). The object is read first: most objects asked about have no likes, and then the
-- follow list (often the larger row) is never read. Small pairs are compared directly, larger ones
-- through a hashed INTERSECT, linear in their sizes.
CREATE OR REPLACE FUNCTION social.friends_who_like(uid bigint, oid bigint) RETURNS bigint[]
LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE
AS $$
DECLARE
    fans bigint[];
    friends bigint[];
BEGIN
    SELECT v.likers INTO fans FROM social.object_likes AS v WHERE v.oid = $2;
    IF fans IS NULL THEN
        RETURN '{}';
    END IF;
    SELECT v.following INTO friends FROM social.user_following AS v WHERE v.uid = $1;
    IF friends IS NULL THEN
        RETURN '{}';
    END IF;
    IF cardinality(friends) * cardinality(fans) <= 4096 THEN
        RETURN ARRAY(SELECT f FROM unnest(friends) AS f WHERE f = ANY (fans));
    END IF;
    RETURN ARRAY(SELECT f FROM unnest(friends) AS f INTERSECT SELECT l FROM unnest(fans) AS l);
END
$$;

GRANT EXECUTE ON FUNCTION
    social.like_count(bigint), social.likers(bigint), social.liked_objects(bigint),
    social.following(bigint), social.followers(bigint), social.friends_who_like(bigint, bigint)
TO sv_reader, sv_writer;
