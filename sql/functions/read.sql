-- Reads: a job's state and history, exact per-queue counts. No writes.
--
-- Every function of the engine is defined exactly once, in the file of its plane, and installed with
-- CREATE OR REPLACE by src/schema.rs whenever the combined hash of these files changes. A function
-- that is removed is dropped by name in dropped.sql. __S__ is the validated schema name.

-- job_state learns about the DLQ.
CREATE OR REPLACE FUNCTION __S__.job_state(p_job_id bigint)
RETURNS TABLE (state text, queue text, kind text, attempt int, run_lease bigint, detail text)
LANGUAGE sql STABLE AS $$
    WITH ready AS (
        SELECT e.* FROM __S__.ready_entries e WHERE e.job_id = p_job_id ORDER BY e.run_lease DESC LIMIT 1
    )
    SELECT s.state, s.queue, s.kind, s.attempt, s.run_lease, s.detail FROM (
        SELECT 'dead_lettered' AS state, d.queue, d.kind, d.attempt, d.run_lease, d.error AS detail, 0 AS rank
        FROM __S__.dlq_entries d WHERE d.job_id = p_job_id
        UNION ALL
        SELECT d.state, d.queue, d.kind, d.attempt, d.run_lease, d.error, 1
        FROM __S__.done_entries d WHERE d.job_id = p_job_id
          AND NOT EXISTS (SELECT 1 FROM __S__.deferred_jobs x WHERE x.job_id = p_job_id AND x.run_lease > d.run_lease)
        UNION ALL
        -- finished and archived (sql/functions/archive.sql): its slot is gone
        SELECT a.state, a.queue, a.kind, a.attempt, a.run_lease, a.error, 1
        FROM __S__.archived_job(p_job_id) a
        WHERE NOT EXISTS (SELECT 1 FROM __S__.deferred_jobs x WHERE x.job_id = p_job_id AND x.run_lease > a.run_lease)
        UNION ALL
        -- held under a key limit (migration 0012): waiting like any available job
        SELECT CASE WHEN d.held_key IS NOT NULL THEN 'available'
                    WHEN d.attempt = 0 THEN 'scheduled' ELSE 'retryable' END, d.queue, d.kind, d.attempt,
               d.run_lease, CASE WHEN d.held_key IS NOT NULL THEN 'held: key at its limit' ELSE d.last_error END, 2
        FROM __S__.deferred_jobs d WHERE d.job_id = p_job_id
        UNION ALL
        -- parked (sql/functions/parking.sql): waiting like any available job, or cancelled while
        -- it waited (its cancel row may be gone from the archive long before the parked row)
        SELECT CASE WHEN p.cancelled THEN 'cancelled' ELSE 'available' END, p.queue, p.kind, p.attempt,
               p.run_lease, 'parked', 3
        FROM __S__.parked_entries p WHERE p.job_id = p_job_id
        UNION ALL
        SELECT 'completed', r.queue, r.kind, r.attempt + 1, r.run_lease + 1, NULL, 3
        FROM ready r WHERE EXISTS (SELECT 1 FROM __S__.receipt_completion_batches c
                                   WHERE c.ready_slot = r.ready_slot AND p_job_id = ANY (c.job_ids)
                                     AND (r.run_lease + 1) = ANY (c.run_leases))
        UNION ALL
        SELECT x.state, r.queue, r.kind,
               CASE WHEN x.state = 'running' THEN r.attempt + 1 ELSE r.attempt END,
               CASE WHEN x.state = 'running' THEN r.run_lease + 1 ELSE r.run_lease END, NULL, 4
        FROM ready r,
             LATERAL (SELECT CASE WHEN EXISTS (SELECT 1 FROM __S__.ready_tombstones t
                                               WHERE t.ready_slot = r.ready_slot AND t.job_id = r.job_id
                                                 AND t.run_lease = r.run_lease) THEN 'cancelled'
                                  WHEN r.lane_pos > __S__.lane_cursor(r.lane_id) THEN 'available'
                                  ELSE 'running' END AS state) x
    ) s ORDER BY s.rank LIMIT 1
$$;

