-- The engine's clock (migration 0020): the time a plane's decisions and timestamps are taken at.
-- It is the server's now() plus the offset a test clock recorded (none in production), so that
-- tests advance time instead of sleeping. One empty-table read per call; the planes call it once
-- per statement or function call and keep the result.

-- PL/pgSQL, not SQL: the planner cannot inline a SQL function whose body holds a subquery, so it
-- parsed and planned this one at every call (about 60 us, once per claim and per engine_now());
-- PL/pgSQL keeps its plan for the session (about 15 us a call).
CREATE OR REPLACE FUNCTION __S__.clock_offset() RETURNS interval
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN coalesce((SELECT make_interval(secs => c.offset_us / 1e6) FROM __S__.clock_offset c), interval '0');
END
$$;

-- The transaction's time on the engine's clock.
CREATE OR REPLACE FUNCTION __S__.engine_now() RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT now() + __S__.clock_offset()
$$;

-- Move the engine's clock forward by p_by (a test clock; refused backwards: decisions already taken
-- at a later time would otherwise be seen again).
CREATE OR REPLACE FUNCTION __S__.advance_clock(p_by interval) RETURNS interval
LANGUAGE plpgsql AS $$
DECLARE
    v_us bigint := (extract(epoch FROM p_by) * 1000000)::bigint;
    v_offset bigint;
BEGIN
    IF p_by IS NULL OR v_us < 0 THEN
        RAISE EXCEPTION 'the clock only moves forward (asked to move by %)', p_by
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO __S__.clock_offset AS c (only_row, offset_us) VALUES (true, v_us)
    ON CONFLICT (only_row) DO UPDATE SET offset_us = c.offset_us + excluded.offset_us
    RETURNING offset_us INTO v_offset;
    -- the maintenance leader paces its services by what it last saw on this clock: now moved, all
    -- of them are due (src/maintenance/runner.rs)
    PERFORM pg_notify('ringwork___S__.maintenance', 'clock');
    RETURN make_interval(secs => v_offset / 1e6);
END
$$;
