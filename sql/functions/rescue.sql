-- Rescue: stale and deadline rescue over per-slot cursors of the claim ring; the gating step for prune.
--
-- Every function of the engine is defined exactly once, in the file of its plane, and installed with
-- CREATE OR REPLACE by src/schema.rs whenever the combined hash of these files changes. A function
-- that is removed is dropped by name in dropped.sql. __S__ is the validated schema name.

-- ---------------------------------------------------------------------------------------------
-- Rescue. Both sweeps take the per-attempt lock with a *try* (never wait on a completion in
-- flight), re-check the claim is open in a new statement, and close through close_batch.
-- Retry delay after a rescue: 2^attempt seconds, capped at one hour; exhausted attempts fail.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION __S__.rescue_retry_at(p_attempt int, p_max_attempts int) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN p_attempt >= p_max_attempts THEN NULL
                ELSE __S__.engine_now() + make_interval(secs => least(power(2, least(p_attempt, 30)), 3600)) END
$$;

-- Try to close the given open attempts with p_outcome. Returns how many it closed, or -1 (closing
-- nothing) if any of their per-attempt locks is held by someone else — the caller's cursor must
-- then stop before them.
CREATE OR REPLACE FUNCTION __S__.rescue_close(p_slots int[], p_receipts bigint[], p_jobs bigint[], p_leases bigint[],
                                   p_attempts int[], p_max_attempts int[], p_outcome text, p_error text)
RETURNS int
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_job bigint;
    v_workflow bigint;
BEGIN
    IF coalesce(cardinality(p_jobs), 0) = 0 THEN
        RETURN 0;
    END IF;
    -- workflow steps: their workflows' locks before the attempt locks (workflows.sql), tried too
    FOR v_workflow IN SELECT DISTINCT s.workflow_id FROM __S__.workflow_steps s
                      WHERE s.job_id = ANY (p_jobs) ORDER BY 1 LOOP
        IF NOT pg_try_advisory_xact_lock(__S__.lock_ns('workflow'), (v_workflow % 2147483647)::int) THEN
            RETURN -1;
        END IF;
    END LOOP;
    FOREACH v_job IN ARRAY (SELECT array_agg(DISTINCT j ORDER BY j) FROM unnest(p_jobs) j) LOOP
        IF NOT pg_try_advisory_xact_lock(__S__.lock_ns('attempt'), (v_job % 2147483647)::int) THEN
            RETURN -1;
        END IF;
    END LOOP;
    -- close_batch re-takes the (re-entrant) locks and re-validates in a fresh snapshot: an attempt
    -- completed while we looked is reported not accepted, left alone and not counted
    RETURN (SELECT count(*) FILTER (WHERE c.accepted) FROM __S__.close_batch(
        p_slots, p_receipts, p_jobs, p_leases, array_fill(p_outcome, ARRAY[cardinality(p_jobs)]),
        ARRAY(SELECT __S__.rescue_retry_at(a, m) FROM unnest(p_attempts, p_max_attempts) AS u(a, m)),
        array_fill(p_error, ARRAY[cardinality(p_jobs)])) c);
END
$$;

