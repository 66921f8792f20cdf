-- Durable totals of terminal jobs (issue 12): how many jobs of each queue completed, failed and
-- were cancelled, counts that survive the prune of the queue slot that held them and the archive's
-- retention.
--
-- FROZEN once released, like every migration: a schema change is a new file.
--
-- When prune truncates a queue slot it first appends one row per queue with the slot's terminal
-- counts (sql/functions/ring_maintenance.sql, archive.sql). The rows live in a small ring of eight
-- time buckets (LIST partitions by totals_bucket, five minutes each); maintenance folds every bucket
-- but the current one into one row per queue in the current bucket and truncates it, in one
-- transaction under the bucket's ACCESS EXCLUSIVE lock. A total is the sum over all buckets plus
-- what the ring still holds: INSERT and TRUNCATE only, zero dead tuples, and a handful of rows per
-- queue however many jobs ran. Totals start at zero when this migration runs: history pruned
-- before it is not counted.
CREATE TABLE __S__.terminal_totals (
    totals_bucket int NOT NULL,
    queue         text NOT NULL,
    completed     bigint NOT NULL,
    failed        bigint NOT NULL,
    cancelled     bigint NOT NULL,
    recorded_at   timestamptz NOT NULL DEFAULT now()
) PARTITION BY LIST (totals_bucket);

DO $$
BEGIN
    FOR b IN 0 .. 7 LOOP
        EXECUTE format('CREATE TABLE %I.%I PARTITION OF %I.terminal_totals FOR VALUES IN (%s)',
                       '__S__', 'terminal_totals_' || b, '__S__', b);
    END LOOP;
END
$$;
