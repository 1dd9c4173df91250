-- why: the CDC role holds REPLICATION, and a role with REPLICATION that may connect to this database
-- can create a logical slot here and decode every change of it (ops.kafka_offsets, the views'
-- storage), whatever its table privileges. The captured application tables therefore moved to a
-- database of their own (APP_DATABASE, sql/app_migrations/0001), and the CDC role lost CONNECT here.
-- dbsetup copies the rows of an existing app.likes / app.follows over and drops the old replication
-- slot before this migration runs (pipelines/cdc/app_database.py), so this drops only what is copied.

DROP PUBLICATION IF EXISTS streamviews_cdc;
DROP SCHEMA IF EXISTS app CASCADE;
