-- External callbacks: attempts that wait for a callback from outside, held in the lease ring
-- (migration 0015) until answered, timed out or rescued.
--
-- Every function of the engine is defined exactly once, in the file of its plane, and installed with
-- CREATE OR REPLACE by src/schema.rs whenever the combined hash of these files changes. A function
-- that is removed is dropped by name in dropped.sql. __S__ is the validated schema name.
--
-- Locks. Every function that reads or writes a lease row first takes the lease ring's advisory lock
-- in SHARE mode (lease_ring_shared), and rotation takes it exclusively. The readers (waiting_count
-- for queue_counts, list_jobs) are VOLATILE for the same reason: their statements take a snapshot
-- after the lock. job_state's lookup by job id reads the row without it: a call that waits behind a
-- rotation can miss a waiting job for that moment. Rotation moves live rows
-- (TRUNCATE and re-insert); a statement whose snapshot predates that move would not find them, so
-- no such statement may be in flight when rotation runs, and every statement after the shared lock
-- takes its snapshot after any rotation it waited for. Then, per job, the attempt lock
-- (lock_attempt) that completion, close, cancel and rescue take, so a callback, its timeout, the
-- handler's return and a claim rescue decide one at a time.

CREATE OR REPLACE FUNCTION __S__.lease_slot_count() RETURNS int
LANGUAGE sql IMMUTABLE AS $$ SELECT 8 $$;

CREATE OR REPLACE FUNCTION __S__.lease_ring_shared() RETURNS void
LANGUAGE sql AS $$ SELECT pg_advisory_xact_lock_shared(__S__.lock_ns('lease_ring'), 0) $$;

-- The handler of an open attempt registers a callback: a 'registered' lease in the current slot,
-- carrying the job. 'registered', 'stale' (the attempt is not open: rescued, cancelled, or never
-- claimed) or 'already_registered' (one callback per attempt).
CREATE OR REPLACE FUNCTION __S__.register_callback(p_claim_slot int, p_receipt_id bigint, p_job_id bigint,
                                                   p_run_lease bigint, p_callback_id bytea,
                                                   p_timeout interval) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_open record;
BEGIN
    PERFORM __S__.lease_ring_shared();
    PERFORM __S__.lock_attempt(p_job_id);
    SELECT * INTO v_open
    FROM __S__.open_attempts(ARRAY[p_claim_slot], ARRAY[p_receipt_id], ARRAY[p_job_id], ARRAY[p_run_lease],
                             p_claim_slot, p_claim_slot);
    IF NOT FOUND THEN
        RETURN 'stale';
    END IF;
    IF EXISTS (SELECT 1 FROM __S__.leases l WHERE l.job_id = p_job_id AND l.run_lease = p_run_lease) THEN
        RETURN 'already_registered';
    END IF;
    INSERT INTO __S__.leases (lease_slot, callback_id, state, job_id, run_lease, claim_slot, receipt_id, queue,
                              kind, args, priority, attempt, max_attempts, created_at, timeout_ms, traceparent,
                              timeout_at)
    SELECT pg_sequence_last_value('__S__.lease_ring_current')::int, p_callback_id, 'registered', p_job_id,
           p_run_lease, p_claim_slot, p_receipt_id, e.queue, e.kind, e.args, e.priority, v_open.attempt,
           e.max_attempts, e.created_at, e.timeout_ms, e.traceparent, __S__.engine_now() + p_timeout
    FROM __S__.ready_entries e
    WHERE e.ready_slot = v_open.ready_slot AND e.job_id = p_job_id AND e.run_lease = p_run_lease - 1
    LIMIT 1;
    IF NOT FOUND THEN
        RETURN 'stale';
    END IF;
    RETURN 'registered';
END
$$;

-- End a wait: apply the callback's action to the lease's job and delete the lease. The caller holds
-- the lease ring's shared lock and the job's attempt lock. complete: a completed history row;
-- fail: a failed row, or the dead-letter queue when the queue has one; cancel (cancel_job): a
-- cancelled row; retry: the job runs again
-- (a failure when its attempts are used up); resume: the job runs again without using an attempt,
-- and the next attempt reads p_payload (JobContext::callback_payload).
CREATE OR REPLACE FUNCTION __S__.end_wait(p_lease __S__.leases, p_action text, p_payload jsonb, p_error text)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    l __S__.leases := p_lease;
    v_action text := p_action;
    v_error text := p_error;
