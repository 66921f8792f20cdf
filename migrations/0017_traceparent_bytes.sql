-- Trace context in 25 bytes (issue 12): a job row stores its producer's W3C traceparent as the
-- bytes it names (trace id 16, span id 8, trace flags 1) instead of its 55 characters.
--
-- FROZEN once released, like every migration: a schema change is a new file.
--
-- With every job traced, the text form cost 56 bytes per ready_entries row and raised the WAL a job
-- writes at 1x32 saturation from about 362 to about 420 bytes (+16 %, docs/bench/
-- 2026-12-02-telemetry-*.md). The version field is not stored: only version 00 is accepted
-- (valid_traceparent), so it carries nothing. SQL producers still pass the text form; the enqueue
-- functions convert it (traceparent_bytes, sql/functions/queue_ring.sql), and a reader turns the
-- bytes back into a traceparent with traceparent_text.
--
-- ALTER COLUMN ... TYPE rewrites each table (and every partition of the partitioned ones) under
-- ACCESS EXCLUSIVE: on a live schema, run it when the ring is small (migrations are applied in one
-- transaction, so a failure rewrites nothing). The expression is written out here rather than
-- calling traceparent_bytes, because migrations run before the plane functions are installed.
ALTER TABLE __S__.ready_entries ALTER COLUMN traceparent TYPE bytea
    USING decode(substr(traceparent, 4, 32) || substr(traceparent, 37, 16) || substr(traceparent, 54, 2), 'hex');
ALTER TABLE __S__.deferred_jobs ALTER COLUMN traceparent TYPE bytea
    USING decode(substr(traceparent, 4, 32) || substr(traceparent, 37, 16) || substr(traceparent, 54, 2), 'hex');
ALTER TABLE __S__.parked_entries ALTER COLUMN traceparent TYPE bytea
    USING decode(substr(traceparent, 4, 32) || substr(traceparent, 37, 16) || substr(traceparent, 54, 2), 'hex');
ALTER TABLE __S__.dlq_entries ALTER COLUMN traceparent TYPE bytea
    USING decode(substr(traceparent, 4, 32) || substr(traceparent, 37, 16) || substr(traceparent, 54, 2), 'hex');
ALTER TABLE __S__.leases ALTER COLUMN traceparent TYPE bytea
    USING decode(substr(traceparent, 4, 32) || substr(traceparent, 37, 16) || substr(traceparent, 54, 2), 'hex');
