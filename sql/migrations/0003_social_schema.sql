-- why: the social views (likes, follows) and the query functions users call live in one schema,
-- `social`, which the read-only role may use; its tables are created by the continuous-view engine
-- from sql/views/social.sql and its functions come from sql/functions/social.sql.

CREATE SCHEMA social AUTHORIZATION sv_owner;
COMMENT ON SCHEMA social IS 'Always-fresh likes and follows aggregates and the functions that read them.';

GRANT USAGE ON SCHEMA social TO sv_writer, sv_reader;
