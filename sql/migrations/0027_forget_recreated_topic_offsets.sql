-- why: a stream with a start rule (WITH (start_offset = 'latest' | '<timestamp>'),
-- pipelines/runtime/starts.py) whose topic is deleted and created again follows its rule on the new
-- topic: the runner, as sv_writer, deletes its group's positions of that topic
-- (OffsetStore.forget_topic) and resolves them again before consuming. It could already insert and
-- move those rows; deleting them gives it no more power over the positions than that.
GRANT DELETE ON ops.kafka_offsets TO sv_writer;