CREATE OR REPLACE FUNCTION __S__.queue_counts(p_queue text DEFAULT NULL)
RETURNS TABLE (queue text, paused boolean, available bigint, scheduled bigint, retryable bigint, running bigint,
               completed bigint, failed bigint, cancelled bigint, dead_lettered bigint)
-- jit off: a custom plan of this statement over every ring partition can estimate above
-- jit_above_cost, and compiling it took 0.9 s for a count that runs in 10 ms (bench-counts)
LANGUAGE sql STABLE SET jit = off AS $$
    SELECT q.queue, q.paused,
           (SELECT coalesce(sum(__S__.lane_available(l.lane_id)), 0)::bigint
            FROM __S__.queue_lanes l WHERE l.queue = q.queue) + __S__.parked_count(q.queue)
           + (SELECT count(*) FROM __S__.deferred_jobs d WHERE d.queue = q.queue AND d.held_key IS NOT NULL),
           (SELECT count(*) FROM __S__.deferred_jobs d
            WHERE d.queue = q.queue AND d.attempt = 0 AND d.held_key IS NULL),
           (SELECT count(*) FROM __S__.deferred_jobs d
            WHERE d.queue = q.queue AND d.attempt > 0 AND d.held_key IS NULL),
           __S__.count_in_flight(q.queue)::bigint,
           -- terminal counts are durable totals: what the ring still holds plus what prune recorded
           -- in terminal_totals for the slots it truncated (archive.sql)
           (SELECT coalesce(sum(b.completed_count), 0)::bigint
            FROM __S__.receipt_completion_batches b WHERE b.queue = q.queue)
           + (SELECT count(*) FROM __S__.done_entries d WHERE d.queue = q.queue AND d.state = 'completed')
           + tt.completed,
           (SELECT count(*) FROM __S__.done_entries d WHERE d.queue = q.queue AND d.state = 'failed')
           + tt.failed,
           (SELECT count(*) FROM __S__.done_entries d WHERE d.queue = q.queue AND d.state = 'cancelled')
           + tt.cancelled,
           (SELECT count(*) FROM __S__.dlq_entries d WHERE d.queue = q.queue)
    FROM __S__.queues q
    CROSS JOIN LATERAL (
        SELECT coalesce(sum(t.completed), 0)::bigint AS completed, coalesce(sum(t.failed), 0)::bigint AS failed,
               coalesce(sum(t.cancelled), 0)::bigint AS cancelled
        FROM __S__.terminal_totals t WHERE t.queue = q.queue
    ) tt
    WHERE p_queue IS NULL OR q.queue = p_queue
    ORDER BY q.queue
$$;

-- How long the queue's oldest available job has waited since its run_at, or NULL when none: one
-- index probe (the head of the lane past its cursor) per shard that may hold work, plus the oldest
-- parked job; never a scan of job rows. A cancelled job at a lane's head counts until a claim steps
-- past it; a job still in its producer's open transaction is not visible, so it does not count.
CREATE OR REPLACE FUNCTION __S__.oldest_available_wait(p_queue text) RETURNS interval
LANGUAGE sql STABLE SET jit = off AS $$
    SELECT now() - min(h.run_at) FROM (
        SELECT (SELECT e.run_at FROM __S__.ready_entries e
                WHERE e.lane_id = l.lane_id AND e.lane_pos > __S__.lane_cursor(l.lane_id)
                ORDER BY e.lane_pos LIMIT 1) AS run_at
        FROM __S__.queue_lanes l
        WHERE l.queue = p_queue
          AND __S__.shard_may_have_work(pg_sequence_last_value(l.segment_seq),
                                        pg_sequence_last_value(l.cursor_seq))
        UNION ALL
        SELECT min(p.run_at) FROM __S__.parked_entries p WHERE p.queue = p_queue AND NOT p.cancelled
    ) h
$$;