BEGIN
    IF v_action = 'retry' AND l.attempt >= l.max_attempts THEN
        v_action := 'fail';
        v_error := coalesce(v_error, 'retried') || ' (attempts used up)';
    END IF;
    IF v_action = 'complete' THEN
        INSERT INTO __S__.done_entries (ready_slot, job_id, run_lease, queue, kind, args, priority, attempt,
                                        max_attempts, state, error, created_at)
        VALUES (__S__.current_queue_slot(), l.job_id, l.run_lease, l.queue, l.kind, l.args, l.priority, l.attempt,
                l.max_attempts, 'completed', NULL, l.created_at);
    ELSIF v_action = 'cancel' THEN
        INSERT INTO __S__.done_entries (ready_slot, job_id, run_lease, queue, kind, args, priority, attempt,
                                        max_attempts, state, error, created_at)
        VALUES (__S__.current_queue_slot(), l.job_id, l.run_lease, l.queue, l.kind, l.args, l.priority, l.attempt,
                l.max_attempts, 'cancelled', v_error, l.created_at);
    ELSIF v_action = 'fail' THEN
        IF (SELECT q.dlq_enabled FROM __S__.queues q WHERE q.queue = l.queue) THEN
            INSERT INTO __S__.dlq_entries (job_id, queue, kind, args, priority, attempt, run_lease, max_attempts,
                                           error, created_at, timeout_ms, traceparent)
            VALUES (l.job_id, l.queue, l.kind, l.args, l.priority, l.attempt, l.run_lease, l.max_attempts,
                    v_error, l.created_at, l.timeout_ms, l.traceparent);
        ELSE
            INSERT INTO __S__.done_entries (ready_slot, job_id, run_lease, queue, kind, args, priority, attempt,
                                            max_attempts, state, error, created_at)
            VALUES (__S__.current_queue_slot(), l.job_id, l.run_lease, l.queue, l.kind, l.args, l.priority,
                    l.attempt, l.max_attempts, 'failed', v_error, l.created_at);
        END IF;
    ELSIF v_action IN ('retry', 'resume') THEN
        INSERT INTO __S__.deferred_jobs (job_id, queue, kind, args, priority, attempt, run_lease, max_attempts,
                                         run_at, created_at, last_error, timeout_ms, traceparent)
        VALUES (l.job_id, l.queue, l.kind, l.args, l.priority,
                CASE WHEN v_action = 'resume' THEN l.attempt - 1 ELSE l.attempt END, l.run_lease, l.max_attempts,
                __S__.engine_now(), l.created_at, v_error, l.timeout_ms, l.traceparent);
        PERFORM __S__.wake_promotion();
    ELSE
        RAISE EXCEPTION 'unknown callback action %', v_action USING ERRCODE = '22023';
    END IF;
    IF v_action = 'resume' THEN
        -- the next attempt is run_lease + 1 (promotion keeps the run_lease, the claim adds one)
        INSERT INTO __S__.attempt_state AS a (job_id, run_lease, heartbeat_at, callback)
        VALUES (l.job_id, l.run_lease + 1, __S__.engine_now(), coalesce(p_payload, 'null'::jsonb))
        ON CONFLICT ON CONSTRAINT attempt_state_pkey DO UPDATE SET callback = excluded.callback;
    ELSIF v_action IN ('complete', 'fail', 'cancel') THEN
        DELETE FROM __S__.attempt_state a WHERE a.job_id = l.job_id;
    END IF;
    DELETE FROM __S__.leases x WHERE x.lease_slot = l.lease_slot AND x.callback_id = l.callback_id;
END
$$;

-- The handler returned JobError::WaitForCallback: close the attempt's claim ('waiting') and let its
-- lease wait, or apply at once a callback that arrived while the handler ran. 'waiting',
-- 'applied', 'stale' (the attempt is not open any more) or 'no_callback' (nothing registered: the
-- caller closes the attempt as a failure).
CREATE OR REPLACE FUNCTION __S__.await_callback(p_claim_slot int, p_receipt_id bigint, p_job_id bigint,
                                                p_run_lease bigint) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_open record;
    v_lease __S__.leases;
