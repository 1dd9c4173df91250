-- The DDL guard: plain SQL DDL cannot leave a continuous view or transform half-dropped or renamed.
-- Run by the superuser (event triggers need one) after sql/extensions.sql, on every `dbsetup`; each
-- statement is idempotent, and the functions read the catalog (cv.*) only when they run, so this
-- file runs before the migrations that create it.
--
-- Why: a continuous view is a catalog row (cv.views) + storage tables in schema cv + a read view
-- `<schema>.<view>`; a stream written with SQL has its insert relation `streams.<stream>` (a view
-- whose INSTEAD OF INSERT trigger `stream_insert` queues the rows for the stream's topic, migration
-- 0030), made again from the stream's declaration by CREATE / ALTER STREAM. `DROP VIEW public.pv` (PipelineDB 1.0's way to drop one), `DROP SCHEMA ...
-- CASCADE`, `DROP OWNED`, `ALTER SCHEMA ... RENAME` or `ALTER VIEW ... RENAME / SET SCHEMA` reach the
-- read view alone: the runner kept maintaining the storage, `streamviews list` still showed the view
-- and defining it again failed; DROP VIEW streams.<stream>, DROP TRIGGER stream_insert or an ALTER
-- VIEW of it left INSERT INTO <stream> failing or writing what the stream does not declare, behind
-- the catalog's back. These triggers refuse such statements, in one line naming the command that
-- does it whole ("streamviews drop ...", ALTER STREAM); raising in sql_drop / ddl_command_end rolls
-- the whole statement back.
--
-- The catalog's own DDL passes: pipelines.cv.catalog.locks.mark_catalog_ddl, called by begin_change
-- (every definition, drop and replay start), by the replays' swaps and by dbsetup's migrations,
-- marks the transaction with `set_config('cv.catalog_ddl', 'on', true)` (not streamviews.*: the
-- extension reserves that prefix). Any session may set it: this guards against mistakes, it is not
-- a permission (the owner of a view may drop it anyway).

CREATE SCHEMA IF NOT EXISTS ddl_guard;
COMMENT ON SCHEMA ddl_guard IS 'Event trigger functions refusing DDL that would leave a continuous view half-dropped (sql/guards.sql).';
-- The triggers run as whoever runs the DDL, and their functions call one another: every role may
-- use the schema (its functions read, never write; only the superuser can change them).
GRANT USAGE ON SCHEMA ddl_guard TO PUBLIC;

-- Whether the current transaction is the catalog's own DDL, or there is no catalog (yet, or any
-- more: DROP SCHEMA cv CASCADE takes everything at once), or this role cannot read the catalog (it
-- owns no continuous view, so drops nothing of one but through a schema it owns: left to PostgreSQL).
CREATE OR REPLACE FUNCTION ddl_guard.exempt() RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
DECLARE
    catalog text;
BEGIN
    IF coalesce(current_setting('cv.catalog_ddl', true), '') = 'on' THEN
        RETURN true;
    END IF;
    FOREACH catalog IN ARRAY ARRAY['cv.views', 'cv.transforms', 'cv.streams'] LOOP
        IF to_regclass(catalog) IS NULL OR NOT has_table_privilege(catalog, 'SELECT') THEN
            RETURN true;
        END IF;
    END LOOP;
    RETURN false;
END
$$;

-- What a relation is to the catalog, from its schema, name and type (no lookup of the relation
-- itself, so that it answers for relations already dropped): the read view of a continuous view or
-- transform, a table of a view's storage (cv.<schema>__<view>, __refs<i>, __m<i>), a stream's
-- state (cv.state_<stream>) or insert relation (streams.<stream>), or, for object_type 'trigger'
-- and the name of the relation it is on, a stream's insert trigger; no row when it is none of
-- those. `owner` is what `streamviews drop` takes.
CREATE OR REPLACE FUNCTION ddl_guard.owner_of(schema_name text, object_name text, object_type text)
RETURNS TABLE (kind text, owner text)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    qualified text := schema_name || '.' || object_name;
    -- the storage table a view's extra tables are named after
    storage text := regexp_replace(object_name, '__(refs[0-9]*|m[0-9]+)$', '');
BEGIN
    IF object_type = 'view' THEN
        RETURN QUERY SELECT 'continuous view', v.name FROM cv.views v WHERE v.name = qualified
            UNION ALL SELECT 'continuous transform', t.name FROM cv.transforms t WHERE t.name = qualified
            UNION ALL SELECT 'insert relation', s.name FROM cv.streams s
                WHERE schema_name = 'streams' AND s.name = object_name;
    ELSIF object_type = 'trigger' AND schema_name = 'streams' THEN
        RETURN QUERY SELECT 'insert trigger', s.name FROM cv.streams s WHERE s.name = object_name;
    ELSIF object_type = 'table' AND schema_name = 'cv' THEN
        RETURN QUERY SELECT 'storage', v.name FROM cv.views v
            WHERE split_part(v.name, '.', 1) || '__' || substr(v.name, strpos(v.name, '.') + 1)
                  IN (object_name, storage)
            UNION ALL SELECT 'state', s.name FROM cv.streams s WHERE 'state_' || s.name = object_name;
    END IF;
