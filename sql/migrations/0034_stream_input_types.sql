-- why: a stream column may be of any type PostgreSQL reads from text (issue 26: timestamp, interval,
-- json, money, bit(n), inet, arrays, enums, composite types, ...). Decoding does not read those
-- types itself: PostgreSQL's input does, from the event field's JSON text, as json_to_record does
-- (pipelines/cv/sqltext/types.py). The runner asks PostgreSQL whether a batch's values parse before
-- applying it: one statement for the whole column, and only when that fails, this function, which
-- names each value the input refuses and why, so that only those records are dead letters
-- (`invalid_input`, PostgreSQL's message) and the batch's others apply.

-- For each element of `texts` (JSON texts) that json_to_record cannot read as `type_name`: its
-- position (1-based) and PostgreSQL's message. Each value in a subtransaction of its own: the
-- slow path, taken only for a batch holding a value that does not parse. `type_name` is a stream
-- column's type as the catalog stores it (CREATE STREAM checked that it names a type).
CREATE OR REPLACE FUNCTION cv.input_errors(texts json[], type_name text)
RETURNS TABLE (i int, error text)
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    reader text := format(
        'SELECT count(r.v) FROM json_to_record(json_build_object(''v'', $1)) AS r(v %s)', type_name
    );
BEGIN
    FOR n IN 1 .. coalesce(cardinality(texts), 0) LOOP
        BEGIN
            EXECUTE reader USING texts[n];
        EXCEPTION WHEN data_exception OR integrity_constraint_violation THEN
            i := n;
            error := SQLERRM;
            RETURN NEXT;
        END;
    END LOOP;
END
$$;
