-- ringwork schema version 3: the receipt plane of the seed (ADR-023) completed — row-local claims
-- for jobs with their own timeout, closure by claim shape, heartbeats, stale and deadline rescue with
-- per-slot cursors.

-- A per-job timeout. A job whose timeout differs from its claim batch's deadline gets a row-local
-- lease_claims row with its own deadline_at; every other job is a compact batch member.
ALTER TABLE __S__.ready_entries ADD COLUMN timeout_ms int;
ALTER TABLE __S__.deferred_jobs ADD COLUMN timeout_ms int;

-- Stale cursors: compact batches by (claimed_at, batch_id), row-local claims by
-- (claimed_at, job_id, run_lease). The revisit point is the oldest claim a pass stepped over because
-- its heartbeat was fresh; the pass wraps back to it when it reaches the end of the slot.
ALTER TABLE __S__.claim_ring_slots
    ADD COLUMN stale_cursor_batch_id bigint,
    ADD COLUMN stale_revisit_at timestamptz,
    ADD COLUMN stale_revisit_batch_id bigint,
    ADD COLUMN stale_row_cursor_at timestamptz,
    ADD COLUMN stale_row_revisit_at timestamptz;

-- ---------------------------------------------------------------------------------------------
-- Open-claim evidence by shape. Compact: a batch item with no covering closure batch. Row-local:
-- a lease_claims row with no lease_claim_closures row. Both lookups name the claim slot.
-- ---------------------------------------------------------------------------------------------
CREATE FUNCTION __S__.open_claim(p_claim_slot int, p_receipt_id bigint, p_job_id bigint, p_run_lease bigint)
RETURNS TABLE (shape text, ready_slot int, attempt int, max_attempts int, queue text)
LANGUAGE sql STABLE AS $$
    SELECT 'compact', b.ready_slots[o.i], b.attempts[o.i], b.max_attempts[o.i], b.queue
    FROM __S__.lease_claim_batches b,
         LATERAL (SELECT (p_receipt_id - b.batch_id * 4096 + 1)::int AS i) o
    WHERE b.claim_slot = p_claim_slot AND b.batch_id = p_receipt_id / 4096
      AND b.job_ids[o.i] = p_job_id AND b.run_leases[o.i] = p_run_lease
      AND b.receipt_ranges @> p_receipt_id
      AND NOT EXISTS (SELECT 1 FROM __S__.lease_claim_closure_batches c
                      WHERE c.claim_slot = p_claim_slot AND c.receipt_ranges @> p_receipt_id)
    UNION ALL
    SELECT 'row', l.ready_slot, l.attempt, l.max_attempts, l.queue
    FROM __S__.lease_claims l
    WHERE l.claim_slot = p_claim_slot AND l.receipt_id = p_receipt_id
      AND l.job_id = p_job_id AND l.run_lease = p_run_lease
      AND NOT EXISTS (SELECT 1 FROM __S__.lease_claim_closures c
                      WHERE c.claim_slot = p_claim_slot AND c.receipt_id = p_receipt_id)
$$;

-- In-flight attempts (compact members + row-local claims minus closures) over the claim ring.
-- All queues: claim and closure counts (closures are unique per receipt, so counts subtract
-- exactly). One queue: a closure batch can span queues, so count that queue's open items.
CREATE FUNCTION __S__.count_in_flight(p_queue text DEFAULT NULL) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN p_queue IS NULL THEN
        coalesce((SELECT sum(b.claimed_count) FROM __S__.lease_claim_batches b), 0)
        + (SELECT count(*) FROM __S__.lease_claims l)
        - coalesce((SELECT sum(c.closed_count) FROM __S__.lease_claim_closure_batches c), 0)
        - (SELECT count(*) FROM __S__.lease_claim_closures c)
    ELSE
        (SELECT count(*) FROM __S__.lease_claim_batches b, generate_subscripts(b.job_ids, 1) i
         WHERE b.queue = p_queue AND b.receipt_ranges @> (b.batch_id * 4096 + i - 1)
           AND NOT EXISTS (SELECT 1 FROM __S__.lease_claim_closure_batches c
                           WHERE c.claim_slot = b.claim_slot AND c.receipt_ranges @> (b.batch_id * 4096 + i - 1)))
        + (SELECT count(*) FROM __S__.lease_claims l
           WHERE l.queue = p_queue
             AND NOT EXISTS (SELECT 1 FROM __S__.lease_claim_closures c
                             WHERE c.claim_slot = l.claim_slot AND c.receipt_id = l.receipt_id))
    END
