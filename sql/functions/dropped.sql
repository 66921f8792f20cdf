-- Functions that an earlier install may have created and this one no longer defines, dropped by
-- name and signature before the plane files are installed. Runs on every function reload, so each
-- statement must be IF EXISTS.
--
-- lane shards (migration 0002): claims no longer read pg_locks to step over an in-flight segment
DROP FUNCTION IF EXISTS __S__.lane_gap_resolved(int, bigint);
-- parking (migration 0003): prune_queue_slot gained p_park_idle
DROP FUNCTION IF EXISTS __S__.prune_queue_slot(int, text, interval);
-- archive (migration 0004): prune_queue_slot gained p_keep_completed, and no argument has a default
DROP FUNCTION IF EXISTS __S__.prune_queue_slot(int, text, interval, interval);
