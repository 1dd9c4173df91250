-- why: a view read by another view (FROM public.per_minute) keeps, in its feed's state table, the row
-- its readers last saw of each group, and every page of changes updates those rows in place. The
-- tables were made at PostgreSQL's default fillfactor of 100: a page had no room for a row's new
-- version, so fewer than 1% of the updates were HOT, and each one wrote an index entry. Made at 50
-- (pipelines/cv/views/stream_sql.py, create_state_table), 99% are, and the rollup benchmark's feeds
-- took about 12% less time. New feeds are made so; this sets the existing ones the same way, for
-- the pages they fill from now on.

DO $$
DECLARE
    feed record;
BEGIN
    FOR feed IN
        SELECT s.name FROM cv.streams AS s
         WHERE starts_with(s.topic, 'view:') AND s.definition::jsonb -> 'key' <> 'null'::jsonb
           AND to_regclass(format('cv.%I', 'state_' || s.name)) IS NOT NULL
    LOOP
        EXECUTE format('ALTER TABLE cv.%I SET (fillfactor = 50)', 'state_' || feed.name);
    END LOOP;
END
$$;