$$;

-- ---------------------------------------------------------------------------------------------
-- Enqueue with per-job timeouts (replaces the version-2 signatures).
-- ---------------------------------------------------------------------------------------------
DROP FUNCTION __S__.enqueue_jobs(text, smallint, text[], jsonb[], int[]);
CREATE FUNCTION __S__.enqueue_jobs(p_queue text, p_priority smallint, p_kinds text[], p_args jsonb[],
                                   p_max_attempts int[], p_timeouts_ms int[])
RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_seg record;
    v_n int := cardinality(p_kinds);
BEGIN
    SELECT * INTO v_seg FROM __S__.enqueue_segment(p_queue, p_priority, v_n);
    RETURN QUERY
    INSERT INTO __S__.ready_entries (ready_slot, lane_id, lane_pos, job_id, queue, kind, args, priority,
                                     attempt, run_lease, max_attempts, timeout_ms)
    SELECT v_seg.ready_slot, v_seg.lane_id, v_seg.base_pos + i - 1, nextval('__S__.job_ids'), p_queue,
           p_kinds[i], p_args[i], p_priority, 0, 0, p_max_attempts[i], p_timeouts_ms[i]
    FROM generate_series(1, v_n) i
    RETURNING job_id;
END
$$;

DROP FUNCTION __S__.schedule_jobs(text, smallint, text[], jsonb[], int[], timestamptz[]);
CREATE FUNCTION __S__.schedule_jobs(p_queue text, p_priority smallint, p_kinds text[], p_args jsonb[],
                                    p_max_attempts int[], p_run_at timestamptz[], p_timeouts_ms int[])
RETURNS SETOF bigint
LANGUAGE sql AS $$
    SELECT __S__.ensure_lane(p_queue, p_priority);
    INSERT INTO __S__.deferred_jobs (job_id, queue, kind, args, priority, attempt, run_lease, max_attempts,
                                     run_at, created_at, timeout_ms)
    SELECT nextval('__S__.job_ids'), p_queue, k, a, p_priority, 0, 0, m, r, now(), t
    FROM unnest(p_kinds, p_args, p_max_attempts, p_run_at, p_timeouts_ms) AS u(k, a, m, r, t)
    RETURNING job_id;
$$;

-- Promotion without a temp table (creating one per call churns the system catalogs): lock the due
-- rows of one lane, reserve a segment of that size, then move exactly those rows.
CREATE OR REPLACE FUNCTION __S__.promote_due(p_limit int) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    v_group record;
    v_seg record;
    v_ids bigint[];
    v_total int := 0;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM __S__.deferred_jobs WHERE run_at <= now()) THEN
        RETURN 0;
    END IF;
    FOR v_group IN SELECT DISTINCT d.queue, d.priority FROM __S__.deferred_jobs d WHERE d.run_at <= now() LOOP
        EXIT WHEN v_total >= p_limit;
        SELECT array_agg(x.job_id ORDER BY x.run_at, x.job_id) INTO v_ids
        FROM (SELECT d.job_id, d.run_at FROM __S__.deferred_jobs d
              WHERE d.queue = v_group.queue AND d.priority = v_group.priority AND d.run_at <= now()
              ORDER BY d.run_at, d.job_id LIMIT p_limit - v_total FOR UPDATE SKIP LOCKED) x;
        CONTINUE WHEN v_ids IS NULL;
        SELECT * INTO v_seg FROM __S__.enqueue_segment(v_group.queue, v_group.priority, cardinality(v_ids));
        WITH due AS (
            DELETE FROM __S__.deferred_jobs d WHERE d.job_id = ANY (v_ids) RETURNING d.*
        )
        INSERT INTO __S__.ready_entries (ready_slot, lane_id, lane_pos, job_id, queue, kind, args, priority,
                                         attempt, run_lease, max_attempts, run_at, created_at, timeout_ms)
        SELECT v_seg.ready_slot, v_seg.lane_id, v_seg.base_pos + array_position(v_ids, p.job_id) - 1,
               p.job_id, p.queue, p.kind, p.args, p.priority, p.attempt, p.run_lease, p.max_attempts,
               p.run_at, p.created_at, p.timeout_ms
        FROM due p;
        v_total := v_total + cardinality(v_ids);
    END LOOP;
    RETURN v_total;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- Claim, both shapes. Jobs sharing the batch deadline are compact members; a job whose own timeout
