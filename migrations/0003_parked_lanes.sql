-- Parked lanes (issue 11): cold work leaves the queue ring so that one idle lane never stops
-- reclamation for every queue.
--
-- FROZEN once released, like every migration: a schema change is a new file.
--
-- A sealed queue slot can only be truncated once no lane has an unclaimed row in it. A lane nobody
-- claims from (its queue is paused, has no workers, or was named by mistake) would pin its slot,
-- and after queue_slots - 1 rotations every slot. When prune finds a slot held only by such cold
-- lanes, it moves their unclaimed rows here, under the slot's ACCESS EXCLUSIVE lock and the lanes'
-- row locks, then truncates the slot as usual (sql/functions/ring_maintenance.sql). The first claim
-- on the lane (or the queue's resume) moves them back into the current slot with their original
-- positions, so the lane's order is kept (sql/functions/claim_ring.sql, unpark_lane).
--
-- These are backlog-class tables: rows arrive in bulk when a lane goes cold and leave in bulk when
-- it is worked again (DELETE, reclaimed by ordinary vacuum, off the hot path).
CREATE TABLE __S__.parked_lanes (
    lane_id   int PRIMARY KEY,
    queue     text NOT NULL,
    parked_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ON __S__.parked_lanes (queue);

CREATE TABLE __S__.parked_segments (
    lane_id    int NOT NULL,
    segment_no bigint NOT NULL,
    job_count  int NOT NULL,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (lane_id, segment_no)
);

CREATE TABLE __S__.parked_entries (
    lane_id      int NOT NULL,
    lane_pos     bigint NOT NULL,
    job_id       bigint NOT NULL,
    queue        text NOT NULL,
    kind         text NOT NULL,
    args         jsonb NOT NULL,
    priority     smallint NOT NULL,
    attempt      int NOT NULL,
    run_lease    bigint NOT NULL,
    max_attempts int NOT NULL,
    run_at       timestamptz NOT NULL,
    created_at   timestamptz NOT NULL,
    timeout_ms   int,
    parked_at    timestamptz NOT NULL DEFAULT now(),
    -- set by cancel_job while the job is parked (the one UPDATE this table sees): the row goes back
    -- to the ring with a tombstone, so its segment keeps its size and counts stay exact
    cancelled    boolean NOT NULL DEFAULT false,
    PRIMARY KEY (lane_id, lane_pos)
);
CREATE INDEX ON __S__.parked_entries (job_id);
CREATE INDEX ON __S__.parked_entries (queue);
