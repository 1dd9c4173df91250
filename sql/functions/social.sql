-- The query functions of the social views: each is one primary-key read (friends_who_like: one or
-- two), callable by the read-only role. Unknown ids give 0 or an empty array, never an error or
-- NULL.
-- PL/pgSQL rather than SQL functions where a function reads a table: a SQL function that cannot be
-- inlined is re-planned on every call, while PL/pgSQL keeps its plans for the session.
-- friends_who_like is the exception: its SQL body is one expression, a C call, which PostgreSQL
-- inlines into the calling query.

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

-- Which of the users `uid` follows like object `oid`: following(uid) ∩ likers(oid), each user once,
-- order unspecified. Both reads and the intersection are one C call (pgext/keyed_arrays.c): each
-- read is one probe of the view's unique index under this query's snapshot, with none of the
-- executor start-up, plan lookup and PL/pgSQL frame a statement per read costs, and the arrays meet
-- in a hash set of the smaller, O(m + n), where the seed's `unnest ... INTERSECT` sorts rows of both.
-- The object is read first: most objects have no likers, and then the follow list is not read.
-- A SQL function whose body is one expression is inlined into the calling query, so a call costs
-- the C function's work alone; `python -m loadgen.friends` measures it (docs/performance.md).
CREATE OR REPLACE FUNCTION social.friends_who_like(uid bigint, oid bigint) RETURNS bigint[]
LANGUAGE sql STABLE STRICT PARALLEL RESTRICTED
AS $$
    SELECT streamviews.keyed_arrays_intersection(
        'social.object_likes', oid, 'likers', 'social.user_following', uid, 'following')
$$;

GRANT EXECUTE ON FUNCTION
    social.like_count(bigint), social.likers(bigint), social.liked_objects(bigint),
    social.following(bigint), social.followers(bigint), social.friends_who_like(bigint, bigint)
TO sv_reader, sv_writer;