-- One job's recorded history, oldest attempt first: its terminal rows (completed, failed,
-- cancelled), earlier failed attempts carried in deferred_jobs.last_error, and a dead-letter entry.
CREATE OR REPLACE FUNCTION __S__.job_history(p_job_id bigint)
RETURNS TABLE (run_lease bigint, state text, error text, at timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT h.run_lease, h.state, h.error, h.at FROM (
        SELECT t.run_lease, t.state, t.error, t.finalized_at AS at
        FROM __S__.terminal_jobs t WHERE t.job_id = p_job_id
        UNION ALL
        SELECT a.run_lease, a.state, a.error, a.finalized_at FROM __S__.archived_job(p_job_id) a
        UNION ALL
        SELECT d.run_lease,
               CASE WHEN d.held_key IS NOT NULL THEN 'available'
                    WHEN d.attempt = 0 THEN 'scheduled' ELSE 'retryable' END,
               d.last_error, CASE WHEN d.held_key IS NOT NULL THEN d.created_at ELSE d.run_at END
        FROM __S__.deferred_jobs d WHERE d.job_id = p_job_id
        UNION ALL
        SELECT x.run_lease, 'dead_lettered', x.error, x.failed_at
        FROM __S__.dlq_entries x WHERE x.job_id = p_job_id
    ) h
    ORDER BY h.run_lease, h.at
$$;

-- Jobs waiting to run (available, scheduled, retryable; parked ones as available), optionally of
-- one queue and one kind, oldest first. Seen from the caller's transaction, so it lists jobs that
-- transaction enqueued and has not committed (what a test asserts). Reads the ready rows above each
-- lane's cursor: for tests and small inspections, not for scraping a large queue.
CREATE OR REPLACE FUNCTION __S__.pending_jobs(p_queue text DEFAULT NULL, p_kind text DEFAULT NULL,
                                             p_limit int DEFAULT 1000)
RETURNS TABLE (job_id bigint, state text, queue text, kind text, args jsonb, priority smallint, attempt int,
               run_at timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT p.job_id, p.state, p.queue, p.kind, p.args, p.priority, p.attempt, p.run_at FROM (
        SELECT e.job_id, 'available' AS state, e.queue, e.kind, e.args, e.priority, e.attempt, e.run_at
        FROM __S__.queue_lanes l
        JOIN __S__.ready_entries e ON e.lane_id = l.lane_id AND e.lane_pos > __S__.lane_cursor(l.lane_id)
        WHERE (p_queue IS NULL OR l.queue = p_queue) AND (p_kind IS NULL OR e.kind = p_kind)
          AND NOT EXISTS (SELECT 1 FROM __S__.ready_tombstones t
                          WHERE t.ready_slot = e.ready_slot AND t.job_id = e.job_id AND t.run_lease = e.run_lease)
        UNION ALL
        SELECT d.job_id, CASE WHEN d.held_key IS NOT NULL THEN 'available'
                              WHEN d.attempt = 0 THEN 'scheduled' ELSE 'retryable' END, d.queue, d.kind, d.args,
               d.priority, d.attempt, CASE WHEN d.held_key IS NOT NULL THEN d.created_at ELSE d.run_at END
        FROM __S__.deferred_jobs d
        WHERE (p_queue IS NULL OR d.queue = p_queue) AND (p_kind IS NULL OR d.kind = p_kind)
        UNION ALL
        SELECT x.job_id, 'available', x.queue, x.kind, x.args, x.priority, x.attempt, x.run_at
        FROM __S__.parked_entries x
        WHERE NOT x.cancelled AND (p_queue IS NULL OR x.queue = p_queue) AND (p_kind IS NULL OR x.kind = p_kind)
    ) p ORDER BY p.run_at, p.job_id LIMIT p_limit
$$;

-- The last progress recorded for a job (by its running attempt, or left by an earlier attempt that
-- was retried, snoozed or rescued), with the run_lease that recorded it and when.
CREATE OR REPLACE FUNCTION __S__.job_progress(p_job_id bigint)
RETURNS TABLE (run_lease bigint, progress jsonb, recorded_at timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT a.run_lease, a.progress, a.heartbeat_at FROM __S__.attempt_state a
    WHERE a.job_id = p_job_id AND a.progress IS NOT NULL
    ORDER BY a.run_lease DESC LIMIT 1
$$;
