-- The archive (issue 11): terminal history outlives its queue slot, without carry-forward copies.
--
-- FROZEN once released, like every migration: a schema change is a new file.
--
-- When prune truncates a queue slot it first appends the slot's terminal history here
-- (sql/functions/ring_maintenance.sql): each completion batch as one row (the batch's arrays plus
-- the kinds, args, attempts and creation times of its jobs, so a batch stays one row), and each
-- failed, cancelled or row-completed job as one row. Both tables are rings of time buckets:
-- LIST partitions 0..31 by archive_bucket, the bucket of the row's finalized_at (a period of
-- keep / 30, so a bucket is written for one period and due for truncation one period before it is
-- written again; sql/functions/archive.sql). Retention truncates a whole bucket once its newest
-- row is older than the keep (keep_completed, keep_failed): INSERT-only, zero dead tuples, no
-- runtime DDL.
CREATE TABLE __S__.archived_completion_batches (
    archive_bucket int NOT NULL,
    finalized_at   timestamptz NOT NULL,
    queue          text,
    -- [min, max] of job_ids: the lookup index (GiST, one entry per batch) finds the candidate rows
    job_range      int8range NOT NULL,
    job_ids        bigint[] NOT NULL,
    run_leases     bigint[] NOT NULL,
    kinds          text[] NOT NULL,
    args           jsonb[] NOT NULL,
    attempts       int[] NOT NULL,
    created_ats    timestamptz[] NOT NULL
) PARTITION BY LIST (archive_bucket);
CREATE INDEX ON __S__.archived_completion_batches USING gist (job_range);
CREATE INDEX ON __S__.archived_completion_batches (finalized_at);

CREATE TABLE __S__.archived_jobs (
    archive_bucket int NOT NULL,
    job_id       bigint NOT NULL,
    run_lease    bigint NOT NULL,
    queue        text NOT NULL,
    kind         text NOT NULL,
    args         jsonb NOT NULL,
    priority     smallint NOT NULL,
    attempt      int NOT NULL,
    max_attempts int NOT NULL,
    state        text NOT NULL,
    error        text,
    created_at   timestamptz NOT NULL,
    finalized_at timestamptz NOT NULL
) PARTITION BY LIST (archive_bucket);
CREATE INDEX ON __S__.archived_jobs (job_id);
CREATE INDEX ON __S__.archived_jobs (finalized_at);
CREATE INDEX ON __S__.archived_jobs (queue, state);

DO $$
BEGIN
    FOR b IN 0 .. 31 LOOP
        EXECUTE format('CREATE TABLE %I.%I PARTITION OF %I.archived_completion_batches FOR VALUES IN (%s)',
                       '__S__', 'archived_completion_batches_' || b, '__S__', b);
        EXECUTE format('CREATE TABLE %I.%I PARTITION OF %I.archived_jobs FOR VALUES IN (%s)',
                       '__S__', 'archived_jobs_' || b, '__S__', b);
    END LOOP;
END
$$;