END
$$;

-- One line saying what a relation is, for the messages: "public.pv is a continuous view".
CREATE OR REPLACE FUNCTION ddl_guard.describe(relation text, kind text, owner text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE kind
        WHEN 'storage' THEN relation || ' is a storage table of continuous view ' || owner
        WHEN 'state' THEN relation || ' is the state of stream ' || owner
        WHEN 'insert relation' THEN relation || ' is the insert relation of stream ' || owner
        WHEN 'insert trigger' THEN 'trigger ' || relation || ' writes the rows inserted into stream ' || owner
        ELSE relation || ' is a ' || kind
    END
$$;

-- What a statement being dropped (sql_drop) takes of the catalog: one row per relation, and one
-- per stream's insert trigger (a trigger has no schema or name of its own here: its address is
-- {schema, relation, trigger}; its `relation` is "stream_insert on streams.<stream>").
CREATE OR REPLACE FUNCTION ddl_guard.dropped() RETURNS TABLE (relation text, original boolean, kind text, owner text)
LANGUAGE sql STABLE AS $$
    SELECT d.schema_name || '.' || d.object_name, d.original, o.kind, o.owner
    FROM pg_event_trigger_dropped_objects() d, ddl_guard.owner_of(d.schema_name, d.object_name, d.object_type) o
    WHERE NOT d.is_temporary AND d.object_type IN ('view', 'table')
    UNION ALL
    SELECT d.object_identity, d.original, o.kind, o.owner
    FROM pg_event_trigger_dropped_objects() d, ddl_guard.owner_of(d.address_names[1], d.address_names[2], 'trigger') o
    WHERE d.object_type = 'trigger' AND d.address_names[3] = 'stream_insert'
$$;

-- sql_drop: refuse a drop that reached a continuous view's or transform's read view, a view's
-- storage, or a stream's state, insert relation or insert trigger without the catalog. Cheap for
-- everything else: the engine's temporary tables and any drop outside schema cv that is no view
-- (nor a trigger in schema streams) return before the catalog is read.
CREATE OR REPLACE FUNCTION ddl_guard.refuse_drops() RETURNS event_trigger
LANGUAGE plpgsql AS $$
DECLARE
    hit record;
    owners text[];
    schemas text[];
    noun text;
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_event_trigger_dropped_objects() d
        WHERE NOT d.is_temporary AND (d.object_type = 'view' OR (d.object_type = 'table' AND d.schema_name = 'cv')
                                      OR (d.object_type = 'trigger' AND d.address_names[1] = 'streams'))
    ) OR ddl_guard.exempt() THEN
        RETURN;
    END IF;
    -- the statement's own object first (DROP VIEW pv, DROP TABLE cv.x, DROP TRIGGER), else what it cascaded to
    SELECT * INTO hit FROM ddl_guard.dropped() h ORDER BY h.original DESC, h.kind = 'storage', h.relation LIMIT 1;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT array_agg(DISTINCT h.owner ORDER BY h.owner),
           CASE WHEN bool_and(h.kind = 'continuous transform') THEN 'continuous transforms'
                WHEN bool_or(h.kind = 'continuous transform') THEN 'continuous views and transforms'
                WHEN bool_and(h.kind IN ('state', 'insert relation', 'insert trigger')) THEN 'streams'
                ELSE 'continuous views' END
      INTO owners, noun FROM ddl_guard.dropped() h;
    IF TG_TAG = 'DROP SCHEMA' THEN
        SELECT array_agg(d.object_name ORDER BY d.object_name) INTO schemas
        FROM pg_event_trigger_dropped_objects() d WHERE d.object_type = 'schema' AND d.original;
        RAISE EXCEPTION USING ERRCODE = 'dependent_objects_still_exist', MESSAGE = format(
            '%s %s %s %s (%s): drop them first with "streamviews drop %s"',
            CASE WHEN cardinality(schemas) > 1 THEN 'schemas' ELSE 'schema' END, array_to_string(schemas, ', '),
            CASE WHEN cardinality(schemas) > 1 THEN 'hold' ELSE 'holds' END, noun, array_to_string(owners, ', '), array_to_string(owners, ' '));
    ELSIF TG_TAG = 'DROP OWNED' THEN
        RAISE EXCEPTION USING ERRCODE = 'dependent_objects_still_exist', MESSAGE = format(
            'DROP OWNED would drop %s (%s): drop them first with "streamviews drop %s"',
            noun, array_to_string(owners, ', '), array_to_string(owners, ' '));
    ELSIF hit.original AND hit.kind IN ('continuous view', 'continuous transform') THEN
        RAISE EXCEPTION USING ERRCODE = 'dependent_objects_still_exist', MESSAGE = format(
            '%s: drop it with "streamviews drop %s" (%s would drop only its read view)',
            ddl_guard.describe(hit.relation, hit.kind, hit.owner), hit.owner, TG_TAG);
    ELSIF hit.original THEN
        RAISE EXCEPTION USING ERRCODE = 'dependent_objects_still_exist', MESSAGE = format(
            '%s: drop the %s with "streamviews drop %s" (%s would leave the %s without its %s)',
            ddl_guard.describe(hit.relation, hit.kind, hit.owner),
            CASE WHEN hit.kind = 'storage' THEN 'view' ELSE 'stream' END, hit.owner, TG_TAG,
            CASE WHEN hit.kind = 'storage' THEN 'view' ELSE 'stream' END, hit.kind);
    END IF;
    RAISE EXCEPTION USING ERRCODE = 'dependent_objects_still_exist', MESSAGE = format(
        '%s would drop the read views or tables of %s (%s): drop them first with "streamviews drop %s"',
        TG_TAG, noun, array_to_string(owners, ', '), array_to_string(owners, ' '));
