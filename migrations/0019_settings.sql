-- Per-schema limits an operator may change: one row per limit that differs from its default
-- (`SELECT <schema>.set_setting(name, value)`). Read by the enqueue checks and by close_batch
-- (sql/functions/queue_ring.sql, setting).
--
-- FROZEN once released, like every migration: a schema change is a new file.
--
-- Warm class: a handful of rows, written by an operator, never by a job.
CREATE TABLE __S__.settings (
    name  text PRIMARY KEY CHECK (name IN ('max_args_bytes', 'max_error_chars')),
    value bigint NOT NULL CHECK (value > 0)
);
