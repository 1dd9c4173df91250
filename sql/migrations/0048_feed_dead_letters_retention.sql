-- why: cv.feed_dead_letters (migration 0044) was never pruned: a chain that keeps failing on some of
-- its upstream's rows grew the table without bound, where the `.dlq` topic of a stream keeps its
-- dead letters only as long as the broker's retention (7 days by default). The runner's housekeeping
-- now deletes a feed's dead letters older than PIPELINE_FEED_DEAD_LETTERS_RETENTION_S (7 days by
-- default, the same), as it prunes recorded changes (cv.prune_view_changes, migration 0020).

CREATE INDEX feed_dead_letters_rejected_at ON cv.feed_dead_letters (rejected_at);

-- cv.prune_feed_dead_letters: delete the feeds' dead letters rejected more than p_older_than ago;
-- returns how many. Run by the runner's housekeeping, beside cv.prune_view_changes.
CREATE FUNCTION cv.prune_feed_dead_letters(p_older_than interval) RETURNS bigint
LANGUAGE sql
AS $$
    WITH gone AS (DELETE FROM cv.feed_dead_letters WHERE rejected_at < now() - p_older_than RETURNING 1)
    SELECT count(*) FROM gone
$$;

GRANT DELETE ON cv.feed_dead_letters TO sv_writer;
REVOKE ALL ON FUNCTION cv.prune_feed_dead_letters(interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION cv.prune_feed_dead_letters(interval) TO sv_writer;
