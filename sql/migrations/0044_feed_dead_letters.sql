-- why: a row that a view or transform over a feed (a view over output_of(v), a chain of transforms)
-- fails on (a division by zero, a failed cast, a CHECK) held its whole feed, retried forever, or had
-- the reading view quarantined: against the project's first rule, that bad input stops only itself
-- and is dead-lettered with its reason (issue 25). The runner's feeds now find such rows as isolation
-- finds a bad Kafka record (pipelines/cv/feed_isolation.py) and move past them. A feed's rows were
-- never Kafka records (they are cv.view_changes rows), so their dead letters are kept beside them, in
-- PostgreSQL, written by the very transaction that moves the feed past them: each exactly once.

CREATE TABLE cv.feed_dead_letters (
    feed        text NOT NULL REFERENCES cv.streams (name) ON DELETE CASCADE,
    position    bigint NOT NULL,
    upstream    text NOT NULL,
    reader      text NOT NULL,
    reason      text NOT NULL,
    detail      text NOT NULL,
    pipeline    text NOT NULL,
    change      jsonb NOT NULL,
    rejected_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (feed, position)
);
COMMENT ON TABLE cv.feed_dead_letters IS
    'Upstream changes a feed''s readers failed on, skipped by the feed (pipelines/cv/feed_isolation.py): '
    'feed (cv.streams), position in upstream''s cv.view_changes, reader (the view or transform that failed), '
    'reason and detail (as a <topic>.dlq''s dlq.reason and dlq.detail headers), pipeline (consumer group), '
    'change (its key, before, after and delta).';

-- What a reader may read: the dead letters of the upstreams it may read (as cv.view_changes_readable).
CREATE VIEW cv.feed_dead_letters_readable WITH (security_barrier) AS
    SELECT d.* FROM cv.feed_dead_letters AS d WHERE cv.may_read_view(d.upstream);
COMMENT ON VIEW cv.feed_dead_letters_readable IS
    'cv.feed_dead_letters of the upstream views and transforms the current role may read.';

GRANT SELECT, INSERT ON cv.feed_dead_letters TO sv_writer;
GRANT SELECT ON cv.feed_dead_letters_readable TO sv_reader, sv_writer;