-- gives a different deadline becomes a row-local lease_claims row. Returns deadline_at per job.
-- ---------------------------------------------------------------------------------------------
DROP FUNCTION __S__.claim(text, int, interval);
CREATE FUNCTION __S__.claim(p_queue text, p_max int, p_deadline interval DEFAULT NULL)
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
BEGIN
    IF p_max < 1 OR p_max > 4096 THEN
        RAISE EXCEPTION 'ringwork: claim size must be 1..4096, got %', p_max USING ERRCODE = '22023';
    END IF;
    SELECT s.slot INTO v_claim_slot FROM __S__.claim_ring_slots s WHERE s.state = 'current';
    v_batch := nextval('__S__.claim_batch_ids');

    FOR v_lane IN
        SELECT l.lane_id, l.segment_seq, l.cursor_seq FROM __S__.queue_lanes l
        WHERE l.queue = p_queue
          AND pg_sequence_last_value(l.segment_seq) IS NOT NULL
          AND pg_sequence_last_value(l.segment_seq)
              >= coalesce(pg_sequence_last_value(l.cursor_seq), 0) >> 20
        ORDER BY l.priority
    LOOP
        EXIT WHEN v_n >= p_max;
        PERFORM 1 FROM __S__.queue_lanes l WHERE l.lane_id = v_lane.lane_id FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;

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
-- Closing attempts, by shape. Callers hold the per-attempt locks. Success writes one closure batch
-- per claim slot (compact) or one closure row per claim (row-local), plus one completion batch per
-- ready slot; non-success closes route the job (retry -> deferred_jobs, failed/cancelled ->
-- done_entries). Closure batches are written ordered by claim_slot, then (job_id, run_lease).
-- ---------------------------------------------------------------------------------------------
DROP FUNCTION __S__.complete_batch(int[], bigint[], bigint[], bigint[]);
CREATE FUNCTION __S__.complete_batch(p_claim_slots int[], p_receipt_ids bigint[], p_job_ids bigint[],
                                     p_run_leases bigint[])
