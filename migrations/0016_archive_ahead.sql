-- Archive ahead of prune (issues 10 and 11): a sealed queue slot's terminal history is copied to
-- the archive before prune takes the slot's ACCESS EXCLUSIVE locks, not under them.
--
-- FROZEN once released, like every migration: a schema change is a new file.
--
-- Until now prune_queue_slot copied the slot's completion batches (with their jobs' kinds and args)
-- and failed/cancelled rows into the archive while it held ACCESS EXCLUSIVE on every child of the
-- slot. The copy took 1.0-2.4 s per slot at 8x4 saturation, and every claim and completion flush
-- (whose generic plans lock every ready_entries child) queued behind it. A reader that keeps prune
-- out for minutes (pg_dump) left several full slots whose copies then ran back to back, each under
-- the lock, after the reader ended.
--
-- Now archive_queue_slot_ahead (sql/functions/archive.sql) copies a provable slot under ACCESS
-- SHARE only, which no hot statement and no reader conflicts with, and appends a mark: how many
-- completion batches and terminal rows of the slot's generation the copy has covered. Prune, under
-- its locks, only counts: when the counts still match the latest mark there is nothing to copy;
-- rows that arrived after the mark (a producer's transaction open across the seal commits, and its
-- jobs finish) are copied then, and only they.
--
-- queue_slot_archive_marks: ring class, INSERT only, one child per queue slot, truncated by the
-- slot's prune with the rest of the slot (a mark describes one generation of its slot).
CREATE TABLE __S__.queue_slot_archive_marks (
    ready_slot         int NOT NULL,
    generation         bigint NOT NULL,
    -- the slot's receipt_completion_batches and done_entries rows counted before the copy began
    -- (counted first, so rows that commit during the copy are copied again at most, never missed)
    completion_batches int NOT NULL,
    terminal_rows      int NOT NULL,
    marked_at          timestamptz NOT NULL DEFAULT now()
) PARTITION BY LIST (ready_slot);

DO $$
DECLARE
    s int;
BEGIN
    FOR s IN 0 .. (SELECT slot_count FROM __S__.queue_ring_state) - 1 LOOP
        EXECUTE format('CREATE TABLE %I.%I PARTITION OF %I.%I FOR VALUES IN (%s)',
                       '__S__', 'queue_slot_archive_marks_' || s, '__S__', 'queue_slot_archive_marks', s);
    END LOOP;
END
$$;

-- Where an archived row came from. While its slot's generation is still in the ring (archived
-- ahead, not yet truncated) the ring is the authority and readers of the archive skip the row, so a
-- job is never listed twice. NULL for rows archived before this migration (their slots are gone).
ALTER TABLE __S__.archived_completion_batches ADD COLUMN ready_slot int, ADD COLUMN generation bigint;
ALTER TABLE __S__.archived_jobs ADD COLUMN ready_slot int, ADD COLUMN generation bigint;
