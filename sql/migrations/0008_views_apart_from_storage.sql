-- why: a continuous view's table held the engine's bookkeeping (`_cv_rows`, `_cv_removed`) beside
-- the declared columns, so `SELECT *` showed them, and an aggregate such as avg() had nowhere to keep
-- the count and sum it is computed from. From now on each view's groups and stored aggregates live in
-- a storage table `cv.<schema>__<view>` (with its reference counts, `cv.<schema>__<view>__refs`),
-- which only the owner and the pipelines' role can reach, and `<schema>.<view>` is a plain view of the
-- declared columns over it (PostgreSQL inlines it: a read by group key stays an index lookup).
-- Views defined before this migration keep exactly their columns: every stored column but the
-- engine's, in the order they were declared.

DO $$
DECLARE
    v record;
    view_schema text;
    view_name text;
    storage text;
    columns text;
BEGIN
    FOR v IN SELECT name FROM cv.views ORDER BY name LOOP
        view_schema := split_part(v.name, '.', 1);
        view_name := split_part(v.name, '.', 2);
        storage := view_schema || '__' || view_name;
        CONTINUE WHEN to_regclass(format('%I.%I', view_schema, view_name)) IS NULL;
        -- Renamed in place first: a view named like a catalog table (cv.streams) cannot clash.
        EXECUTE format('ALTER TABLE %I.%I RENAME TO %I', view_schema, view_name, storage);
        EXECUTE format('ALTER TABLE %I.%I SET SCHEMA cv', view_schema, storage);
        EXECUTE format('REVOKE ALL ON cv.%I FROM sv_reader', storage);
        IF to_regclass(format('%I.%I', view_schema, view_name || '__refs')) IS NOT NULL THEN
            EXECUTE format('ALTER TABLE %I.%I RENAME TO %I', view_schema, view_name || '__refs', storage || '__refs');
            EXECUTE format('ALTER TABLE %I.%I SET SCHEMA cv', view_schema, storage || '__refs');
        END IF;
        SELECT string_agg(format('s.%I', attname), ', ' ORDER BY attnum) INTO columns
        FROM pg_attribute
        WHERE attrelid = format('cv.%I', storage)::regclass AND attnum > 0 AND NOT attisdropped
          AND attname NOT LIKE '\_cv\_%';
        EXECUTE format('CREATE VIEW %I.%I AS SELECT %s FROM cv.%I AS s', view_schema, view_name, columns, storage);
        EXECUTE format('GRANT SELECT ON %I.%I TO sv_reader, sv_writer', view_schema, view_name);
    END LOOP;
END
$$;