-- Append a claim slot's rescue cursors when a sweep moved them (p_slot: after, p_from: before).
-- Never for a free slot: a late claim can land in a freed slot and is swept there, but a cursor
-- written now would outlive the slot's next opening and skip its claims.
CREATE OR REPLACE FUNCTION __S__.record_rescue_cursors(p_slot __S__.claim_ring_slots, p_from __S__.claim_ring_slots)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_slot.state IS DISTINCT FROM 'current' AND p_slot.state IS DISTINCT FROM 'sealed' OR (p_slot.stale_cursor_claimed_at, p_slot.stale_cursor_job_id, p_slot.stale_cursor_run_lease,
        p_slot.deadline_cursor_at, p_slot.deadline_cursor_job_id, p_slot.deadline_cursor_run_lease,
        p_slot.batch_deadline_cursor_at, p_slot.batch_deadline_cursor_batch_id, p_slot.stale_cursor_batch_id,
        p_slot.stale_revisit_at, p_slot.stale_revisit_batch_id, p_slot.stale_row_cursor_at, p_slot.stale_row_revisit_at)
       IS NOT DISTINCT FROM
       (p_from.stale_cursor_claimed_at, p_from.stale_cursor_job_id, p_from.stale_cursor_run_lease,
        p_from.deadline_cursor_at, p_from.deadline_cursor_job_id, p_from.deadline_cursor_run_lease,
        p_from.batch_deadline_cursor_at, p_from.batch_deadline_cursor_batch_id, p_from.stale_cursor_batch_id,
        p_from.stale_revisit_at, p_from.stale_revisit_batch_id, p_from.stale_row_cursor_at, p_from.stale_row_revisit_at) THEN
        RETURN;
    END IF;
    INSERT INTO __S__.claim_rescue_cursors (claim_slot, stale_cursor_claimed_at, stale_cursor_job_id,
        stale_cursor_run_lease, deadline_cursor_at, deadline_cursor_job_id, deadline_cursor_run_lease,
        batch_deadline_cursor_at, batch_deadline_cursor_batch_id, stale_cursor_batch_id, stale_revisit_at,
        stale_revisit_batch_id, stale_row_cursor_at, stale_row_revisit_at)
    VALUES (p_slot.slot, p_slot.stale_cursor_claimed_at, p_slot.stale_cursor_job_id, p_slot.stale_cursor_run_lease,
        p_slot.deadline_cursor_at, p_slot.deadline_cursor_job_id, p_slot.deadline_cursor_run_lease,
        p_slot.batch_deadline_cursor_at, p_slot.batch_deadline_cursor_batch_id, p_slot.stale_cursor_batch_id,
        p_slot.stale_revisit_at, p_slot.stale_revisit_batch_id, p_slot.stale_row_cursor_at, p_slot.stale_row_revisit_at);
END
$$;

-- Stale rescue over one claim slot. Visits only claims older than p_stale_after; steps over closed
-- claims, claims it closes, and claims whose heartbeat is fresh (remembering the oldest such as the
-- revisit point); stops before a stale open claim it could not lock. Returns attempts closed.
CREATE OR REPLACE FUNCTION __S__.rescue_stale_slot(p_slot int, p_stale_after interval, p_limit int) RETURNS int
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_slot __S__.claim_ring_slots;
    v_moved_from __S__.claim_ring_slots;
    v_cutoff timestamptz := __S__.engine_now() - p_stale_after;
    v_batch record;
    v_claim record;
    v_seen int := 0;
    v_closed int := 0;
    v_alive boolean;
    v_open record;
    v_open_receipts int8multirange;
    v_slots int[]; v_receipts bigint[]; v_jobs bigint[]; v_leases bigint[]; v_attempts int[]; v_max int[];
    v_blocked boolean := false;
    v_result int;
