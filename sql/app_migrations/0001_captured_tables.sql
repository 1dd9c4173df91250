-- why: applications that write likes and follows as rows of their own tables (instead of producing to
-- Kafka) write them here, in a database of their own. Debezium captures these tables (insert = like/
-- follow, delete = unlike/unfollow) through one publication, and the stream runner feeds the changes
-- into the same streams and views as the `likes` and `follows` topics. The CDC role holds REPLICATION,
-- which lets it decode every change of any database it may connect to; this database, holding
-- nothing but the captured tables, is the only one it may (dbsetup grants CONNECT here alone).
-- Until migration 0012 of the views' database these tables lived there, in the same `app` schema.

CREATE SCHEMA app AUTHORIZATION sv_owner;
COMMENT ON SCHEMA app IS 'Source tables applications write; captured by Debezium into cdc.app.* topics.';

CREATE TABLE app.likes (
    oid        bigint      NOT NULL CHECK (oid > 0),
    uid        bigint      NOT NULL CHECK (uid > 0),
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (oid, uid)
);
COMMENT ON TABLE app.likes IS 'A row is a like; deleting it is an unlike.';

CREATE TABLE app.follows (
    uid        bigint      NOT NULL CHECK (uid > 0),
    target     bigint      NOT NULL CHECK (target > 0 AND target <> uid),
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (uid, target)
);
COMMENT ON TABLE app.follows IS 'A row is a follow; deleting it is an unfollow.';

-- Debezium's heartbeat writes here, so the replication slot advances even when no captured table
-- changes and the cluster's other databases do not make the slot retain WAL.
CREATE TABLE app.cdc_heartbeat (
    id int PRIMARY KEY CHECK (id = 1),
    at timestamptz NOT NULL
);

-- The connector reads this publication (publication.autocreate.mode = disabled): the owner decides
-- what is captured, and the CDC role needs no CREATE privilege.
CREATE PUBLICATION streamviews_cdc FOR TABLE app.likes, app.follows, app.cdc_heartbeat;

GRANT USAGE ON SCHEMA app TO sv_cdc, sv_writer;
GRANT SELECT ON app.likes, app.follows TO sv_cdc;
GRANT SELECT, INSERT, UPDATE ON app.cdc_heartbeat TO sv_cdc;
-- Applications writing likes and follows as rows act with the writer role here.
GRANT SELECT, INSERT, UPDATE, DELETE ON app.likes, app.follows TO sv_writer;
