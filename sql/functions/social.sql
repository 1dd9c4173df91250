-- The query functions of the social views: each is one primary-key read (friends_who_like: one or
-- two), callable by the read-only role. Unknown ids give 0 or an empty array, never an error or
-- NULL.
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
-- unspecified). The object is read first: most objects have no likers, and then the answer is
-- known after one primary-key read, as cheap as like_count. Otherwise, with m the smaller array's
-- size and n the larger's (measured with `python -m loadgen.bench_friends`, README):
-- - m <= 6 or m * n <= 5,000 (nearly every call: a few likers, or fewer than 100 follows): `&&`
--   first, in C and without a statement, because friends who like are rare; when some are found,
--   each element of the smaller array is compared with the larger one (= ANY);
-- - otherwise (the heavy tail: thousands of follows and of likers, where m * n comparisons or the
--   seed's INTERSECT, which makes rows of both arrays, cost milliseconds): a statement planned for
--   this call (EXECUTE), in which the larger array is a constant, so that PostgreSQL (14+) hashes
--   `= ANY (constant)` once, in C, and probes it with each element of the smaller: O(m + n). The
--   probe is an aggregate's FILTER, not a WHERE clause (whose selectivity estimate would visit
--   every element of the constant), and the smaller array is unnested in the select list (streamed,
--   not first stored as unnest in FROM is). The bounds are where planning per call starts to pay.
CREATE OR REPLACE FUNCTION social.friends_who_like(uid bigint, oid bigint) RETURNS bigint[]
LANGUAGE plpgsql STABLE STRICT PARALLEL SAFE
AS $$
DECLARE
    fans bigint[];
    friends bigint[];
    small bigint[];
    large bigint[];
    common bigint[];
BEGIN
    SELECT v.likers INTO fans FROM social.object_likes AS v WHERE v.oid = $2;
    IF fans IS NULL THEN
        RETURN '{}'::bigint[];
    END IF;
    SELECT u.following INTO friends FROM social.user_following AS u WHERE u.uid = $1;
    IF friends IS NULL THEN
        RETURN '{}'::bigint[];
    ELSIF cardinality(fans) <= cardinality(friends) THEN
        small := fans;
        large := friends;
    ELSE
        small := friends;
        large := fans;
    END IF;
    IF cardinality(small) <= 6 OR cardinality(small)::bigint * cardinality(large) <= 5000 THEN
        IF NOT small && large THEN
            RETURN '{}'::bigint[];
        END IF;
        RETURN ARRAY(SELECT x FROM unnest(small) AS x WHERE x = ANY (large));
    END IF;
    EXECUTE 'SELECT coalesce(array_agg(x) FILTER (WHERE x = ANY ($2)), ''{}'')'
            ' FROM (SELECT unnest($1) AS x) AS s'
       INTO common USING small, large;
    RETURN common;
END
$$;

GRANT EXECUTE ON FUNCTION
    social.like_count(bigint), social.likers(bigint), social.liked_objects(bigint),
    social.following(bigint), social.followers(bigint), social.friends_who_like(bigint, bigint)
TO sv_reader, sv_writer;