RETURNS TABLE (job_id bigint, run_lease bigint, accepted boolean)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM __S__.lock_attempt(j) FROM (SELECT DISTINCT unnest(p_job_ids) AS j ORDER BY 1) t;
    RETURN QUERY
    WITH input AS (
        SELECT * FROM unnest(p_claim_slots, p_receipt_ids, p_job_ids, p_run_leases)
               AS i(claim_slot, receipt_id, job_id, run_lease)
    ), open AS MATERIALIZED (
        -- DISTINCT: an attempt listed twice must be closed (and counted) once
        SELECT DISTINCT ON (i.claim_slot, i.receipt_id) i.*, o.shape, o.ready_slot
        FROM input i, LATERAL __S__.open_claim(i.claim_slot, i.receipt_id, i.job_id, i.run_lease) o
    ), closure AS (
        INSERT INTO __S__.lease_claim_closure_batches (claim_slot, batch_id, receipt_ranges, closed_count, outcome)
        SELECT o.claim_slot, nextval('__S__.evidence_batch_ids'), range_agg(int8range(o.receipt_id, o.receipt_id + 1)),
               count(*), 'completed'
        FROM open o WHERE o.shape = 'compact' GROUP BY o.claim_slot ORDER BY o.claim_slot
        RETURNING 1
    ), row_closure AS (
        INSERT INTO __S__.lease_claim_closures (claim_slot, receipt_id, job_id, run_lease, outcome)
        SELECT o.claim_slot, o.receipt_id, o.job_id, o.run_lease, 'completed'
        FROM open o WHERE o.shape = 'row' ORDER BY o.claim_slot, o.job_id, o.run_lease
        RETURNING 1
    ), history AS (
        INSERT INTO __S__.receipt_completion_batches (ready_slot, batch_id, job_ids, run_leases, completed_count)
        SELECT o.ready_slot, nextval('__S__.evidence_batch_ids'), array_agg(o.job_id), array_agg(o.run_lease), count(*)
        FROM open o GROUP BY o.ready_slot
        RETURNING 1
    ), heartbeat AS (
        DELETE FROM __S__.attempt_state a USING open o
        WHERE a.job_id = o.job_id AND a.run_lease = o.run_lease
        RETURNING 1
    )
    SELECT i.job_id, i.run_lease,
           EXISTS (SELECT 1 FROM open o WHERE o.receipt_id = i.receipt_id AND o.claim_slot = i.claim_slot
                          AND o.job_id = i.job_id AND o.run_lease = i.run_lease)
    FROM input i;
END
$$;

-- Outcomes: 'retry' (to deferred_jobs at p_retry_at), 'failed', 'cancelled' (done_entries), and the
-- rescue outcomes 'rescued' / 'deadline_expired', which retry at p_retry_at or fail when p_retry_at
-- is NULL (attempts exhausted). The closure row records the outcome as given.
DROP FUNCTION __S__.close_batch(int[], bigint[], bigint[], bigint[], text[], timestamptz[], text[]);
CREATE FUNCTION __S__.close_batch(p_claim_slots int[], p_receipt_ids bigint[], p_job_ids bigint[],
                                  p_run_leases bigint[], p_outcomes text[], p_retry_at timestamptz[],
                                  p_errors text[])
RETURNS TABLE (job_id bigint, run_lease bigint, accepted boolean)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM __S__.lock_attempt(j) FROM (SELECT DISTINCT unnest(p_job_ids) AS j ORDER BY 1) t;
    RETURN QUERY
    WITH input AS (
        SELECT * FROM unnest(p_claim_slots, p_receipt_ids, p_job_ids, p_run_leases, p_outcomes, p_retry_at, p_errors)
               AS i(claim_slot, receipt_id, job_id, run_lease, outcome, retry_at, error)
    ), open AS MATERIALIZED (
        -- DISTINCT: an attempt listed twice must be closed (and counted) once
        SELECT DISTINCT ON (i.claim_slot, i.receipt_id) i.*, o.shape, o.ready_slot, o.attempt, e.queue, e.kind, e.args, e.priority, e.max_attempts,
               e.created_at, e.timeout_ms,
               CASE WHEN i.outcome IN ('failed', 'cancelled') THEN i.outcome
                    WHEN i.retry_at IS NULL THEN 'failed'
                    ELSE 'retry' END AS route
        FROM input i
        CROSS JOIN LATERAL __S__.open_claim(i.claim_slot, i.receipt_id, i.job_id, i.run_lease) o
        JOIN __S__.ready_entries e
          ON e.ready_slot = o.ready_slot AND e.job_id = i.job_id AND e.run_lease = i.run_lease - 1
    ), closure AS (
        INSERT INTO __S__.lease_claim_closure_batches (claim_slot, batch_id, receipt_ranges, closed_count, outcome)
        SELECT g.claim_slot, nextval('__S__.evidence_batch_ids'), g.ranges, g.n, g.outcome
        FROM (SELECT o.claim_slot, o.outcome, range_agg(int8range(o.receipt_id, o.receipt_id + 1)) AS ranges,
                     count(*) AS n, min(o.job_id) AS first_job
              FROM open o WHERE o.shape = 'compact' GROUP BY o.claim_slot, o.outcome) g
        ORDER BY g.claim_slot, g.first_job
        RETURNING 1
    ), row_closure AS (
        INSERT INTO __S__.lease_claim_closures (claim_slot, receipt_id, job_id, run_lease, outcome)
        SELECT o.claim_slot, o.receipt_id, o.job_id, o.run_lease, o.outcome
        FROM open o WHERE o.shape = 'row' ORDER BY o.claim_slot, o.job_id, o.run_lease
        RETURNING 1
    ), retried AS (
        INSERT INTO __S__.deferred_jobs (job_id, queue, kind, args, priority, attempt, run_lease, max_attempts,
                                         run_at, created_at, last_error, timeout_ms)
        SELECT o.job_id, o.queue, o.kind, o.args, o.priority, o.attempt, o.run_lease, o.max_attempts,
               o.retry_at, o.created_at, o.error, o.timeout_ms
        FROM open o WHERE o.route = 'retry'
        RETURNING 1
    ), finished AS (
        INSERT INTO __S__.done_entries (ready_slot, job_id, run_lease, queue, kind, args, priority, attempt,
                                        max_attempts, state, error, created_at)
        SELECT o.ready_slot, o.job_id, o.run_lease, o.queue, o.kind, o.args, o.priority, o.attempt,
               o.max_attempts, o.route, o.error, o.created_at
        FROM open o WHERE o.route IN ('failed', 'cancelled')
        RETURNING 1
    ), heartbeat AS (
        DELETE FROM __S__.attempt_state a USING open o
        WHERE a.job_id = o.job_id AND a.run_lease = o.run_lease
        RETURNING 1
    )
    SELECT i.job_id, i.run_lease,
           EXISTS (SELECT 1 FROM open o WHERE o.receipt_id = i.receipt_id AND o.claim_slot = i.claim_slot
                          AND o.job_id = i.job_id AND o.run_lease = i.run_lease)
    FROM input i;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- Heartbeats (long jobs only): upsert attempt_state while the attempt is open, under the same