BEGIN
    PERFORM __S__.lease_ring_shared();
    PERFORM __S__.lock_attempt(p_job_id);
    SELECT * INTO v_open
    FROM __S__.open_attempts(ARRAY[p_claim_slot], ARRAY[p_receipt_id], ARRAY[p_job_id], ARRAY[p_run_lease],
                             p_claim_slot, p_claim_slot);
    IF NOT FOUND THEN
        RETURN 'stale';
    END IF;
    SELECT * INTO v_lease FROM __S__.leases l
    WHERE l.job_id = p_job_id AND l.run_lease = p_run_lease AND l.state IN ('registered', 'resolved');
    IF NOT FOUND THEN
        RETURN 'no_callback';
    END IF;
    IF v_open.shape = 'compact' THEN
        INSERT INTO __S__.lease_claim_closure_batches (claim_slot, batch_id, receipt_ranges, closed_count, outcome)
        VALUES (p_claim_slot, nextval('__S__.evidence_batch_ids'),
                int8multirange(int8range(p_receipt_id, p_receipt_id + 1)), 1, 'waiting');
    ELSE
        INSERT INTO __S__.lease_claim_closures (claim_slot, receipt_id, job_id, run_lease, outcome)
        VALUES (p_claim_slot, p_receipt_id, p_job_id, p_run_lease, 'waiting');
    END IF;
    -- the attempt's heartbeat row goes with it; recorded progress stays for the next attempt
    DELETE FROM __S__.attempt_state a
    WHERE a.job_id = p_job_id AND a.run_lease = p_run_lease AND a.progress IS NULL;
    IF v_lease.state = 'resolved' THEN
        PERFORM __S__.end_wait(v_lease, v_lease.action, v_lease.payload, v_lease.error);
        RETURN 'applied';
    END IF;
    UPDATE __S__.leases l SET state = 'waiting'
    WHERE l.lease_slot = v_lease.lease_slot AND l.callback_id = v_lease.callback_id;
    RETURN 'waiting';
END
$$;

-- A callback from outside, by callback id (its signature is checked by the caller, which holds the
-- key). p_action: complete, fail, retry, resume, or heartbeat (the timeout becomes now() +
-- p_extend). Returns 'applied' (the wait ended), 'recorded' (the handler has not returned yet: the
-- action is applied when it returns WaitForCallback), 'extended', 'already_resolved' (an earlier
-- callback was recorded), or 'unknown' (no such wait: never registered, already ended by a callback
-- or its timeout, or its attempt ended without waiting).
CREATE OR REPLACE FUNCTION __S__.resolve_callback(p_callback_id bytea, p_action text, p_payload jsonb,
                                                  p_error text, p_extend interval) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_job bigint;
    v_lease __S__.leases;
BEGIN
    IF p_action NOT IN ('complete', 'fail', 'retry', 'resume', 'heartbeat') THEN
        RAISE EXCEPTION 'unknown callback action %', p_action USING ERRCODE = '22023';
    END IF;
    -- a callback's error is kept like a handler's, cut to the schema's bound
    p_error := __S__.bounded_text(p_error, __S__.setting('max_error_chars'));
    PERFORM __S__.lease_ring_shared();
    SELECT l.job_id INTO v_job FROM __S__.leases l WHERE l.callback_id = p_callback_id;
    IF NOT FOUND THEN
        RETURN 'unknown';
    END IF;
    -- a workflow step's workflow lock before its attempt lock (workflows.sql)
    PERFORM __S__.lock_workflows_of(ARRAY[v_job]);
    PERFORM __S__.lock_attempt(v_job);
    -- again under the lock: the wait may have ended meanwhile
    SELECT * INTO v_lease FROM __S__.leases l WHERE l.callback_id = p_callback_id;
    IF NOT FOUND THEN
        RETURN 'unknown';
    END IF;
    IF v_lease.state IN ('registered', 'resolved') AND NOT EXISTS (
        SELECT 1 FROM __S__.open_attempts(ARRAY[v_lease.claim_slot], ARRAY[v_lease.receipt_id],
                                          ARRAY[v_lease.job_id], ARRAY[v_lease.run_lease],
                                          v_lease.claim_slot, v_lease.claim_slot)) THEN
        -- its attempt ended without waiting (rescued, cancelled, or the handler returned otherwise):
        -- an answer recorded for it is dropped with it
        DELETE FROM __S__.leases l WHERE l.lease_slot = v_lease.lease_slot AND l.callback_id = p_callback_id;
        RETURN 'unknown';
    END IF;
    IF p_action = 'heartbeat' THEN
        IF v_lease.state = 'resolved' THEN
            RETURN 'already_resolved';
        END IF;
        UPDATE __S__.leases l SET timeout_at = __S__.engine_now() + p_extend
        WHERE l.lease_slot = v_lease.lease_slot AND l.callback_id = p_callback_id;
        RETURN 'extended';
    END IF;
    IF v_lease.state = 'resolved' THEN
        RETURN 'already_resolved';
    ELSIF v_lease.state = 'registered' THEN
        UPDATE __S__.leases l SET state = 'resolved', action = p_action, payload = p_payload, error = p_error
        WHERE l.lease_slot = v_lease.lease_slot AND l.callback_id = p_callback_id;
        RETURN 'recorded';
    END IF;
    PERFORM __S__.end_wait(v_lease, p_action, p_payload, p_error);
    RETURN 'applied';
