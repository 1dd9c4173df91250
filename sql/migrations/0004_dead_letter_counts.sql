-- why: rejected events go to a dead-letter topic, and operators need their count per reason without
-- reading that topic. Counting in the batch's own transaction makes the count exact across restarts.

CREATE TABLE ops.dead_letters (
    group_id   text        NOT NULL,
    topic      text        NOT NULL,
    reason     text        NOT NULL,
    count      bigint      NOT NULL CHECK (count >= 0),
    last_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_id, topic, reason)
);
COMMENT ON TABLE ops.dead_letters IS 'Events sent to a dead-letter topic, per consumer group, topic and reason.';

GRANT SELECT, INSERT, UPDATE ON ops.dead_letters TO sv_writer;
