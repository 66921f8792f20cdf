-- Trace context (issue 12): the W3C `traceparent` of the span that enqueued a job, so the span of
-- each execution (first run, retries, snoozes, after parking or a dead-letter retry) can name the
-- producer's span as its parent.
--
-- FROZEN once released, like every migration: a schema change is a new file.
--
-- A nullable column without a default: adding it rewrites nothing, and a job enqueued without a
-- trace stores only a bit in the null bitmap. It travels with the job's row through every table a
-- pending job can sit in; history tables (done_entries, the archive) do not keep it.
ALTER TABLE __S__.ready_entries ADD COLUMN traceparent text;
ALTER TABLE __S__.deferred_jobs ADD COLUMN traceparent text;
ALTER TABLE __S__.parked_entries ADD COLUMN traceparent text;
ALTER TABLE __S__.dlq_entries ADD COLUMN traceparent text;
