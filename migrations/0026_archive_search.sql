-- Archive search: finished jobs found by what their arguments contain (`args @> '{"customer": 42}'`),
-- through an index, on the archive page, `ringwork archive search` and Admin::search_archive.
--
-- FROZEN once released, like every migration: a schema change is a new file.
--
-- The archive keeps a completion batch's arguments as one jsonb[] per batch, which no index can
-- search by element, so the search has a table of its own: one row per archived job, with its
-- arguments under a GIN index. It is written only while the `archive_search` setting is on
-- (`set_setting('archive_search', 1)`), by the same archive copy that fills the archive
-- (archive_slot, sql/functions/archive.sql): with 256-byte arguments of four keys it takes the
-- copy from 7-12 to 21-29 µs of server time per job and ten times the archive's disk, which a
-- schema that never searches should not pay.
--
-- Ring class like the archive: INSERT only, reclaimed by truncating whole time buckets. A row lives
-- exactly as long as the archive row it indexes: LIST partitions 0..31 hold completed jobs (bucketed
-- by keep_completed, like archived_completion_batches) and 32..63 the failed, cancelled and
-- row-completed ones (by keep_failed, like archived_jobs), each cut by archive_expire with its keep.
--
-- `doc` is what a search looks into: {"args": ..., "queue": ..., "kind": ..., "state": ...}, so a
-- queue, kind or state narrows the index lookup itself, and a search reads at most its cap of
-- rows whatever it filters by. The GIN index keeps its pending list (fastupdate): entries are
-- merged into the tree in sorted batches when the list outgrows gin_pending_list_limit, by the
-- archive copy that overflows it, at about half the cost of inserting them one by one; a search
-- reads the list (up to 4 MB) besides the tree.
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

ALTER TABLE __S__.settings DROP CONSTRAINT settings_name_check;
ALTER TABLE __S__.settings ADD CONSTRAINT settings_name_check
    CHECK (name IN ('max_args_bytes', 'max_error_chars', 'archive_search'));
