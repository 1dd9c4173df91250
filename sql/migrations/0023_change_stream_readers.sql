-- why: a view's change stream (0020) is read by more than `streamviews subscribe`: a sink relays it
-- to Kafka and a view over a view applies it (issue 25). Each such reader must take every change
-- once, resume where it stopped after a crash, keep its changes from retention until it has taken
-- them, keep the view recording whatever the view's own `changes` option says, and show its lag.
-- One table holds them all: a reader's position is what it has taken, advanced in the transaction
-- that takes it (a view's apply, a sink's delivery record), so a reader is exactly as durable as
-- the data it produced.

CREATE TABLE cv.change_readers (
    view     text NOT NULL REFERENCES cv.view_change_positions (view) ON DELETE CASCADE,
    reader   text NOT NULL,
    position bigint NOT NULL,
    taken_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (view, reader)
);
COMMENT ON TABLE cv.change_readers IS
    'Who reads each view''s change stream (''sink <name>'', ''view <schema.name>''), and the last position it took.';
COMMENT ON COLUMN cv.change_readers.position IS
    'The last position this reader has taken: it reads position > this next. Changes above it are kept.';
COMMENT ON COLUMN cv.change_readers.taken_at IS
    'When the position last advanced (or the reader was added): a reader that has nothing to take does not lag.';

-- Retention (replacing 0020's): changes older than p_older_than are deleted, except those a reader
-- has not taken yet. A reader that stopped for good holds its view's changes until it is dropped;
-- `streamviews status` shows its lag, so the operator sees why the table grows.
CREATE OR REPLACE FUNCTION cv.prune_view_changes(p_older_than interval) RETURNS bigint
LANGUAGE sql
AS $$
    WITH kept AS (SELECT view, min(position) AS taken FROM cv.change_readers GROUP BY view),
    gone AS (
        DELETE FROM cv.view_changes AS c WHERE c.committed_at < now() - p_older_than
           AND c.position <= coalesce((SELECT k.taken FROM kept AS k WHERE k.view = c.view), c.position)
        RETURNING 1)
    SELECT count(*) FROM gone
$$;

-- Readers advance their own rows; the catalog (sv_owner) adds and removes them.
GRANT SELECT, UPDATE ON cv.change_readers TO sv_writer;
GRANT SELECT ON cv.change_readers TO sv_reader;
