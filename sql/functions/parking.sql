-- Parking (migration 0003): cold lanes' unclaimed rows leave the queue ring, so one paused, unworked
-- or misnamed queue never stops reclamation for every queue, and come back when the lane is worked.
--
-- Park (prune_queue_slot, sql/functions/prune.sql) runs under the slot's ACCESS
-- EXCLUSIVE lock and the parked lanes' row locks: it copies the rows past each lane's cursor here,
-- then the slot is truncated as usual. Unpark runs under the lane's row lock (the lock every
-- claimer takes): it moves the rows back into the current slot with their original positions.
-- Those positions are still ahead of the cursor, because only a claim moves a cursor and a claim
-- unparks the lane (after taking its lock, so it cannot miss a park that committed meanwhile)
-- before it reads the cursor. So the lane's order is kept exactly, and no gap is ever stepped over.
--
-- Every function of the engine is defined exactly once, in the file of its plane, and installed with
-- CREATE OR REPLACE by src/schema.rs whenever the combined hash of these files changes. A function
-- that is removed is dropped by name in dropped.sql. __S__ is the validated schema name.

-- Is nobody working this lane? Its queue is paused, or its newest claim (the ledger row with the
-- highest range) is older than p_idle. A lane with no ledger row in the ring (never claimed, or its
-- ledger went with a pruned slot, which a claim that ended at a slot's last row can cause while the
-- lane is busy) is cold only once its oldest waiting job has waited p_idle: a worked lane's next
-- claim comes long before that. Idleness is on the engine's clock (clock.sql), as the claim's
-- attempt time is.
CREATE OR REPLACE FUNCTION __S__.lane_is_cold(p_lane_id int, p_idle interval) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM __S__.queue_lanes l JOIN __S__.queues q ON q.queue = l.queue
                   WHERE l.lane_id = p_lane_id AND q.paused)
        OR coalesce((SELECT a.attempted_at FROM __S__.ready_claim_attempt_batches a
                     WHERE a.lane_id = p_lane_id ORDER BY upper(a.lane_range) DESC LIMIT 1) < __S__.engine_now() - p_idle,
                    (SELECT e.run_at FROM __S__.ready_entries e
                     WHERE e.lane_id = p_lane_id AND e.lane_pos > __S__.lane_cursor(p_lane_id)
                     ORDER BY e.lane_pos LIMIT 1) < __S__.engine_now() - p_idle,
                    false)
$$;

