-- Archive search: finished jobs found by what their arguments contain (`args @> '{"customer": 42}'`),
-- through an index, on the archive page, `ringwork archive search` and Admin::search_archive.
--
-- FROZEN once released, like every migration: a schema change is a new file.
--
-- The archive keeps a completion batch's arguments as one jsonb[] per batch, which no index can
-- search by element, so the search has a table of its own: one row per archived job, with its
-- arguments under a GIN index. It is written only while the `archive_search` setting is on
-- (`set_setting('archive_search', 1)`), by the same archive copy that fills the archive
-- (archive_slot, sql/functions/archive.sql): with 256-byte arguments of four keys it about doubles
-- the copy's server time (11 -> 23 µs per job), which a schema that never searches should not pay.
--
-- Ring class like the archive: INSERT only, LIST partitions 0..31 by archive_bucket, each truncated
-- whole by retention once its newest row is older than the longer of the two keeps (completed and
-- failed jobs share the table, so its buckets are cut by that keep). The GIN index keeps its
-- pending list (fastupdate): entries are merged into the tree in sorted batches when the list
-- outgrows gin_pending_list_limit, by the archive copy that overflows it, which costs half of
-- inserting them one by one (27 µs per job); a search reads the list (up to 4 MB) besides the tree.
CREATE TABLE __S__.archived_job_args (
    archive_bucket int NOT NULL,
    job_id         bigint NOT NULL,
    run_lease      bigint NOT NULL,
    queue          text NOT NULL,
    kind           text NOT NULL,
    state          text NOT NULL,
    attempt        int NOT NULL,
    finalized_at   timestamptz NOT NULL,
    args           jsonb NOT NULL
) PARTITION BY LIST (archive_bucket);
CREATE INDEX ON __S__.archived_job_args USING gin (args jsonb_path_ops);
CREATE INDEX ON __S__.archived_job_args (job_id);

DO $$
BEGIN
    FOR b IN 0 .. 31 LOOP
        EXECUTE format('CREATE TABLE %I.%I PARTITION OF %I.archived_job_args FOR VALUES IN (%s)',
                       '__S__', 'archived_job_args_' || b, '__S__', b);
    END LOOP;
END
$$;

ALTER TABLE __S__.settings DROP CONSTRAINT settings_name_check;
ALTER TABLE __S__.settings ADD CONSTRAINT settings_name_check
    CHECK (name IN ('max_args_bytes', 'max_error_chars', 'archive_search'));