END
$$;

-- The catalog's relations that exist now, as "kind|owner|relation|oid" lines: each continuous
-- view's and transform's read view found by its name, each table of schema cv that is a storage or
-- a state, each stream's insert relation in schema streams. ALTER ... RENAME / SET SCHEMA keeps a relation's oid and changes its name, so comparing
-- this before and after a statement tells which of them it renamed or moved.
CREATE OR REPLACE FUNCTION ddl_guard.catalog_relations() RETURNS text[]
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN ARRAY(
        SELECT concat_ws('|', e.kind, e.name, e.name, rel::oid)
        FROM (
            SELECT 'continuous view' AS kind, v.name FROM cv.views v
            UNION ALL SELECT 'continuous transform', t.name FROM cv.transforms t
        ) e, to_regclass(format('%I.%I', split_part(e.name, '.', 1), substr(e.name, strpos(e.name, '.') + 1))) AS rel
        WHERE rel IS NOT NULL
        UNION  -- a storage table is named <storage>, <storage>__refs<i> or <storage>__m<i>: two hash joins
        SELECT concat_ws('|', 'storage', v.name, 'cv.' || c.relname, c.oid)
        FROM (SELECT name, split_part(name, '.', 1) || '__' || substr(name, strpos(name, '.') + 1) AS storage
              FROM cv.views) v,
             (SELECT oid, relname, regexp_replace(relname, '__(refs[0-9]*|m[0-9]+)$', '') AS base FROM pg_class
              WHERE relnamespace = 'cv'::regnamespace AND relkind IN ('r', 'p')) c,
             LATERAL (VALUES (c.relname), (c.base)) AS named (storage)
        WHERE named.storage = v.storage
        UNION ALL
        SELECT concat_ws('|', 'state', s.name, 'cv.' || c.relname, c.oid)
        FROM cv.streams s JOIN pg_class c ON c.relnamespace = 'cv'::regnamespace AND c.relname = 'state_' || s.name
        UNION ALL  -- no schema streams yet (before migration 0030): none
        SELECT concat_ws('|', 'insert relation', s.name, 'streams.' || c.relname, c.oid)
        FROM cv.streams s JOIN pg_class c ON c.relnamespace = to_regnamespace('streams') AND c.relname = s.name
    );
END
$$;

-- ddl_command_start of ALTER VIEW / TABLE / SCHEMA: note the catalog's relations for the end's check.
CREATE OR REPLACE FUNCTION ddl_guard.note_relations() RETURNS event_trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('cv.ddl_guard_before',
        CASE WHEN ddl_guard.exempt() THEN '' ELSE array_to_string(ddl_guard.catalog_relations(), E'\n') END, true);
END
$$;

-- ddl_command_end of ALTER VIEW / TABLE / SCHEMA: refuse when a relation of the catalog noted at the
-- start is no longer found under its name (renamed, or moved to another schema) by this statement,
-- and any ALTER of a stream's insert relation: its columns, defaults and trigger are the stream's
-- declaration (RENAME COLUMN, SET DEFAULT or DISABLE TRIGGER would write other events than the
-- stream declares, or none), which only CREATE / ALTER STREAM change.
CREATE OR REPLACE FUNCTION ddl_guard.refuse_renames() RETURNS event_trigger
LANGUAGE plpgsql AS $$
DECLARE
    before text := coalesce(current_setting('cv.ddl_guard_before', true), '');
    altered text;
    gone text[];
    parts text[];
    owners text;
    schema_name text;
