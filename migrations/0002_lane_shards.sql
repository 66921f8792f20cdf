-- Lane shards (issue 10): a lane is (queue, priority, shard).
--
-- FROZEN once released, like every migration: a schema change is a new file.
--
-- Each shard is a queue_lanes row with its own segment and cursor sequences, so everything that
-- works per lane (the claim walk and its ledger, counts, cancel, the prune proof) works per shard
-- unchanged. A producer transaction writes into one shard that no other open transaction is
-- writing (sql/functions/queue_ring.sql, enqueue_segment), so an open transaction holds back only
-- its own shard, and claimers in different processes take different shards at once.
--
-- Shards 0 .. lane_base_shards() - 1 are created with the lane, outside any producer's transaction;
-- extra shards are created on demand by a producer that finds every shard busy, numbered by their
-- lane_id, which is unique and larger than any base shard number of the same lane.
ALTER TABLE __S__.queue_lanes ADD COLUMN shard int NOT NULL DEFAULT 0;
ALTER TABLE __S__.queue_lanes DROP CONSTRAINT queue_lanes_queue_priority_key;
ALTER TABLE __S__.queue_lanes ADD CONSTRAINT queue_lanes_queue_priority_shard_key UNIQUE (queue, priority, shard);