-- per-attempt lock as completion and rescue, so a heartbeat never recreates a closed attempt's row.
-- ---------------------------------------------------------------------------------------------
CREATE FUNCTION __S__.heartbeat_batch(p_claim_slots int[], p_receipt_ids bigint[], p_job_ids bigint[],
                                      p_run_leases bigint[], p_progress jsonb[])
RETURNS TABLE (job_id bigint, run_lease bigint, accepted boolean)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM __S__.lock_attempt(j) FROM (SELECT DISTINCT unnest(p_job_ids) AS j ORDER BY 1) t;
    RETURN QUERY
    WITH input AS (
        SELECT * FROM unnest(p_claim_slots, p_receipt_ids, p_job_ids, p_run_leases, p_progress)
               AS i(claim_slot, receipt_id, job_id, run_lease, progress)
    ), open AS MATERIALIZED (
        SELECT DISTINCT ON (i.job_id, i.run_lease) i.* FROM input i
        WHERE EXISTS (SELECT 1 FROM __S__.open_claim(i.claim_slot, i.receipt_id, i.job_id, i.run_lease))
    ), upsert AS (
        INSERT INTO __S__.attempt_state AS a (job_id, run_lease, heartbeat_at, progress)
        SELECT o.job_id, o.run_lease, now(), o.progress FROM open o
        ON CONFLICT ON CONSTRAINT attempt_state_pkey DO UPDATE
            SET heartbeat_at = excluded.heartbeat_at, progress = coalesce(excluded.progress, a.progress)
        RETURNING 1
    )
    SELECT i.job_id, i.run_lease,
           EXISTS (SELECT 1 FROM open o WHERE o.job_id = i.job_id AND o.run_lease = i.run_lease
                                            AND o.claim_slot = i.claim_slot AND o.receipt_id = i.receipt_id)
    FROM input i;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- Rescue. Both sweeps take the per-attempt lock with a *try* (never wait on a completion in
-- flight), re-check the claim is open in a new statement, and close through close_batch.
-- Retry delay after a rescue: 2^attempt seconds, capped at one hour; exhausted attempts fail.
-- ---------------------------------------------------------------------------------------------
CREATE FUNCTION __S__.rescue_retry_at(p_attempt int, p_max_attempts int) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN p_attempt >= p_max_attempts THEN NULL
                ELSE now() + make_interval(secs => least(power(2, least(p_attempt, 30)), 3600)) END