END
$$;

-- Timeout rescue (the maintenance pass): waits past their timeout end as a retry, or as a failure
-- (dead-lettered when the queue has a DLQ) when the attempts are used up. At most p_limit per call.
CREATE OR REPLACE FUNCTION __S__.rescue_callbacks(p_limit int) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    v_due record;
    v_lease __S__.leases;
    v_done int := 0;
    -- the engine's clock (clock.sql), as the timeout was set by
    v_now timestamptz := __S__.engine_now();
BEGIN
    PERFORM __S__.lease_ring_shared();
    -- the longest overdue first; their attempt locks in job order, as completion takes them
    FOR v_due IN
        SELECT d.* FROM (
            SELECT l.callback_id, l.job_id FROM __S__.leases l
            WHERE l.state = 'waiting' AND l.timeout_at < v_now
            ORDER BY l.timeout_at LIMIT p_limit
        ) d ORDER BY d.job_id
    LOOP
        PERFORM __S__.lock_attempt(v_due.job_id);
        SELECT * INTO v_lease FROM __S__.leases l
        WHERE l.callback_id = v_due.callback_id AND l.state = 'waiting' AND l.timeout_at < v_now;
        IF FOUND THEN
            PERFORM __S__.end_wait(v_lease, 'retry', NULL, 'callback timed out');
            v_done := v_done + 1;
        END IF;
    END LOOP;
    RETURN v_done;
END
$$;

