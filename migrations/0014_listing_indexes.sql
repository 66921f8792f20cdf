-- Job listings (issue 13, sql/functions/read.sql's list_jobs): failed, cancelled and row-completed
-- jobs in the archive are listed newest first per state and queue, so that a page is an index walk
-- that stops after its rows, not a sort of the archive. Written only when prune archives a slot
-- (off the hot path); the archive stays append-only, reclaimed by truncating whole buckets.
--
-- FROZEN once released, like every migration: a schema change is a new file.
CREATE INDEX archived_jobs_listing ON __S__.archived_jobs (state, queue, finalized_at, job_id);