$$;

-- Try to close the given open attempts with p_outcome. Returns how many it closed, or -1 (closing
-- nothing) if any of their per-attempt locks is held by someone else — the caller's cursor must
-- then stop before them.
CREATE FUNCTION __S__.rescue_close(p_slots int[], p_receipts bigint[], p_jobs bigint[], p_leases bigint[],
                                   p_attempts int[], p_max_attempts int[], p_outcome text, p_error text)
RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    v_job bigint;
BEGIN
    IF coalesce(cardinality(p_jobs), 0) = 0 THEN
        RETURN 0;
    END IF;
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

-- Stale rescue over one claim slot. Visits only claims older than p_stale_after; steps over closed
-- claims, claims it closes, and claims whose heartbeat is fresh (remembering the oldest such as the
-- revisit point); stops before a stale open claim it could not lock. Returns attempts closed.
CREATE FUNCTION __S__.rescue_stale_slot(p_slot int, p_stale_after interval, p_limit int) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    v_slot __S__.claim_ring_slots;
    v_cutoff timestamptz := now() - p_stale_after;
    v_batch record;
    v_claim record;
    v_seen int := 0;
    v_closed int := 0;
    v_alive boolean;
    v_open record;
    v_slots int[]; v_receipts bigint[]; v_jobs bigint[]; v_leases bigint[]; v_attempts int[]; v_max int[];
    v_blocked boolean := false;
    v_result int;
BEGIN
    SELECT * INTO v_slot FROM __S__.claim_ring_slots WHERE slot = p_slot;
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
        FOR v_open IN
            SELECT v_batch.batch_id * 4096 + i - 1 AS receipt_id, v_batch.job_ids[i] AS job_id,
                   v_batch.run_leases[i] AS run_lease, v_batch.attempts[i] AS attempt,
                   v_batch.max_attempts[i] AS max_attempts,
                   EXISTS (SELECT 1 FROM __S__.attempt_state a
                           WHERE a.job_id = v_batch.job_ids[i] AND a.run_lease = v_batch.run_leases[i]
                             AND a.heartbeat_at >= v_cutoff) AS alive
            FROM generate_subscripts(v_batch.job_ids, 1) i
            WHERE v_batch.receipt_ranges @> (v_batch.batch_id * 4096 + i - 1)
              AND NOT EXISTS (SELECT 1 FROM __S__.lease_claim_closure_batches c
                              WHERE c.claim_slot = p_slot AND c.receipt_ranges @> (v_batch.batch_id * 4096 + i - 1))
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

    -- persist the cursors only when they moved (this is a control row, not a hot one)
    UPDATE __S__.claim_ring_slots s
    SET stale_cursor_claimed_at = v_slot.stale_cursor_claimed_at,
        stale_cursor_batch_id = v_slot.stale_cursor_batch_id,
        stale_revisit_at = v_slot.stale_revisit_at,
        stale_revisit_batch_id = v_slot.stale_revisit_batch_id,
        stale_row_cursor_at = v_slot.stale_row_cursor_at,
        stale_cursor_job_id = v_slot.stale_cursor_job_id,
        stale_cursor_run_lease = v_slot.stale_cursor_run_lease,
        stale_row_revisit_at = v_slot.stale_row_revisit_at
    WHERE s.slot = p_slot AND s.state <> 'free'
      AND (s.stale_cursor_claimed_at, s.stale_cursor_batch_id, s.stale_revisit_at, s.stale_revisit_batch_id,
           s.stale_row_cursor_at, s.stale_cursor_job_id, s.stale_cursor_run_lease, s.stale_row_revisit_at)
          IS DISTINCT FROM
          (v_slot.stale_cursor_claimed_at, v_slot.stale_cursor_batch_id, v_slot.stale_revisit_at,
           v_slot.stale_revisit_batch_id, v_slot.stale_row_cursor_at, v_slot.stale_cursor_job_id,
           v_slot.stale_cursor_run_lease, v_slot.stale_row_revisit_at);
    RETURN v_closed;
