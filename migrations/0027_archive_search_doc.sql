-- Archive search, second shape: a search row lives exactly as long as the archive row it indexes,
-- and queue, kind and state are looked up in the same index as the arguments.
--
-- FROZEN once released, like every migration: a schema change is a new file.
--
-- Migration 0026's table kept queue, kind and state as columns beside `args` (so a filter on them
-- could not narrow the index lookup) and cut completed and failed jobs' rows by one keep. This
-- shape replaces it:
--
-- `doc` is what a search looks into: {"args": ..., "queue": ..., "kind": ..., "state": ...}, so a
-- queue, kind or state narrows the index lookup itself, and a search reads at most its cap of rows
-- whatever it filters by. Ring class like the archive: INSERT only, reclaimed by truncating whole
-- time buckets. LIST partitions 0..31 hold completed jobs (bucketed by keep_completed, like
-- archived_completion_batches) and 32..63 the failed, cancelled and row-completed ones (by
-- keep_failed, like archived_jobs), each cut by archive_expire with its keep. The GIN index keeps
-- its pending list (fastupdate): entries are merged into the tree in sorted batches when the list
-- outgrows gin_pending_list_limit, by the archive copy that overflows it, at about half the cost of
-- inserting them one by one; a search reads the list (up to 4 MB) besides the tree. Written only
-- while the `archive_search` setting is on; with 256-byte arguments of four keys it takes the copy
-- from 7-12 to 21-29 us of server time per job and ten times the archive's disk.
--
-- The table is made anew: 0026's rows exist only where search was turned on before this migration
-- (never in a released schema), and the archive copies of later slots fill the new one.
DROP TABLE __S__.archived_job_args;
CREATE TABLE __S__.archived_job_args (
    archive_bucket int NOT NULL,
    job_id         bigint NOT NULL,
    run_lease      bigint NOT NULL,
    attempt        int NOT NULL,
    finalized_at   timestamptz NOT NULL,
    doc            jsonb NOT NULL
) PARTITION BY LIST (archive_bucket);
CREATE INDEX ON __S__.archived_job_args USING gin (doc jsonb_path_ops);
CREATE INDEX ON __S__.archived_job_args (job_id);
CREATE INDEX ON __S__.archived_job_args (finalized_at);

DO $$
BEGIN
    FOR b IN 0 .. 63 LOOP
        EXECUTE format('CREATE TABLE %I.%I PARTITION OF %I.archived_job_args FOR VALUES IN (%s)',
                       '__S__', 'archived_job_args_' || b, '__S__', b);
    END LOOP;
END
$$;
