-- The engine's clock: every time-based decision and timestamp of the planes that follow it is
-- now() plus this offset (sql/functions/clock.sql, engine_now). No row means no offset, which is
-- what production runs with; a test moves the clock forward by writing the one row
-- (ringwork::testing, advance_clock) instead of waiting for time to pass.
--
-- FROZEN once released, like every migration: a schema change is a new file.
--
-- Warm class: no row in production; one row, updated by a test clock.
CREATE TABLE __S__.clock_offset (
    only_row  boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    offset_us bigint NOT NULL CHECK (offset_us >= 0)
);