-- Rotation (the maintenance pass): once the current slot is at least p_min_age old and was
-- written, or the ring holds a lease, the next slot becomes current: its leases that are still live (waiting, or
-- registered by an attempt that is still open) are moved into it anew and everything else in it
-- (ended leases' dead versions, leases of attempts that died before waiting) is truncated. A child
-- that was never written (size 0) is not truncated: an idle ring costs no catalog churn. 'rotated', 'young',
-- 'empty' or 'busy' (a lease operation or a reader holds the ring: next tick).
CREATE OR REPLACE FUNCTION __S__.rotate_lease_ring(p_min_age interval, p_lock_timeout text DEFAULT '25ms')
RETURNS text
LANGUAGE plpgsql SET plan_cache_mode = force_custom_plan AS $$
DECLARE
    v_cur int := pg_sequence_last_value('__S__.lease_ring_current')::int;
    v_next int;
    v_generation bigint;
    v_opened timestamptz;
    v_live __S__.leases[];
    -- a slot's age is on the engine's clock (clock.sql), like the callback timeouts it carries
    v_now timestamptz := __S__.engine_now();
BEGIN
    IF NOT pg_try_advisory_xact_lock(__S__.lock_ns('lease_ring'), 0) THEN
        RETURN 'busy';
    END IF;
    v_cur := pg_sequence_last_value('__S__.lease_ring_current')::int;
    SELECT max(g.opened_at) INTO v_opened FROM __S__.lease_ring_ledger g WHERE g.lease_slot = v_cur;
    IF v_opened > v_now - p_min_age THEN
        RETURN 'young';
    END IF;
    -- turn while the current slot was written (its dead versions must reach a truncate, even when
    -- every wait is short and the ring is empty at each tick) or the ring holds a lease (a long
    -- wait is carried forward); an idle ring, whose current slot was never written, stays put
    IF pg_relation_size(format('%I.%I', '__S__', 'leases_' || v_cur)) = 0
       AND NOT EXISTS (SELECT 1 FROM __S__.leases l) THEN
        RETURN 'empty';
    END IF;
    v_next := (v_cur + 1) % __S__.lease_slot_count();
    SELECT coalesce(max(g.generation), 0) + 1 INTO v_generation FROM __S__.lease_ring_ledger g;
    IF NOT __S__.lock_exclusive_within(format('%I.%I, %I.%I', '__S__', 'leases_' || v_next,
                                              '__S__', 'lease_ring_ledger_' || v_next), p_lock_timeout) THEN
        RETURN 'busy';
    END IF;
    SELECT array_agg(l ORDER BY l.job_id) INTO v_live
    FROM __S__.leases l
    WHERE l.lease_slot = v_next
      AND (l.state = 'waiting'
           OR EXISTS (SELECT 1 FROM __S__.open_attempts(ARRAY[l.claim_slot], ARRAY[l.receipt_id],
                                                       ARRAY[l.job_id], ARRAY[l.run_lease],
                                                       l.claim_slot, l.claim_slot)));
    IF pg_relation_size(format('%I.%I', '__S__', 'leases_' || v_next)) > 0 THEN
        EXECUTE format('TRUNCATE %I.%I', '__S__', 'leases_' || v_next);
        INSERT INTO __S__.leases SELECT (x).* FROM (SELECT unnest(v_live) AS x) u;
    END IF;
    EXECUTE format('TRUNCATE %I.%I', '__S__', 'lease_ring_ledger_' || v_next);
    INSERT INTO __S__.lease_ring_ledger (lease_slot, generation, opened_at) VALUES (v_next, v_generation, v_now);
    PERFORM setval('__S__.lease_ring_current', v_next, true);
    RETURN 'rotated';
END
$$;

-- How long until rotate_lease_ring could turn the ring (zero: now), by the conditions it checks;
-- NULL while the ring's current slot was never written and no lease is held (rotate.sql's
-- rotation_due).
CREATE OR REPLACE FUNCTION __S__.lease_rotation_due(p_min_age interval, p_now timestamptz) RETURNS interval
LANGUAGE plpgsql SET plan_cache_mode = force_custom_plan AS $$
DECLARE
    v_cur int := pg_sequence_last_value('__S__.lease_ring_current')::int;
    v_opened timestamptz;
BEGIN
    IF pg_relation_size(format('%I.%I', '__S__', 'leases_' || v_cur)) = 0
       AND NOT EXISTS (SELECT 1 FROM __S__.leases l) THEN
        RETURN NULL;
    END IF;
    SELECT max(g.opened_at) INTO v_opened FROM __S__.lease_ring_ledger g WHERE g.lease_slot = v_cur;
    -- no opening on record reads as old (rotate_lease_ring's comparison with NULL)
    RETURN coalesce(v_opened + p_min_age - p_now, interval '0');
END
$$;

-- Whether any attempt waits for a callback: rescue_callbacks has nothing to look at otherwise, and
-- maintenance asks this with each rescue (src/storage/rescue.rs) rather than running it.
CREATE OR REPLACE FUNCTION __S__.callbacks_waiting() RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM __S__.lease_ring_shared();
    RETURN EXISTS (SELECT 1 FROM __S__.leases l WHERE l.state = 'waiting');
END
$$;

-- How many jobs of the queue wait for a callback (queue_counts).
CREATE OR REPLACE FUNCTION __S__.waiting_count(p_queue text) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM __S__.lease_ring_shared();
    RETURN (SELECT count(*) FROM __S__.leases l WHERE l.queue = p_queue AND l.state = 'waiting');
END
$$;

-- The payload of the job's last resume, for the attempts that follow it (whatever their run_lease:
-- a hold under a key limit or a retry moves it on). Kept until the job ends (close_batch keeps a
-- row that holds one).
CREATE OR REPLACE FUNCTION __S__.callback_payload(p_job_id bigint, p_run_lease bigint) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT a.callback FROM __S__.attempt_state a
    WHERE a.job_id = p_job_id AND a.run_lease <= p_run_lease AND a.callback IS NOT NULL
    ORDER BY a.run_lease DESC LIMIT 1
$$;