BEGIN
    IF before = '' OR ddl_guard.exempt() THEN
        RETURN;
    END IF;
    SELECT g INTO altered FROM unnest(string_to_array(before, E'\n')) AS noted (g)
    WHERE split_part(g, '|', 1) = 'insert relation'
      AND EXISTS (SELECT 1 FROM pg_event_trigger_ddl_commands() d WHERE d.objid = split_part(g, '|', 4)::oid)
    ORDER BY g LIMIT 1;
    IF FOUND THEN
        parts := string_to_array(altered, '|');
        RAISE EXCEPTION USING ERRCODE = 'feature_not_supported', MESSAGE = format(
            '%s: %s cannot change it (the catalog makes it from the stream''s declaration); change the stream'
            ' with "ALTER STREAM %s ...", or drop it with "streamviews drop %s" and declare it again',
            ddl_guard.describe(parts[3], parts[1], parts[2]), TG_TAG, parts[2], parts[2]);
    END IF;
    -- Noted at the start, not found under that name now, and the relation this statement altered
    -- (or one in the schema it altered): a view another session dropped meanwhile is none of these.
    gone := ARRAY(
        SELECT g FROM (
            SELECT unnest(string_to_array(before, E'\n')) EXCEPT SELECT unnest(ddl_guard.catalog_relations())
        ) AS missing (g)
        JOIN pg_class c ON c.oid = split_part(g, '|', 4)::oid
        WHERE EXISTS (SELECT 1 FROM pg_event_trigger_ddl_commands() d WHERE d.objid IN (c.oid, c.relnamespace))
        ORDER BY g
    );
    IF cardinality(gone) = 0 THEN
        RETURN;
    END IF;
    parts := string_to_array(gone[1], '|');
    IF TG_TAG = 'ALTER SCHEMA' AND parts[1] = 'insert relation' THEN  -- views first: gone is sorted by kind
        SELECT string_agg(DISTINCT split_part(g, '|', 2), ', ') INTO owners FROM unnest(gone) g;
        RAISE EXCEPTION USING ERRCODE = 'feature_not_supported', MESSAGE = format(
            'renaming schema streams is not supported: it holds the insert relations of streams (%s),'
            ' which INSERT INTO <stream> finds there', owners);
    ELSIF TG_TAG = 'ALTER SCHEMA' THEN
        schema_name := split_part(parts[2], '.', 1);
        SELECT string_agg(DISTINCT split_part(g, '|', 2), ', ') INTO owners FROM unnest(gone) g;
        RAISE EXCEPTION USING ERRCODE = 'feature_not_supported', MESSAGE = format(
            'renaming schema %s is not supported while it holds continuous views (%s): drop them with '
            '"streamviews drop %s" first, and define them again in the renamed schema',
            schema_name, owners, replace(owners, ', ', ' '));
    END IF;
    IF parts[1] IN ('storage', 'state') THEN
        RAISE EXCEPTION USING ERRCODE = 'feature_not_supported', MESSAGE = format(
            '%s: %s cannot rename it or move it to another schema (the stream runner finds it by its name)',
            ddl_guard.describe(parts[3], parts[1], parts[2]), TG_TAG);
    END IF;
    RAISE EXCEPTION USING ERRCODE = 'feature_not_supported', MESSAGE = format(
        '%s: %s cannot rename it or move it to another schema (the catalog knows it by its name); '
        'drop it with "streamviews drop %s" and define it again under the new name',
        ddl_guard.describe(parts[3], parts[1], parts[2]), TG_TAG, parts[2]);
END
$$;

-- The triggers, made once (CREATE OR REPLACE of the functions above keeps them bound).
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'streamviews_refuse_drops') THEN
        CREATE EVENT TRIGGER streamviews_refuse_drops ON sql_drop EXECUTE FUNCTION ddl_guard.refuse_drops();
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'streamviews_note_relations') THEN
        CREATE EVENT TRIGGER streamviews_note_relations ON ddl_command_start
            WHEN TAG IN ('ALTER VIEW', 'ALTER TABLE', 'ALTER SCHEMA') EXECUTE FUNCTION ddl_guard.note_relations();
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'streamviews_refuse_renames') THEN
        CREATE EVENT TRIGGER streamviews_refuse_renames ON ddl_command_end
            WHEN TAG IN ('ALTER VIEW', 'ALTER TABLE', 'ALTER SCHEMA') EXECUTE FUNCTION ddl_guard.refuse_renames();
    END IF;
END
$$;
-- and enabled, whatever state they were left in
ALTER EVENT TRIGGER streamviews_refuse_drops ENABLE;
ALTER EVENT TRIGGER streamviews_note_relations ENABLE;
ALTER EVENT TRIGGER streamviews_refuse_renames ENABLE;