END
$$;

-- Deadline rescue over one claim slot: compact batches by (deadline_at, batch_id) — the cursor
-- passes a batch only when every member is closed — and row-local claims by
-- (deadline_at, job_id, run_lease). Open members past their deadline close as deadline_expired,
-- heartbeat or not. Returns attempts closed.
CREATE FUNCTION __S__.rescue_deadline_slot(p_slot int, p_limit int) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    v_slot __S__.claim_ring_slots;
    v_batch record;
    v_claim record;
    v_closed int := 0;
    v_slots int[]; v_receipts bigint[]; v_jobs bigint[]; v_leases bigint[]; v_attempts int[]; v_max int[];
    v_result int;
BEGIN
    SELECT * INTO v_slot FROM __S__.claim_ring_slots WHERE slot = p_slot;
    FOR v_batch IN
        SELECT b.* FROM __S__.lease_claim_batches b
        WHERE b.claim_slot = p_slot AND b.deadline_at IS NOT NULL AND b.deadline_at < now()
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
        WHERE l.claim_slot = p_slot AND l.deadline_at IS NOT NULL AND l.deadline_at < now()
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
    UPDATE __S__.claim_ring_slots s
    SET batch_deadline_cursor_at = v_slot.batch_deadline_cursor_at,
        batch_deadline_cursor_batch_id = v_slot.batch_deadline_cursor_batch_id,
        deadline_cursor_at = v_slot.deadline_cursor_at,
        deadline_cursor_job_id = v_slot.deadline_cursor_job_id,
        deadline_cursor_run_lease = v_slot.deadline_cursor_run_lease
    WHERE s.slot = p_slot AND s.state <> 'free'
      AND (s.batch_deadline_cursor_at, s.batch_deadline_cursor_batch_id, s.deadline_cursor_at,
           s.deadline_cursor_job_id, s.deadline_cursor_run_lease)
          IS DISTINCT FROM
          (v_slot.batch_deadline_cursor_at, v_slot.batch_deadline_cursor_batch_id, v_slot.deadline_cursor_at,
           v_slot.deadline_cursor_job_id, v_slot.deadline_cursor_run_lease);
    RETURN v_closed;
END
$$;

-- One maintenance tick of rescue: deadline then stale, over every slot that can hold claims,
-- closing at most p_limit attempts (so one transaction holds at most that many attempt locks).
CREATE FUNCTION __S__.rescue(p_stale_after interval, p_limit int) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    v_slot int;
    v_closed int := 0;
BEGIN
    -- Every slot, free ones included: a claim that read the current slot just before a rotation and
    -- a prune of that slot can commit into it after it was freed (found by the model, issue 4).
    -- A free slot is almost always empty, so sweeping it costs an index probe.
    FOR v_slot IN SELECT slot FROM __S__.claim_ring_slots ORDER BY generation LOOP
        EXIT WHEN v_closed >= p_limit;
        v_closed := v_closed + __S__.rescue_deadline_slot(v_slot, p_limit - v_closed);
        EXIT WHEN v_closed >= p_limit;
        v_closed := v_closed + __S__.rescue_stale_slot(v_slot, p_stale_after, p_limit - v_closed);
    END LOOP;
    RETURN v_closed;
END
$$;

