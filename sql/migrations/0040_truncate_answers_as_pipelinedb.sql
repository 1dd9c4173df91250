-- why: PipelineDB's truncate_continuous_view(name) returned void: its regression tests
-- (stream_table_join) print an empty value, and scripts written for it expect no answer. Migration
-- 0028's answered the sentence cv.truncate_continuous_view says; like activate and deactivate
-- (migration 0037), the PipelineDB-named function now answers as PipelineDB did and says the
-- sentence as a NOTICE.
DROP FUNCTION pipelinedb.truncate_continuous_view(text);
CREATE FUNCTION pipelinedb.truncate_continuous_view(name text) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    RAISE NOTICE '%', cv.truncate_continuous_view(name);
END
$$;
REVOKE ALL ON FUNCTION pipelinedb.truncate_continuous_view(text) FROM PUBLIC;
