-- The dead-letter queue (dlq_entries): jobs that failed for good in a queue that holds them for an
-- operator; retried with fresh attempts, or expired past retention.
--
-- Every function of the engine is defined exactly once, in the file of its plane, and installed with
-- CREATE OR REPLACE by src/schema.rs whenever the combined hash of these files changes. A function
-- that is removed is dropped by name in dropped.sql. __S__ is the validated schema name.

-- Retry a dead-lettered job: it leaves the DLQ (its row locked first: of two concurrent retries
-- exactly one gets it) and is scheduled now with fresh attempts and its run_lease kept, so
-- the next claim's run_lease is higher than any before it.
CREATE OR REPLACE FUNCTION __S__.dlq_retry(p_job_id bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v __S__.dlq_entries;
BEGIN
    -- a workflow step: its workflow's lock first (workflows.sql), so a sequence that looks at
    -- whether this job is final sees it before or after the retry, never in between
    PERFORM __S__.lock_workflows_of(ARRAY[p_job_id]);
    -- the row locked (of two concurrent retries the second finds it gone), the job scheduled, then
    -- the row deleted: a delete trigger (workflows.sql) tells a retry from a purge by that schedule
    SELECT * INTO v FROM __S__.dlq_entries WHERE job_id = p_job_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    -- the retry's run lease is one past the dead-lettered attempt's: a workflow step records one
    -- result per run lease, and a cancellation before the retry runs must not share the failed
    -- attempt's lease, whose result would hide it (and leave the steps held behind it waiting)
    INSERT INTO __S__.deferred_jobs (job_id, queue, kind, args, priority, attempt, run_lease, max_attempts,
                                     run_at, created_at, last_error, timeout_ms, traceparent)
    VALUES (v.job_id, v.queue, v.kind, v.args, v.priority, 0, v.run_lease + 1, v.max_attempts, now(),
            v.created_at, v.error, v.timeout_ms, v.traceparent);
    PERFORM __S__.wake_promotion();
    DELETE FROM __S__.dlq_entries WHERE job_id = p_job_id;
    RETURN true;
END
$$;

-- Retention: delete DLQ rows older than p_keep, at most p_limit per call.
CREATE OR REPLACE FUNCTION __S__.dlq_expire(p_keep interval, p_limit int) RETURNS int
LANGUAGE sql AS $$
    WITH gone AS (
        DELETE FROM __S__.dlq_entries WHERE job_id IN (
            SELECT job_id FROM __S__.dlq_entries WHERE failed_at < now() - p_keep
            ORDER BY failed_at LIMIT p_limit FOR UPDATE SKIP LOCKED)
        RETURNING 1
    )
    SELECT count(*)::int FROM gone
$$;