-- The queue-ring proof must also count row-local claims still open on the slot.
-- Claim slots whose proof already shows every claim closed cannot hold an open claim on any ready
-- slot, so only the (few) blocked claim slots are expanded; the blocked set is computed once per
-- call, not once per claim member (as a SQL function's WHERE clause would do).
CREATE OR REPLACE FUNCTION __S__.open_claims_on_ready_slot(p_ready_slot int) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_blocked int[];
    v_compact bigint := 0;
    v_row bigint;
BEGIN
    SELECT coalesce(array_agg(cs.slot), '{}') INTO v_blocked
    FROM __S__.claim_ring_slots cs WHERE __S__.claim_slot_blocker(cs.slot) IS NOT NULL;
    IF cardinality(v_blocked) > 0 THEN
        SELECT count(*) INTO v_compact
        FROM __S__.lease_claim_batches b
        CROSS JOIN LATERAL generate_subscripts(b.ready_slots, 1) AS i
        WHERE b.claim_slot = ANY (v_blocked) AND p_ready_slot = ANY (b.ready_slots)
          AND b.ready_slots[i] = p_ready_slot
          AND b.receipt_ranges @> (b.batch_id * 4096 + i - 1)
          AND NOT EXISTS (SELECT 1 FROM __S__.lease_claim_closure_batches c
                          WHERE c.claim_slot = b.claim_slot AND c.receipt_ranges @> (b.batch_id * 4096 + i - 1));
    END IF;
    SELECT count(*) INTO v_row FROM __S__.lease_claims l
    WHERE l.ready_slot = p_ready_slot
      AND NOT EXISTS (SELECT 1 FROM __S__.lease_claim_closures c
                      WHERE c.claim_slot = l.claim_slot AND c.receipt_id = l.receipt_id);
    RETURN v_compact + v_row;
END
$$;

DROP FUNCTION __S__.open_compact_claim(int, bigint, bigint, bigint);

-- Prune resets every rescue cursor of the slot, the version-3 ones included.
CREATE OR REPLACE FUNCTION __S__.prune_claim_slot(p_slot int, p_lock_timeout text DEFAULT '25ms') RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_state text;
    v_blocker text;
    v_children text;
BEGIN
    PERFORM 1 FROM __S__.claim_ring_state FOR UPDATE;
    SELECT state INTO v_state FROM __S__.claim_ring_slots WHERE slot = p_slot FOR UPDATE;
    IF v_state IS DISTINCT FROM 'sealed' THEN
        RETURN 'not_sealed';
    END IF;
    v_blocker := __S__.claim_slot_blocker(p_slot);
    IF v_blocker IS NOT NULL THEN
        RETURN v_blocker;
    END IF;
    SELECT string_agg(format('%I.%I', '__S__', t || '_' || p_slot), ', ') INTO v_children
    FROM unnest(ARRAY['lease_claims', 'lease_claim_batches', 'lease_claim_closures',
                      'lease_claim_closure_batches']) t;
    PERFORM set_config('lock_timeout', p_lock_timeout, true);
    BEGIN
        EXECUTE 'LOCK TABLE ' || v_children || ' IN ACCESS EXCLUSIVE MODE';
    EXCEPTION WHEN lock_not_available THEN
        RETURN 'busy';
    END;
    PERFORM set_config('lock_timeout', '0', true);
    SELECT state INTO v_state FROM __S__.claim_ring_slots WHERE slot = p_slot;
    IF v_state IS DISTINCT FROM 'sealed' THEN
        RETURN 'not_sealed';
    END IF;
    v_blocker := __S__.claim_slot_blocker(p_slot);
    IF v_blocker IS NOT NULL THEN
        RETURN v_blocker;
    END IF;
    UPDATE __S__.claim_ring_slots
    SET state = 'free', state_since = now(),
        stale_cursor_claimed_at = NULL, stale_cursor_job_id = NULL, stale_cursor_run_lease = NULL,
        deadline_cursor_at = NULL, deadline_cursor_job_id = NULL, deadline_cursor_run_lease = NULL,
        batch_deadline_cursor_at = NULL, batch_deadline_cursor_batch_id = NULL,
        stale_cursor_batch_id = NULL, stale_revisit_at = NULL, stale_revisit_batch_id = NULL,
        stale_row_cursor_at = NULL, stale_row_revisit_at = NULL
    WHERE slot = p_slot;
    EXECUTE 'TRUNCATE ' || v_children;
    RETURN 'pruned';
END
$$;

ALTER FUNCTION __S__.prune_claim_slot(int, text) SET plan_cache_mode = force_custom_plan;