-- The lanes with unclaimed rows in a queue slot, with their cursors. Only lanes with a segment in
-- the slot are asked for their cursor (every ready row is written with its segment, into the
-- segment's slot): a cursor read locks the lane's sequence until the transaction ends, and reading
-- every lane's took one lock per lane, which with a thousand queues (32,000 lanes) overflowed the
-- server's lock table and failed other sessions' statements with "out of shared memory".
CREATE OR REPLACE FUNCTION __S__.slot_pending_lanes(p_slot int)
RETURNS TABLE (lane_id int, queue text, cursor_pos bigint)
LANGUAGE sql STABLE AS $$
    -- materialized: else the planner may read every lane's cursor before it filters the lanes
    WITH in_slot AS MATERIALIZED (
        SELECT DISTINCT s.lane_id FROM __S__.ready_segments s WHERE s.ready_slot = p_slot
    )
    SELECT l.lane_id, l.queue, c.pos
    FROM in_slot g
    JOIN __S__.queue_lanes l ON l.lane_id = g.lane_id
    CROSS JOIN LATERAL (SELECT __S__.lane_cursor(l.lane_id) AS pos) c
    WHERE (SELECT max(e.lane_pos) FROM __S__.ready_entries e
           WHERE e.ready_slot = p_slot AND e.lane_id = l.lane_id) > c.pos
$$;

-- Copy one lane's unclaimed rows of a slot (and their segments) out of the ring. The caller holds
-- the slot's children in ACCESS EXCLUSIVE mode and the lane's row lock, and truncates the slot
-- right after, in the same transaction. A row cancelled while waiting (it has a tombstone) is parked
-- as cancelled, so its segment keeps its size and goes back with a tombstone.
CREATE OR REPLACE FUNCTION __S__.park_lane_rows(p_slot int, p_lane_id int, p_queue text, p_cursor bigint)
RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    v_n int;
BEGIN
    INSERT INTO __S__.parked_segments (lane_id, segment_no, job_count, created_at)
    SELECT s.lane_id, s.segment_no, s.job_count, s.created_at
    FROM __S__.ready_segments s
    WHERE s.ready_slot = p_slot AND s.lane_id = p_lane_id AND s.segment_no >= (p_cursor >> 20);
    INSERT INTO __S__.parked_entries (lane_id, lane_pos, job_id, queue, kind, args, priority, attempt, run_lease,
                                      max_attempts, run_at, created_at, timeout_ms, traceparent, cancelled)
    SELECT e.lane_id, e.lane_pos, e.job_id, e.queue, e.kind, e.args, e.priority, e.attempt, e.run_lease,
           e.max_attempts, e.run_at, e.created_at, e.timeout_ms, e.traceparent,
           EXISTS (SELECT 1 FROM __S__.ready_tombstones t
                   WHERE t.ready_slot = e.ready_slot AND t.job_id = e.job_id AND t.run_lease = e.run_lease)
    FROM __S__.ready_entries e
    WHERE e.ready_slot = p_slot AND e.lane_id = p_lane_id AND e.lane_pos > p_cursor;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    INSERT INTO __S__.parked_lanes (lane_id, queue) VALUES (p_lane_id, p_queue)
    ON CONFLICT (lane_id) DO NOTHING;
    RETURN v_n;
END
$$;

-- Move a parked lane's rows back into the current slot, at their original positions. The caller
-- holds the lane's lock (lock_lane). Returns the number of rows moved back (0: not parked).
-- A row at or behind the cursor cannot occur (see the header); were one ever found, it is handed to
-- deferred_jobs (promotion re-enqueues it at a new position) rather than left where no claim looks.
CREATE OR REPLACE FUNCTION __S__.unpark_lane(p_lane_id int) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    v_slot int;
    v_cursor bigint;
    v_n int;
    v_stranded int;
BEGIN
    DELETE FROM __S__.parked_lanes p WHERE p.lane_id = p_lane_id;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    v_slot := __S__.current_queue_slot();
    v_cursor := __S__.lane_cursor(p_lane_id);
    WITH moved AS (
        DELETE FROM __S__.parked_segments p WHERE p.lane_id = p_lane_id RETURNING p.*
    )
    INSERT INTO __S__.ready_segments (ready_slot, lane_id, segment_no, job_count, created_at)
    SELECT v_slot, m.lane_id, m.segment_no, m.job_count, m.created_at FROM moved m;
    WITH moved AS (
        DELETE FROM __S__.parked_entries p WHERE p.lane_id = p_lane_id RETURNING p.*
    ), back AS (
        INSERT INTO __S__.ready_entries (ready_slot, lane_id, lane_pos, job_id, queue, kind, args, priority,
                                         attempt, run_lease, max_attempts, run_at, created_at, timeout_ms,
                                         traceparent)
        SELECT v_slot, m.lane_id, m.lane_pos, m.job_id, m.queue, m.kind, m.args, m.priority, m.attempt,
               m.run_lease, m.max_attempts, m.run_at, m.created_at, m.timeout_ms, m.traceparent
        FROM moved m WHERE m.lane_pos > v_cursor
        RETURNING 1
    ), tombstones AS (
        INSERT INTO __S__.ready_tombstones (ready_slot, job_id, run_lease, reason)
        SELECT v_slot, m.job_id, m.run_lease, 'cancelled' FROM moved m WHERE m.cancelled AND m.lane_pos > v_cursor
        RETURNING 1
    ), stranded AS (
        INSERT INTO __S__.deferred_jobs (job_id, queue, kind, args, priority, attempt, run_lease, max_attempts,
                                         run_at, created_at, timeout_ms, traceparent)
        SELECT m.job_id, m.queue, m.kind, m.args, m.priority, m.attempt, m.run_lease, m.max_attempts, now(),
               m.created_at, m.timeout_ms, m.traceparent
        FROM moved m WHERE NOT m.cancelled AND m.lane_pos <= v_cursor
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM back), (SELECT count(*) FROM stranded) INTO v_n, v_stranded;
    IF v_stranded > 0 THEN
        PERFORM __S__.wake_promotion();
    END IF;
    RETURN v_n + v_stranded;
END
$$;

-- Unpark every parked lane of a queue that no other claimer holds right now (a held lane is being
-- claimed, and its claimer unparks it itself). The lanes stay locked until the caller commits.
CREATE OR REPLACE FUNCTION __S__.unpark_queue(p_queue text) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    v_lane record;
    v_n int := 0;
BEGIN
    FOR v_lane IN SELECT p.lane_id FROM __S__.parked_lanes p WHERE p.queue = p_queue ORDER BY p.lane_id LOOP
        CONTINUE WHEN NOT pg_try_advisory_xact_lock(__S__.lock_ns('lane'), v_lane.lane_id);
        v_n := v_n + __S__.unpark_lane(v_lane.lane_id);
    END LOOP;
    RETURN v_n;
END
$$;

-- Jobs parked per queue that still wait (not cancelled while parked).
CREATE OR REPLACE FUNCTION __S__.parked_count(p_queue text) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT count(*) FROM __S__.parked_entries p WHERE p.queue = p_queue AND NOT p.cancelled
$$;
