-- ringwork schema version 4: job lifecycle — queue pause/resume, priority aging at claim time,
-- cancel by id (available, scheduled, running), job inspection.

-- Operator switch; an UPDATE only when an operator pauses or resumes (warm/control class).
ALTER TABLE __S__.queues ADD COLUMN paused boolean NOT NULL DEFAULT false;

CREATE FUNCTION __S__.set_queue_paused(p_queue text, p_paused boolean) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM __S__.ensure_lane(p_queue, 2::smallint);
    UPDATE __S__.queues SET paused = p_paused WHERE queue = p_queue AND paused IS DISTINCT FROM p_paused;
    RETURN FOUND;
END
$$;

DROP FUNCTION __S__.claim(text, int, interval);
CREATE FUNCTION __S__.claim(p_queue text, p_max int, p_deadline interval DEFAULT NULL,
                            p_aging interval DEFAULT NULL)
RETURNS TABLE (job_id bigint, run_lease bigint, claim_slot int, receipt_id bigint, kind text, args jsonb,
               attempt int, max_attempts int, priority smallint, created_at timestamptz,
               deadline_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    v_claim_slot int;
    v_batch bigint;
    v_now timestamptz := now();
    v_batch_deadline timestamptz := now() + p_deadline;
    v_own_deadline timestamptz;
    v_lane record;
    v_cursor bigint;
    v_seq_cursor bigint;
    v_new_cursor bigint;
    v_last_slot int;
    v_row record;
    v_n int := 0;
    v_job_ids bigint[] := '{}';
    v_leases bigint[] := '{}';
    v_ready_slots int[] := '{}';
    v_lane_ids int[] := '{}';
    v_attempts int[] := '{}';
    v_max_attempts int[] := '{}';
    v_receipts int8multirange := '{}';
    v_locked_any boolean := false;
    v_lock_timeout text;
BEGIN
    IF p_max < 1 OR p_max > 4096 THEN
        RAISE EXCEPTION 'ringwork: claim size must be 1..4096, got %', p_max USING ERRCODE = '22023';
    END IF;
    -- A claim's commit need not wait for its WAL flush: the lane lock is held until commit, so the
    -- flush wait would serialise every claimer of the lane behind the disk. A claim lost in a
    -- server crash only makes its jobs claimable again (at-least-once: they may run twice); it
    -- cannot lose a job, because WAL is flushed in order: any later durable record (a completion,
    -- or the next claimer's cursor setval past these rows) makes this commit durable first.
    PERFORM set_config('synchronous_commit', 'off', true);
    SELECT s.slot INTO v_claim_slot FROM __S__.claim_ring_slots s WHERE s.state = 'current';
    v_batch := nextval('__S__.claim_batch_ids');

    IF EXISTS (SELECT 1 FROM __S__.queues q WHERE q.queue = p_queue AND q.paused) THEN
        RETURN;
    END IF;
    -- Lanes by effective priority: with aging, a lane's priority improves by one level per
    -- p_aging its oldest waiting job has been runnable (run_at: enqueue, or promotion of a
    -- scheduled/retried job), so low priorities never starve.
    -- The lane cursors are read once, in a materialized CTE: pg_sequence_last_value is volatile,
    -- and used directly in the head probe it could not bound the index scan (the probe would walk
    -- every already-claimed row of the lane).
    FOR v_lane IN
        WITH lanes AS MATERIALIZED (
            SELECT l.lane_id, l.segment_seq, l.cursor_seq, l.priority,
                   coalesce(pg_sequence_last_value(l.cursor_seq), 0) AS cursor_pos,
                   pg_sequence_last_value(l.segment_seq) AS last_segment
            FROM __S__.queue_lanes l
            WHERE l.queue = p_queue
        )
        SELECT l.lane_id, l.segment_seq, l.cursor_seq FROM lanes l
        LEFT JOIN LATERAL (
            SELECT e.run_at FROM __S__.ready_entries e
            WHERE p_aging IS NOT NULL AND e.lane_id = l.lane_id AND e.lane_pos > l.cursor_pos
            ORDER BY e.lane_pos LIMIT 1
        ) head ON true
        WHERE l.last_segment IS NOT NULL AND l.last_segment >= l.cursor_pos >> 20
        ORDER BY l.priority - coalesce(floor(extract(epoch FROM v_now - head.run_at)
                                             / nullif(extract(epoch FROM p_aging), 0)), 0),
                 l.priority
    LOOP
        EXIT WHEN v_n >= p_max;
        -- The first lane tried is worth waiting for: its holder is another claim (or a cancel), a
        -- transaction of a few milliseconds, and skipping would return nothing and send this worker
        -- to sleep while the queue is full (with several worker processes on one lane, most claims
        -- would come back empty). Waiting is deadlock-free because this claim holds no lane lock
        -- yet. Every later lane is tried with SKIP LOCKED: while holding a lane, never wait for one.
        -- The wait is bounded (200 ms): a lane held longer (a cancel_job inside someone's open
        -- transaction) is skipped as before rather than stalling every claimer of the queue.
        IF v_locked_any THEN
            PERFORM 1 FROM __S__.queue_lanes l WHERE l.lane_id = v_lane.lane_id FOR UPDATE SKIP LOCKED;
            CONTINUE WHEN NOT FOUND;
        ELSE
            v_lock_timeout := current_setting('lock_timeout');
            PERFORM set_config('lock_timeout', '200ms', true);
            BEGIN
                PERFORM 1 FROM __S__.queue_lanes l WHERE l.lane_id = v_lane.lane_id FOR UPDATE;
                v_locked_any := true;
            EXCEPTION WHEN lock_not_available THEN
                v_locked_any := false;
            END;
            PERFORM set_config('lock_timeout', v_lock_timeout, true);
            CONTINUE WHEN NOT v_locked_any;
        END IF;

        v_seq_cursor := coalesce(pg_sequence_last_value(v_lane.cursor_seq), 0);
        v_cursor := __S__.lane_cursor(v_lane.lane_id);
        IF v_cursor > v_seq_cursor THEN
            PERFORM setval(v_lane.cursor_seq, v_cursor, true);
        END IF;
        v_new_cursor := v_cursor;

        FOR v_row IN
            SELECT e.ready_slot, e.lane_pos, e.job_id, e.kind, e.args, e.attempt, e.run_lease,
                   e.max_attempts, e.priority, e.created_at, e.timeout_ms, e.queue,
                   EXISTS (SELECT 1 FROM __S__.ready_tombstones t
                           WHERE t.ready_slot = e.ready_slot AND t.job_id = e.job_id
                             AND t.run_lease = e.run_lease) AS spent
            FROM __S__.ready_entries e
            WHERE e.lane_id = v_lane.lane_id AND e.lane_pos > v_cursor
            ORDER BY e.lane_pos
            LIMIT (p_max - v_n) + 64
        LOOP
            IF (v_row.lane_pos >> 20) > (v_new_cursor >> 20) + 1 THEN
                EXIT WHEN NOT __S__.lane_gap_resolved(v_lane.lane_id, v_row.lane_pos >> 20);
                EXIT WHEN EXISTS (SELECT 1 FROM __S__.ready_segments g
                                  WHERE g.lane_id = v_lane.lane_id
                                    AND g.segment_no > (v_new_cursor >> 20)
                                    AND g.segment_no < (v_row.lane_pos >> 20));
            END IF;
            EXIT WHEN NOT v_row.spent AND v_n >= p_max;
            v_new_cursor := v_row.lane_pos;
            v_last_slot := v_row.ready_slot;
            CONTINUE WHEN v_row.spent;

            job_id := v_row.job_id;
            run_lease := v_row.run_lease + 1;
            claim_slot := v_claim_slot;
            receipt_id := v_batch * 4096 + v_n;
            kind := v_row.kind;
            args := v_row.args;
            attempt := v_row.attempt + 1;
            max_attempts := v_row.max_attempts;
            priority := v_row.priority;
            created_at := v_row.created_at;
            v_own_deadline := v_now + make_interval(secs => v_row.timeout_ms / 1000.0);
            IF v_row.timeout_ms IS NOT NULL AND v_own_deadline IS DISTINCT FROM v_batch_deadline THEN
                deadline_at := v_own_deadline;
                INSERT INTO __S__.lease_claims (claim_slot, receipt_id, job_id, run_lease, queue, ready_slot,
                                                lane_id, attempt, max_attempts, claimed_at, deadline_at)
                VALUES (v_claim_slot, v_batch * 4096 + v_n, v_row.job_id, v_row.run_lease + 1, v_row.queue,
                        v_row.ready_slot, v_lane.lane_id, v_row.attempt + 1, v_row.max_attempts, v_now,
                        v_own_deadline);
                -- keep the compact arrays positional (receipt ordinal = array index - 1); the
                -- multirange, not the arrays, says which ordinals are compact members
                v_job_ids := v_job_ids || v_row.job_id;
                v_leases := v_leases || (v_row.run_lease + 1);
            ELSE
                deadline_at := v_batch_deadline;
                v_job_ids := v_job_ids || v_row.job_id;
                v_leases := v_leases || (v_row.run_lease + 1);
                v_receipts := v_receipts + int8multirange(int8range(v_batch * 4096 + v_n, v_batch * 4096 + v_n + 1));
            END IF;
            RETURN NEXT;
            v_ready_slots := v_ready_slots || v_row.ready_slot;
            v_lane_ids := v_lane_ids || v_lane.lane_id;
            v_attempts := v_attempts || (v_row.attempt + 1);
            v_max_attempts := v_max_attempts || v_row.max_attempts;
            v_n := v_n + 1;
        END LOOP;

        IF v_new_cursor > v_cursor THEN
            INSERT INTO __S__.ready_claim_attempt_batches (ready_slot, lane_id, lane_range, claim_slot, claim_batch_id)
            VALUES (v_last_slot, v_lane.lane_id, int8range(v_cursor + 1, v_new_cursor + 1), v_claim_slot, v_batch);
        END IF;
    END LOOP;

    IF NOT isempty(v_receipts) THEN
        INSERT INTO __S__.lease_claim_batches (claim_slot, batch_id, queue, job_ids, run_leases, ready_slots,
                                               lane_ids, attempts, max_attempts, receipt_ranges,
                                               claimed_count, claimed_at, deadline_at)
        VALUES (v_claim_slot, v_batch, p_queue, v_job_ids, v_leases, v_ready_slots, v_lane_ids, v_attempts,
                v_max_attempts, v_receipts,
                (SELECT sum(upper(r) - lower(r)) FROM unnest(v_receipts) r), v_now, v_batch_deadline);
    END IF;
END
$$;


-- ---------------------------------------------------------------------------------------------
-- Cancel by id. Returns what happened: 'cancelled' (available or scheduled: it will never run),
-- 'cancelled_running' (its open claim was closed as cancelled; the handler is told through NOTIFY
-- and any late completion is stale), 'already_finished', or 'not_found'.
--
-- An available job is cancelled with a ready_tombstones row (INSERT only). Deciding "available"
-- versus "claimed" takes the lane head lock FOR UPDATE — the lock every claimer takes — and then
-- reads the lane cursor in a new statement, so a claim and a cancel of the same job serialize:
-- the job is either tombstoned before any claim reads it, or cancelled as a running attempt.
-- ---------------------------------------------------------------------------------------------
CREATE FUNCTION __S__.cancel_job(p_job_id bigint, p_reason text DEFAULT 'cancelled') RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_deferred __S__.deferred_jobs;
    v_ready record;
    v_current int;
    v_claim record;
BEGIN
    SELECT slot INTO v_current FROM __S__.queue_ring_slots WHERE state = 'current';
    -- scheduled or waiting for a retry
    DELETE FROM __S__.deferred_jobs d WHERE d.job_id = p_job_id RETURNING * INTO v_deferred;
    IF FOUND THEN
        INSERT INTO __S__.done_entries (ready_slot, job_id, run_lease, queue, kind, args, priority, attempt,
                                        max_attempts, state, error, created_at)
        VALUES (v_current, v_deferred.job_id, v_deferred.run_lease, v_deferred.queue, v_deferred.kind,
                v_deferred.args, v_deferred.priority, v_deferred.attempt, v_deferred.max_attempts, 'cancelled',
                p_reason, v_deferred.created_at);
        RETURN 'cancelled';
    END IF;
    IF EXISTS (SELECT 1 FROM __S__.done_entries WHERE job_id = p_job_id) THEN
        RETURN 'already_finished';
    END IF;
    SELECT e.* INTO v_ready FROM __S__.ready_entries e WHERE e.job_id = p_job_id ORDER BY e.run_lease DESC LIMIT 1;
    IF NOT FOUND THEN
        RETURN 'not_found';
    END IF;
    PERFORM 1 FROM __S__.queue_lanes l WHERE l.lane_id = v_ready.lane_id FOR UPDATE;
    IF v_ready.lane_pos > __S__.lane_cursor(v_ready.lane_id) THEN
        IF EXISTS (SELECT 1 FROM __S__.ready_tombstones t WHERE t.job_id = p_job_id AND t.run_lease = v_ready.run_lease) THEN
            RETURN 'already_finished';
        END IF;
        INSERT INTO __S__.ready_tombstones (ready_slot, job_id, run_lease, reason)
        VALUES (v_ready.ready_slot, p_job_id, v_ready.run_lease, p_reason);
        INSERT INTO __S__.done_entries (ready_slot, job_id, run_lease, queue, kind, args, priority, attempt,
                                        max_attempts, state, error, created_at)
        VALUES (v_ready.ready_slot, p_job_id, v_ready.run_lease, v_ready.queue, v_ready.kind, v_ready.args,
                v_ready.priority, v_ready.attempt, v_ready.max_attempts, 'cancelled', p_reason, v_ready.created_at);
        RETURN 'cancelled';
    END IF;
    -- claimed: find the attempt's claim (compact member or row-local) in the claim ring
    SELECT x.claim_slot, x.receipt_id INTO v_claim FROM (
        SELECT b.claim_slot, b.batch_id * 4096 + i - 1 AS receipt_id
        FROM __S__.lease_claim_batches b, generate_subscripts(b.job_ids, 1) i
        WHERE p_job_id = ANY (b.job_ids) AND b.job_ids[i] = p_job_id AND b.run_leases[i] = v_ready.run_lease + 1
          AND b.receipt_ranges @> (b.batch_id * 4096 + i - 1)
        UNION ALL
        SELECT l.claim_slot, l.receipt_id FROM __S__.lease_claims l
        WHERE l.job_id = p_job_id AND l.run_lease = v_ready.run_lease + 1
    ) x LIMIT 1;
    IF FOUND AND (SELECT c.accepted FROM __S__.close_batch(ARRAY[v_claim.claim_slot], ARRAY[v_claim.receipt_id],
                       ARRAY[p_job_id], ARRAY[v_ready.run_lease + 1], ARRAY['cancelled'],
                       ARRAY[NULL::timestamptz], ARRAY[p_reason]) c) THEN
        PERFORM pg_notify('ringwork___S___cancel', p_job_id || ':' || (v_ready.run_lease + 1));
        RETURN 'cancelled_running';
    END IF;
    -- the attempt closed while we looked; if it closed into a retry, the job waits in
    -- deferred_jobs now (new statement, fresh snapshot) and is cancelled there
    DELETE FROM __S__.deferred_jobs d WHERE d.job_id = p_job_id RETURNING * INTO v_deferred;
    IF FOUND THEN
        INSERT INTO __S__.done_entries (ready_slot, job_id, run_lease, queue, kind, args, priority, attempt,
                                        max_attempts, state, error, created_at)
        VALUES (v_current, v_deferred.job_id, v_deferred.run_lease, v_deferred.queue, v_deferred.kind,
                v_deferred.args, v_deferred.priority, v_deferred.attempt, v_deferred.max_attempts, 'cancelled',
                p_reason, v_deferred.created_at);
        RETURN 'cancelled';
    END IF;
    RETURN 'already_finished';
END
$$;

-- Where a job is now, for operators and load_job: its latest state from every place it can live.
CREATE FUNCTION __S__.job_state(p_job_id bigint)
RETURNS TABLE (state text, queue text, kind text, attempt int, run_lease bigint, detail text)
LANGUAGE sql STABLE AS $$
    WITH ready AS (
        SELECT e.* FROM __S__.ready_entries e WHERE e.job_id = p_job_id ORDER BY e.run_lease DESC LIMIT 1
    )
    SELECT s.state, s.queue, s.kind, s.attempt, s.run_lease, s.detail FROM (
        SELECT d.state, d.queue, d.kind, d.attempt, d.run_lease, d.error AS detail, 1 AS rank
        FROM __S__.done_entries d WHERE d.job_id = p_job_id
        UNION ALL
        SELECT CASE WHEN d.attempt = 0 THEN 'scheduled' ELSE 'retryable' END, d.queue, d.kind, d.attempt,
               d.run_lease, d.last_error, 2
        FROM __S__.deferred_jobs d WHERE d.job_id = p_job_id
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
             LATERAL (SELECT CASE WHEN r.lane_pos > __S__.lane_cursor(r.lane_id) THEN 'available'
                                  ELSE 'running' END AS state) x
    ) s ORDER BY s.rank LIMIT 1
$$;