BEGIN
    SELECT * INTO v_slot FROM __S__.claim_ring_slots WHERE slot = p_slot;
    v_moved_from := v_slot;
    -- compact batches by (claimed_at, batch_id)
    FOR v_batch IN
        SELECT b.* FROM __S__.lease_claim_batches b
        WHERE b.claim_slot = p_slot AND b.claimed_at < v_cutoff
          AND (v_slot.stale_cursor_claimed_at IS NULL
               OR (b.claimed_at, b.batch_id) > (v_slot.stale_cursor_claimed_at, v_slot.stale_cursor_batch_id))
        ORDER BY b.claimed_at, b.batch_id
        LIMIT p_limit
    LOOP
        -- bound the locks one rescue transaction holds: p_limit attempts closed at most (a stop
        -- on the budget is not the end of the slot, so it must not wrap the cursor)
        IF v_closed >= p_limit THEN
            v_blocked := true;
            EXIT;
        END IF;
        v_seen := v_seen + 1;
        v_slots := '{}'; v_receipts := '{}'; v_jobs := '{}'; v_leases := '{}'; v_attempts := '{}'; v_max := '{}';
        v_alive := false;
        -- the batch's receipts no closure batch covers: one index search for the batch, where a
        -- probe per member cost about half a millisecond a batch. Old claims are almost all
        -- closed, and a pinned claim ring (a long job's open claim, a reader holding the ring)
        -- makes the sweep walk every batch claimed since the pin.
        v_open_receipts := v_batch.receipt_ranges
            - coalesce((SELECT range_agg(c.receipt_ranges) FROM __S__.lease_claim_closure_batches c
                        WHERE c.claim_slot = p_slot AND c.receipt_ranges && v_batch.receipt_ranges), '{}');
        FOR v_open IN
            SELECT v_batch.batch_id * 4096 + i - 1 AS receipt_id, v_batch.job_ids[i] AS job_id,
                   v_batch.run_leases[i] AS run_lease, v_batch.attempts[i] AS attempt,
                   v_batch.max_attempts[i] AS max_attempts,
                   EXISTS (SELECT 1 FROM __S__.attempt_state a
                           WHERE a.job_id = v_batch.job_ids[i] AND a.run_lease = v_batch.run_leases[i]
                             AND a.heartbeat_at >= v_cutoff) AS alive
            FROM generate_subscripts(v_batch.job_ids, 1) i
            WHERE NOT isempty(v_open_receipts)
              AND v_open_receipts @> (v_batch.batch_id * 4096 + i - 1)
        LOOP
            IF v_open.alive THEN
                v_alive := true;
                CONTINUE;
            END IF;
            v_slots := v_slots || p_slot; v_receipts := v_receipts || v_open.receipt_id;
            v_jobs := v_jobs || v_open.job_id; v_leases := v_leases || v_open.run_lease;
            v_attempts := v_attempts || v_open.attempt; v_max := v_max || v_open.max_attempts;
        END LOOP;
        v_result := __S__.rescue_close(v_slots, v_receipts, v_jobs, v_leases, v_attempts, v_max, 'rescued',
                                       'rescued: no heartbeat or completion within ' || p_stale_after);
        IF v_result < 0 THEN
            v_blocked := true;
            EXIT;
        END IF;
        v_closed := v_closed + v_result;
        IF v_alive AND v_slot.stale_revisit_at IS NULL THEN
            v_slot.stale_revisit_at := v_batch.claimed_at;
            v_slot.stale_revisit_batch_id := v_batch.batch_id - 1;
        END IF;
        v_slot.stale_cursor_claimed_at := v_batch.claimed_at;
        v_slot.stale_cursor_batch_id := v_batch.batch_id;
    END LOOP;
    -- reached the end of the old-enough claims: wrap back to the oldest heartbeat-alive claim
    IF NOT v_blocked AND v_seen < p_limit AND v_slot.stale_revisit_at IS NOT NULL THEN
        v_slot.stale_cursor_claimed_at := v_slot.stale_revisit_at;
        v_slot.stale_cursor_batch_id := v_slot.stale_revisit_batch_id;
        v_slot.stale_revisit_at := NULL;
        v_slot.stale_revisit_batch_id := NULL;
    END IF;

    -- row-local claims by (claimed_at, job_id, run_lease)
    v_blocked := false;
    v_seen := 0;
    FOR v_claim IN
        SELECT l.* FROM __S__.lease_claims l
        WHERE l.claim_slot = p_slot AND l.claimed_at < v_cutoff
          AND (v_slot.stale_row_cursor_at IS NULL
               OR (l.claimed_at, l.job_id, l.run_lease)
                  > (v_slot.stale_row_cursor_at, v_slot.stale_cursor_job_id, v_slot.stale_cursor_run_lease))
        ORDER BY l.claimed_at, l.job_id, l.run_lease
        LIMIT p_limit
    LOOP
        IF v_closed >= p_limit THEN
            v_blocked := true;
            EXIT;
        END IF;
        v_seen := v_seen + 1;
        IF NOT EXISTS (SELECT 1 FROM __S__.lease_claim_closures c
                       WHERE c.claim_slot = p_slot AND c.receipt_id = v_claim.receipt_id) THEN
            IF EXISTS (SELECT 1 FROM __S__.attempt_state a
                       WHERE a.job_id = v_claim.job_id AND a.run_lease = v_claim.run_lease
                         AND a.heartbeat_at >= v_cutoff) THEN
                v_slot.stale_row_revisit_at := coalesce(v_slot.stale_row_revisit_at, v_claim.claimed_at);
            ELSE
                v_result := __S__.rescue_close(ARRAY[p_slot], ARRAY[v_claim.receipt_id], ARRAY[v_claim.job_id],
                                               ARRAY[v_claim.run_lease], ARRAY[v_claim.attempt],
                                               ARRAY[v_claim.max_attempts], 'rescued',
                                               'rescued: no heartbeat or completion within ' || p_stale_after);
                IF v_result < 0 THEN
                    v_blocked := true;
                    EXIT;
                END IF;
                v_closed := v_closed + v_result;
            END IF;
        END IF;
        v_slot.stale_row_cursor_at := v_claim.claimed_at;
        v_slot.stale_cursor_job_id := v_claim.job_id;
        v_slot.stale_cursor_run_lease := v_claim.run_lease;
    END LOOP;
    IF NOT v_blocked AND v_seen < p_limit AND v_slot.stale_row_revisit_at IS NOT NULL THEN
        -- restart just before the revisit point (job ids are > 0)
        v_slot.stale_row_cursor_at := v_slot.stale_row_revisit_at;
        v_slot.stale_cursor_job_id := 0;
        v_slot.stale_cursor_run_lease := 0;
        v_slot.stale_row_revisit_at := NULL;
    END IF;

    -- persist the cursors only when they moved, as a new row (migration 0005: nothing is rewritten)
    PERFORM __S__.record_rescue_cursors(v_slot, v_moved_from);
    RETURN v_closed;
END
$$;

-- Deadline rescue over one claim slot: compact batches by (deadline_at, batch_id) — the cursor
-- passes a batch only when every member is closed — and row-local claims by
-- (deadline_at, job_id, run_lease). Open members past their deadline close as deadline_expired,
-- heartbeat or not. Returns attempts closed.
CREATE OR REPLACE FUNCTION __S__.rescue_deadline_slot(p_slot int, p_limit int) RETURNS int
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_slot __S__.claim_ring_slots;
    v_moved_from __S__.claim_ring_slots;
    v_batch record;
    v_claim record;
    v_closed int := 0;
    v_slots int[]; v_receipts bigint[]; v_jobs bigint[]; v_leases bigint[]; v_attempts int[]; v_max int[];
    v_result int;
    v_now timestamptz := __S__.engine_now();
BEGIN
    SELECT * INTO v_slot FROM __S__.claim_ring_slots WHERE slot = p_slot;
    v_moved_from := v_slot;
    FOR v_batch IN
        SELECT b.* FROM __S__.lease_claim_batches b
        WHERE b.claim_slot = p_slot AND b.deadline_at IS NOT NULL AND b.deadline_at < v_now
          AND (v_slot.batch_deadline_cursor_at IS NULL
               OR (b.deadline_at, b.batch_id) > (v_slot.batch_deadline_cursor_at, v_slot.batch_deadline_cursor_batch_id))
        ORDER BY b.deadline_at, b.batch_id
        LIMIT p_limit
    LOOP
        SELECT array_agg(p_slot), array_agg(r), array_agg(v_batch.job_ids[i]), array_agg(v_batch.run_leases[i]),
               array_agg(v_batch.attempts[i]), array_agg(v_batch.max_attempts[i])
        INTO v_slots, v_receipts, v_jobs, v_leases, v_attempts, v_max
        FROM generate_subscripts(v_batch.job_ids, 1) i,
             LATERAL (SELECT v_batch.batch_id * 4096 + i - 1 AS r) x
        WHERE v_batch.receipt_ranges @> x.r
          AND NOT EXISTS (SELECT 1 FROM __S__.lease_claim_closure_batches c
                          WHERE c.claim_slot = p_slot AND c.receipt_ranges @> x.r);
        EXIT WHEN v_closed >= p_limit;
        IF v_jobs IS NOT NULL THEN
            v_result := __S__.rescue_close(v_slots, v_receipts, v_jobs, v_leases, v_attempts, v_max,
                                           'deadline_expired', 'deadline expired');
            EXIT WHEN v_result < 0;
            v_closed := v_closed + v_result;
        END IF;
        v_slot.batch_deadline_cursor_at := v_batch.deadline_at;
        v_slot.batch_deadline_cursor_batch_id := v_batch.batch_id;
    END LOOP;
    FOR v_claim IN
        SELECT l.* FROM __S__.lease_claims l
        WHERE l.claim_slot = p_slot AND l.deadline_at IS NOT NULL AND l.deadline_at < v_now
          AND (v_slot.deadline_cursor_at IS NULL
               OR (l.deadline_at, l.job_id, l.run_lease)
                  > (v_slot.deadline_cursor_at, v_slot.deadline_cursor_job_id, v_slot.deadline_cursor_run_lease))
        ORDER BY l.deadline_at, l.job_id, l.run_lease
        LIMIT p_limit
    LOOP
        IF NOT EXISTS (SELECT 1 FROM __S__.lease_claim_closures c
                       WHERE c.claim_slot = p_slot AND c.receipt_id = v_claim.receipt_id) THEN
            EXIT WHEN v_closed >= p_limit;
            v_result := __S__.rescue_close(ARRAY[p_slot], ARRAY[v_claim.receipt_id], ARRAY[v_claim.job_id],
                                           ARRAY[v_claim.run_lease], ARRAY[v_claim.attempt],
                                           ARRAY[v_claim.max_attempts], 'deadline_expired', 'deadline expired');
            EXIT WHEN v_result < 0;
            v_closed := v_closed + v_result;
        END IF;
        v_slot.deadline_cursor_at := v_claim.deadline_at;
        v_slot.deadline_cursor_job_id := v_claim.job_id;
        v_slot.deadline_cursor_run_lease := v_claim.run_lease;
    END LOOP;
    PERFORM __S__.record_rescue_cursors(v_slot, v_moved_from);
    RETURN v_closed;
END
$$;

-- One maintenance tick of rescue: deadline then stale, over every slot that can hold claims,
-- closing at most p_limit attempts (so one transaction holds at most that many attempt locks).
CREATE OR REPLACE FUNCTION __S__.rescue(p_stale_after interval, p_limit int) RETURNS int
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_slot int;
    v_closed int := 0;
BEGIN
    -- Every slot, free ones included: a claim that read the current slot just before a rotation and
    -- a prune of that slot can commit into it after it was freed (the model check, tests/model.rs).
    -- A free slot is almost always empty, so sweeping it costs an index probe.
    FOR v_slot IN SELECT slot FROM __S__.claim_ring_slots ORDER BY generation, slot LOOP
        EXIT WHEN v_closed >= p_limit;
        v_closed := v_closed + __S__.rescue_deadline_slot(v_slot, p_limit - v_closed);
        EXIT WHEN v_closed >= p_limit;
        v_closed := v_closed + __S__.rescue_stale_slot(v_slot, p_stale_after, p_limit - v_closed);
    END LOOP;
    RETURN v_closed;
END
$$;
