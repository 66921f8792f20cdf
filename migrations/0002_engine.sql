-- ringwork schema version 2: the hot-path and maintenance statements as server-side functions,
-- so claim and complete are one round trip each. See the end of the file for which functions
-- force custom plans and why.

-- Advisory-lock namespaces, derived from the schema name so two schemas never share a key.
CREATE FUNCTION __S__.lock_ns(p_kind text) RETURNS int
LANGUAGE sql IMMUTABLE AS $$ SELECT hashtext('ringwork:__S__:' || p_kind) & 2147483647 $$;

-- The per-attempt lock every writer on behalf of an attempt takes before deciding (completion,
-- close, cancel, rescue), so that exactly one of them wins (ADR-023 "Complete").
CREATE FUNCTION __S__.lock_attempt(p_job_id bigint) RETURNS void
LANGUAGE sql AS $$ SELECT pg_advisory_xact_lock(__S__.lock_ns('attempt'), (p_job_id % 2147483647)::int) $$;

-- ---------------------------------------------------------------------------------------------
-- Lanes
-- ---------------------------------------------------------------------------------------------
CREATE FUNCTION __S__.ensure_lane(p_queue text, p_priority smallint) RETURNS __S__.queue_lanes
LANGUAGE plpgsql AS $$
DECLARE
    v_lane __S__.queue_lanes;
    v_id int;
BEGIN
    SELECT * INTO v_lane FROM __S__.queue_lanes WHERE queue = p_queue AND priority = p_priority;
    IF FOUND THEN
        RETURN v_lane;
    END IF;
    -- first use of the lane: serialize creators, then create its two sequences
    PERFORM pg_advisory_xact_lock(__S__.lock_ns('lane-create'), 0);
    SELECT * INTO v_lane FROM __S__.queue_lanes WHERE queue = p_queue AND priority = p_priority;
    IF FOUND THEN
        RETURN v_lane;
    END IF;
    INSERT INTO __S__.queues (queue) VALUES (p_queue) ON CONFLICT DO NOTHING;
    v_id := nextval('__S__.lane_ids');
    EXECUTE format('CREATE SEQUENCE %I.%I MINVALUE 1', '__S__', 'lane_' || v_id || '_segment');
    EXECUTE format('CREATE SEQUENCE %I.%I MINVALUE 0 START 0', '__S__', 'lane_' || v_id || '_cursor');
    INSERT INTO __S__.queue_lanes (lane_id, queue, priority, segment_seq, cursor_seq)
    VALUES (v_id, p_queue, p_priority,
            format('%I.%I', '__S__', 'lane_' || v_id || '_segment')::regclass,
            format('%I.%I', '__S__', 'lane_' || v_id || '_cursor')::regclass)
    RETURNING * INTO v_lane;
    RETURN v_lane;
END
$$;

-- The lane's claim cursor: every position at or below it is resolved (claimed, tombstoned or a
-- proven-empty gap). The sequence is advanced lazily after commit; the attempt ledger holds the
-- truth for claims whose advance has not been written yet (ADR-023 "stale claim-cursor recovery").
-- PL/pgSQL, not SQL: a SQL function's statements are planned again on every call, and this one is
-- called per lane by every claim, count and prune proof (planning over 16 partitions cost ~0.6 ms
-- a call); PL/pgSQL keeps its plans for the session.
CREATE FUNCTION __S__.lane_cursor(p_lane_id int) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_seq bigint;
    v_ledger bigint;
BEGIN
    SELECT pg_sequence_last_value(l.cursor_seq) INTO v_seq FROM __S__.queue_lanes l WHERE l.lane_id = p_lane_id;
    SELECT max(upper(a.lane_range)) - 1 INTO v_ledger FROM __S__.ready_claim_attempt_batches a
    WHERE a.lane_id = p_lane_id;
    RETURN greatest(coalesce(v_seq, 0), coalesce(v_ledger, 0));
END
$$;

-- ---------------------------------------------------------------------------------------------
-- Enqueue. Reserves one segment (a contiguous block of lane positions) in the caller's
-- transaction and records it in the current queue slot. The caller then writes the rows (COPY).
--
-- Gap protocol: a segment number is taken from a sequence before the caller's transaction commits,
-- so a claimer can see segment 10 committed while 9 is still in flight (or rolled back). The
-- enqueuer holds a shared lane lock from before it allocates, plus an exclusive lock on its first
-- segment of the lane, until its transaction ends. A claimer may step over a missing segment only
-- when no other transaction holds the lane lock with a first segment below the one it found
-- (lane_gap_resolved), and the missing segment is still absent after that check.
-- ---------------------------------------------------------------------------------------------
CREATE FUNCTION __S__.enqueue_segment(p_queue text, p_priority smallint, p_count int,
                                      OUT ready_slot int, OUT lane_id int, OUT base_pos bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_lane __S__.queue_lanes;
    v_seg bigint;
    v_guc text;
BEGIN
    IF p_count < 1 OR p_count > 1048575 THEN
        RAISE EXCEPTION 'ringwork: a segment holds 1..1048575 jobs, got %', p_count USING ERRCODE = '22023';
    END IF;
    v_lane := __S__.ensure_lane(p_queue, p_priority);
    PERFORM pg_advisory_xact_lock_shared(__S__.lock_ns('lane'), v_lane.lane_id);
    v_seg := nextval(v_lane.segment_seq);
    v_guc := 'rw___S__.lane_' || v_lane.lane_id;
    IF coalesce(current_setting(v_guc, true), '') = '' THEN
        PERFORM pg_advisory_xact_lock((__S__.lock_ns('segment:' || v_lane.lane_id)::bigint << 32)
                                      | (v_seg & 4294967295));
        PERFORM set_config(v_guc, v_seg::text, true);
    END IF;
    SELECT s.slot INTO ready_slot FROM __S__.queue_ring_slots s WHERE s.state = 'current';
    INSERT INTO __S__.ready_segments (ready_slot, lane_id, segment_no, job_count)
    VALUES (ready_slot, v_lane.lane_id, v_seg, p_count);
    PERFORM pg_notify('ringwork___S__', p_queue);
    lane_id := v_lane.lane_id;
    base_pos := v_seg << 20;
END
$$;

-- Enqueue a whole batch for one lane in one statement (the single-job and small-batch path; large
-- batches use enqueue_segment + COPY from the client).
CREATE FUNCTION __S__.enqueue_jobs(p_queue text, p_priority smallint, p_kinds text[], p_args jsonb[],
                                   p_max_attempts int[])
RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_seg record;
    v_n int := cardinality(p_kinds);
BEGIN
    SELECT * INTO v_seg FROM __S__.enqueue_segment(p_queue, p_priority, v_n);
    RETURN QUERY
    INSERT INTO __S__.ready_entries (ready_slot, lane_id, lane_pos, job_id, queue, kind, args, priority,
                                     attempt, run_lease, max_attempts, run_at, created_at)
    SELECT v_seg.ready_slot, v_seg.lane_id, v_seg.base_pos + i - 1, nextval('__S__.job_ids'), p_queue,
           p_kinds[i], p_args[i], p_priority, 0, 0, p_max_attempts[i], now(), now()
    FROM generate_series(1, v_n) i
    RETURNING job_id;
END
$$;

-- Future run_at: straight to the backlog; promotion appends it to ready when due.
CREATE FUNCTION __S__.schedule_jobs(p_queue text, p_priority smallint, p_kinds text[], p_args jsonb[],
                                    p_max_attempts int[], p_run_at timestamptz[])
RETURNS SETOF bigint
LANGUAGE sql AS $$
    SELECT __S__.ensure_lane(p_queue, p_priority);
    INSERT INTO __S__.deferred_jobs (job_id, queue, kind, args, priority, attempt, run_lease, max_attempts,
                                     run_at, created_at)
    SELECT nextval('__S__.job_ids'), p_queue, k, a, p_priority, 0, 0, m, r, now()
    FROM unnest(p_kinds, p_args, p_max_attempts, p_run_at) AS t(k, a, m, r)
    RETURNING job_id;
$$;

-- Is every segment of the lane below p_segment either committed or gone for good?
CREATE FUNCTION __S__.lane_gap_resolved(p_lane_id int, p_segment bigint) RETURNS boolean
LANGUAGE sql VOLATILE AS $$
    SELECT NOT EXISTS (
        SELECT 1
        FROM pg_locks lane_lock
        WHERE lane_lock.locktype = 'advisory' AND lane_lock.granted
          AND lane_lock.objsubid = 2
          AND lane_lock.classid::bigint = __S__.lock_ns('lane')
          AND lane_lock.objid::bigint = p_lane_id
          AND lane_lock.pid <> pg_backend_pid()
          AND NOT EXISTS (
              SELECT 1 FROM pg_locks seg_lock
              WHERE seg_lock.locktype = 'advisory' AND seg_lock.pid = lane_lock.pid
                AND seg_lock.objsubid = 1
                AND seg_lock.classid::bigint = __S__.lock_ns('segment:' || p_lane_id)
                AND seg_lock.objid::bigint >= (p_segment & 4294967295)))
$$;

-- ---------------------------------------------------------------------------------------------
-- Claim: one round trip. Locks one lane head at a time (SKIP LOCKED, priority order), walks the
-- lane from its cursor in position order, writes one ready_claim_attempt_batches row per lane and
-- one compact lease_claim_batches row for the call. Returns run_lease + 1, claim_slot, receipt_id.
-- ---------------------------------------------------------------------------------------------
CREATE FUNCTION __S__.claim(p_queue text, p_max int, p_deadline interval DEFAULT NULL)
RETURNS TABLE (job_id bigint, run_lease bigint, claim_slot int, receipt_id bigint, kind text, args jsonb,
               attempt int, max_attempts int, priority smallint, created_at timestamptz)
LANGUAGE plpgsql AS $$
DECLARE
    v_claim_slot int;
    v_batch bigint;
    v_now timestamptz := now();
    v_lane record;
    v_cursor bigint;
    v_seq_cursor bigint;
    v_new_cursor bigint;
    v_last_slot int;
    v_row record;
    v_n int := 0;
    v_lane_claimed int;
    v_job_ids bigint[] := '{}';
    v_leases bigint[] := '{}';
    v_ready_slots int[] := '{}';
    v_lane_ids int[] := '{}';
    v_attempts int[] := '{}';
    v_max_attempts int[] := '{}';
BEGIN
    IF p_max < 1 OR p_max > 4096 THEN
        RAISE EXCEPTION 'ringwork: claim size must be 1..4096, got %', p_max USING ERRCODE = '22023';
    END IF;
    SELECT s.slot INTO v_claim_slot FROM __S__.claim_ring_slots s WHERE s.state = 'current';
    v_batch := nextval('__S__.claim_batch_ids');

    FOR v_lane IN
        SELECT l.lane_id, l.segment_seq, l.cursor_seq FROM __S__.queue_lanes l
        WHERE l.queue = p_queue
          -- cheap pre-check: the lane has allocated a segment at or after the cursor's segment
          AND coalesce(pg_sequence_last_value(l.segment_seq), 0)
              >= coalesce(pg_sequence_last_value(l.cursor_seq), 0) >> 20
          AND pg_sequence_last_value(l.segment_seq) IS NOT NULL
        ORDER BY l.priority
    LOOP
        EXIT WHEN v_n >= p_max;
        PERFORM 1 FROM __S__.queue_lanes l WHERE l.lane_id = v_lane.lane_id FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;

        v_seq_cursor := coalesce(pg_sequence_last_value(v_lane.cursor_seq), 0);
        v_cursor := __S__.lane_cursor(v_lane.lane_id);
        -- the lazy post-commit advance: the ledger proves claims up to v_cursor committed
        IF v_cursor > v_seq_cursor THEN
            PERFORM setval(v_lane.cursor_seq, v_cursor, true);
        END IF;
        v_new_cursor := v_cursor;
        v_lane_claimed := 0;

        FOR v_row IN
            SELECT e.ready_slot, e.lane_pos, e.job_id, e.kind, e.args, e.attempt, e.run_lease,
                   e.max_attempts, e.priority, e.created_at,
                   EXISTS (SELECT 1 FROM __S__.ready_tombstones t
                           WHERE t.ready_slot = e.ready_slot AND t.job_id = e.job_id
                             AND t.run_lease = e.run_lease) AS spent
            FROM __S__.ready_entries e
            WHERE e.lane_id = v_lane.lane_id AND e.lane_pos > v_cursor
            ORDER BY e.lane_pos
            LIMIT (p_max - v_n) + 64
        LOOP
            -- a missing segment between the last resolved position and this row?
            IF (v_row.lane_pos >> 20) > (v_new_cursor >> 20) + 1 THEN
                EXIT WHEN NOT __S__.lane_gap_resolved(v_lane.lane_id, v_row.lane_pos >> 20);
                -- a transaction may have committed the missing segment after our read: recheck
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
            RETURN NEXT;

            v_job_ids := v_job_ids || v_row.job_id;
            v_leases := v_leases || (v_row.run_lease + 1);
            v_ready_slots := v_ready_slots || v_row.ready_slot;
            v_lane_ids := v_lane_ids || v_lane.lane_id;
            v_attempts := v_attempts || (v_row.attempt + 1);
            v_max_attempts := v_max_attempts || v_row.max_attempts;
            v_n := v_n + 1;
            v_lane_claimed := v_lane_claimed + 1;
        END LOOP;

        IF v_new_cursor > v_cursor THEN
            INSERT INTO __S__.ready_claim_attempt_batches (ready_slot, lane_id, lane_range, claim_slot, claim_batch_id)
            VALUES (v_last_slot, v_lane.lane_id, int8range(v_cursor + 1, v_new_cursor + 1), v_claim_slot, v_batch);
        END IF;
    END LOOP;

    IF v_n > 0 THEN
        INSERT INTO __S__.lease_claim_batches (claim_slot, batch_id, queue, job_ids, run_leases, ready_slots,
                                               lane_ids, attempts, max_attempts, receipt_ranges,
                                               claimed_count, claimed_at, deadline_at)
        VALUES (v_claim_slot, v_batch, p_queue, v_job_ids, v_leases, v_ready_slots, v_lane_ids, v_attempts,
                v_max_attempts, int8multirange(int8range(v_batch * 4096, v_batch * 4096 + v_n)), v_n, v_now,
                v_now + p_deadline);
    END IF;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- Open-claim evidence. A compact claim is open when its batch item exists and no closure batch in
-- the same claim slot covers its receipt. Bounded: the claim ring holds only unpruned slots.
-- ---------------------------------------------------------------------------------------------
CREATE FUNCTION __S__.open_compact_claim(p_claim_slot int, p_receipt_id bigint, p_job_id bigint,
                                         p_run_lease bigint)
RETURNS TABLE (ready_slot int, attempt int, max_attempts int, queue text)
LANGUAGE sql STABLE AS $$
    SELECT b.ready_slots[i], b.attempts[i], b.max_attempts[i], b.queue
    FROM __S__.lease_claim_batches b,
         LATERAL (SELECT (p_receipt_id - b.batch_id * 4096 + 1)::int AS i) o
    WHERE b.claim_slot = p_claim_slot AND b.batch_id = p_receipt_id / 4096
      AND b.job_ids[o.i] = p_job_id AND b.run_leases[o.i] = p_run_lease
      AND NOT EXISTS (SELECT 1 FROM __S__.lease_claim_closure_batches c
                      WHERE c.claim_slot = p_claim_slot AND c.receipt_ranges @> p_receipt_id)
$$;

-- ---------------------------------------------------------------------------------------------
-- Complete (success), batched: per-attempt locks first (in job order, deadlock-free), then — in a
-- new statement, so the snapshot sees any winner that committed while we waited — validate each
-- claim is still open and append one closure batch per claim slot and one completion batch per
-- ready slot. No per-job row, no UPDATE, no DELETE (except attempt_state rows the attempt made).
-- ---------------------------------------------------------------------------------------------
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
        SELECT i.*, o.ready_slot
        FROM input i, LATERAL __S__.open_compact_claim(i.claim_slot, i.receipt_id, i.job_id, i.run_lease) o
    ), closure AS (
        INSERT INTO __S__.lease_claim_closure_batches (claim_slot, batch_id, receipt_ranges, closed_count, outcome)
        SELECT o.claim_slot, nextval('__S__.evidence_batch_ids'), range_agg(int8range(o.receipt_id, o.receipt_id + 1)),
               count(*), 'completed'
        FROM open o GROUP BY o.claim_slot ORDER BY o.claim_slot
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
           EXISTS (SELECT 1 FROM open o WHERE o.receipt_id = i.receipt_id AND o.claim_slot = i.claim_slot)
    FROM input i;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- Non-success close, batched: retry (to deferred_jobs with its run_at), failed (terminal
-- done_entries row). Same lock-then-validate order as completion; closure batches are written
-- ordered by claim_slot, then (job_id, run_lease).
-- ---------------------------------------------------------------------------------------------
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
        SELECT i.*, o.ready_slot, o.attempt, e.queue, e.kind, e.args, e.priority, e.max_attempts, e.created_at
        FROM input i
        CROSS JOIN LATERAL __S__.open_compact_claim(i.claim_slot, i.receipt_id, i.job_id, i.run_lease) o
        JOIN __S__.ready_entries e
          ON e.ready_slot = o.ready_slot AND e.job_id = i.job_id AND e.run_lease = i.run_lease - 1
    ), closure AS (
        INSERT INTO __S__.lease_claim_closure_batches (claim_slot, batch_id, receipt_ranges, closed_count, outcome)
        SELECT g.claim_slot, nextval('__S__.evidence_batch_ids'), g.ranges, g.n, g.outcome
        FROM (SELECT o.claim_slot, o.outcome, range_agg(int8range(o.receipt_id, o.receipt_id + 1)) AS ranges,
                     count(*) AS n, min(o.job_id) AS first_job
              FROM open o GROUP BY o.claim_slot, o.outcome) g
        ORDER BY g.claim_slot, g.first_job
        RETURNING 1
    ), retried AS (
        INSERT INTO __S__.deferred_jobs (job_id, queue, kind, args, priority, attempt, run_lease, max_attempts,
                                         run_at, created_at, last_error)
        SELECT o.job_id, o.queue, o.kind, o.args, o.priority, o.attempt, o.run_lease, o.max_attempts,
               o.retry_at, o.created_at, o.error
        FROM open o WHERE o.outcome = 'retry'
        RETURNING 1
    ), failed AS (
        INSERT INTO __S__.done_entries (ready_slot, job_id, run_lease, queue, kind, args, priority, attempt,
                                        max_attempts, state, error, created_at)
        SELECT o.ready_slot, o.job_id, o.run_lease, o.queue, o.kind, o.args, o.priority, o.attempt,
               o.max_attempts, CASE o.outcome WHEN 'cancelled' THEN 'cancelled' ELSE 'failed' END, o.error,
               o.created_at
        FROM open o WHERE o.outcome IN ('failed', 'cancelled')
        RETURNING 1
    ), heartbeat AS (
        DELETE FROM __S__.attempt_state a USING open o
        WHERE a.job_id = o.job_id AND a.run_lease = o.run_lease
        RETURNING 1
    )
    SELECT i.job_id, i.run_lease,
           EXISTS (SELECT 1 FROM open o WHERE o.receipt_id = i.receipt_id AND o.claim_slot = i.claim_slot)
    FROM input i;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- Promotion (maintenance): due deferred_jobs move to ready at a new lane position, in run_at order.
-- deferred_jobs is a backlog table: delete-and-append is its documented churn.
-- ---------------------------------------------------------------------------------------------
CREATE FUNCTION __S__.promote_due(p_limit int) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    v_group record;
    v_seg record;
    v_total int := 0;
BEGIN
    CREATE TEMP TABLE IF NOT EXISTS ringwork_promoting (LIKE __S__.deferred_jobs) ON COMMIT DROP;
    WITH due AS (
        DELETE FROM __S__.deferred_jobs d
        WHERE d.job_id IN (SELECT x.job_id FROM __S__.deferred_jobs x WHERE x.run_at <= now()
                           ORDER BY x.run_at, x.job_id LIMIT p_limit FOR UPDATE SKIP LOCKED)
        RETURNING d.*
    )
    INSERT INTO ringwork_promoting SELECT * FROM due;
    FOR v_group IN SELECT p.queue, p.priority, count(*)::int AS n FROM ringwork_promoting p
                   GROUP BY p.queue, p.priority LOOP
        SELECT * INTO v_seg FROM __S__.enqueue_segment(v_group.queue, v_group.priority, v_group.n);
        INSERT INTO __S__.ready_entries (ready_slot, lane_id, lane_pos, job_id, queue, kind, args, priority,
                                         attempt, run_lease, max_attempts, run_at, created_at)
        SELECT v_seg.ready_slot, v_seg.lane_id, v_seg.base_pos + row_number() OVER (ORDER BY p.run_at, p.job_id) - 1,
               p.job_id, p.queue, p.kind, p.args, p.priority, p.attempt, p.run_lease, p.max_attempts,
               p.run_at, p.created_at
        FROM ringwork_promoting p WHERE p.queue = v_group.queue AND p.priority = v_group.priority;
        v_total := v_total + v_group.n;
    END LOOP;
    DROP TABLE ringwork_promoting;
    RETURN v_total;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- Rotation: move the write slot to the oldest free slot. A slot pinned by live data stays sealed
-- and does not stop rotation (ARCHITECTURE §5); with no free slot, the current slot keeps growing.
-- ---------------------------------------------------------------------------------------------
CREATE FUNCTION __S__.rotate_queue_ring(p_min_age interval) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_cur __S__.queue_ring_slots;
    v_next int;
BEGIN
    PERFORM 1 FROM __S__.queue_ring_state FOR UPDATE;
    SELECT * INTO v_cur FROM __S__.queue_ring_slots WHERE state = 'current' FOR UPDATE;
    IF v_cur.state_since > now() - p_min_age THEN
        RETURN false;
    END IF;
    -- an unused current slot gains nothing from rotation
    IF NOT EXISTS (SELECT 1 FROM __S__.ready_segments WHERE ready_slot = v_cur.slot)
       AND NOT EXISTS (SELECT 1 FROM __S__.done_entries WHERE ready_slot = v_cur.slot)
       AND NOT EXISTS (SELECT 1 FROM __S__.receipt_completion_batches WHERE ready_slot = v_cur.slot)
       AND NOT EXISTS (SELECT 1 FROM __S__.ready_claim_attempt_batches WHERE ready_slot = v_cur.slot) THEN
        RETURN false;
    END IF;
    SELECT slot INTO v_next FROM __S__.queue_ring_slots WHERE state = 'free'
    ORDER BY generation, slot LIMIT 1 FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    UPDATE __S__.queue_ring_slots SET state = 'sealed', state_since = now() WHERE slot = v_cur.slot;
    UPDATE __S__.queue_ring_slots SET state = 'current', state_since = now(),
           generation = (SELECT max(generation) + 1 FROM __S__.queue_ring_slots)
    WHERE slot = v_next;
    RETURN true;
END
$$;

CREATE FUNCTION __S__.rotate_claim_ring(p_min_age interval) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_cur __S__.claim_ring_slots;
    v_next int;
BEGIN
    PERFORM 1 FROM __S__.claim_ring_state FOR UPDATE;
    SELECT * INTO v_cur FROM __S__.claim_ring_slots WHERE state = 'current' FOR UPDATE;
    IF v_cur.state_since > now() - p_min_age THEN
        RETURN false;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM __S__.lease_claim_batches WHERE claim_slot = v_cur.slot)
       AND NOT EXISTS (SELECT 1 FROM __S__.lease_claims WHERE claim_slot = v_cur.slot) THEN
        RETURN false;
    END IF;
    SELECT slot INTO v_next FROM __S__.claim_ring_slots WHERE state = 'free'
    ORDER BY generation, slot LIMIT 1 FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    UPDATE __S__.claim_ring_slots SET state = 'sealed', state_since = now() WHERE slot = v_cur.slot;
    UPDATE __S__.claim_ring_slots SET state = 'current', state_since = now(),
           generation = (SELECT max(generation) + 1 FROM __S__.claim_ring_slots)
    WHERE slot = v_next;
    RETURN true;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- Prune proofs. Each returns NULL when the slot is provably dead, else the reason it is not.
-- ---------------------------------------------------------------------------------------------
-- Claim slot: every claim has exactly one closure (closures are unique per receipt by constraint,
-- so equal counts mean every claim is closed).
CREATE FUNCTION __S__.claim_slot_blocker(p_slot int) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN
        coalesce((SELECT sum(claimed_count) FROM __S__.lease_claim_batches WHERE claim_slot = p_slot), 0)
        + (SELECT count(*) FROM __S__.lease_claims WHERE claim_slot = p_slot)
        > coalesce((SELECT sum(closed_count) FROM __S__.lease_claim_closure_batches WHERE claim_slot = p_slot), 0)
        + (SELECT count(*) FROM __S__.lease_claim_closures WHERE claim_slot = p_slot)
    THEN 'open_claims' END
$$;

-- Open compact claims anywhere in the claim ring that still reference ready slot p_ready_slot.
CREATE FUNCTION __S__.open_claims_on_ready_slot(p_ready_slot int) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT count(*)
    FROM __S__.claim_ring_slots cs
    CROSS JOIN LATERAL (
        SELECT b.batch_id, b.claim_slot, b.ready_slots
        FROM __S__.lease_claim_batches b
        WHERE b.claim_slot = cs.slot AND p_ready_slot = ANY (b.ready_slots)
    ) b
    CROSS JOIN LATERAL generate_subscripts(b.ready_slots, 1) AS i
    WHERE __S__.claim_slot_blocker(cs.slot) IS NOT NULL
      AND b.ready_slots[i] = p_ready_slot
      AND NOT EXISTS (SELECT 1 FROM __S__.lease_claim_closure_batches c
                      WHERE c.claim_slot = b.claim_slot AND c.receipt_ranges @> (b.batch_id * 4096 + i - 1))
$$;

-- Queue slot: no ready row at or ahead of its lane cursor (unclaimed work) and no open claim on it.
CREATE FUNCTION __S__.queue_slot_blocker(p_slot int) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN EXISTS (SELECT 1 FROM __S__.queue_lanes l
                     WHERE (SELECT max(e.lane_pos) FROM __S__.ready_entries e
                            WHERE e.ready_slot = p_slot AND e.lane_id = l.lane_id) > __S__.lane_cursor(l.lane_id))
            THEN 'pending_ready'
        WHEN __S__.open_claims_on_ready_slot(p_slot) > 0 THEN 'open_claims'
    END
$$;

-- Prune order (ADR-023 "Rotation and prune"): ring state FOR UPDATE -> slot row FOR UPDATE ->
-- proof -> ACCESS EXCLUSIVE on the slot's children with a short lock timeout (skip when busy) ->
-- re-check not-current and re-prove under the locks -> TRUNCATE all children in one statement.
-- Failed and cancelled history younger than p_keep_failed is carried forward into the current slot
-- (INSERT only) before the truncate, so terminal failures outlive their slot.
CREATE FUNCTION __S__.prune_queue_slot(p_slot int, p_lock_timeout text DEFAULT '25ms',
                                       p_keep_failed interval DEFAULT '72 hours') RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_state text;
    v_blocker text;
    v_lane record;
    v_children text;
BEGIN
    PERFORM 1 FROM __S__.queue_ring_state FOR UPDATE;
    SELECT state INTO v_state FROM __S__.queue_ring_slots WHERE slot = p_slot FOR UPDATE;
    IF v_state IS DISTINCT FROM 'sealed' THEN
        RETURN 'not_sealed';
    END IF;
    v_blocker := __S__.queue_slot_blocker(p_slot);
    IF v_blocker IS NOT NULL THEN
        RETURN v_blocker;
    END IF;
    SELECT string_agg(format('%I.%I', '__S__', t || '_' || p_slot), ', ') INTO v_children
    FROM unnest(ARRAY['ready_entries', 'ready_segments', 'ready_tombstones', 'ready_claim_attempt_batches',
                      'done_entries', 'receipt_completion_batches']) t;
    PERFORM set_config('lock_timeout', p_lock_timeout, true);
    BEGIN
        EXECUTE 'LOCK TABLE ' || v_children || ' IN ACCESS EXCLUSIVE MODE';
        -- the ledger rows in this slot are about to go: persist what they prove into the lane
        -- cursors first (NOWAIT: a claimer holding the lane is waiting on our lock, never wait on it)
        FOR v_lane IN SELECT DISTINCT a.lane_id FROM __S__.ready_claim_attempt_batches a WHERE a.ready_slot = p_slot LOOP
            PERFORM 1 FROM __S__.queue_lanes l WHERE l.lane_id = v_lane.lane_id FOR UPDATE NOWAIT;
            PERFORM setval(l.cursor_seq, __S__.lane_cursor(l.lane_id), true)
            FROM __S__.queue_lanes l
            WHERE l.lane_id = v_lane.lane_id
              AND __S__.lane_cursor(l.lane_id) > coalesce(pg_sequence_last_value(l.cursor_seq), 0);
        END LOOP;
    EXCEPTION WHEN lock_not_available THEN
        RETURN 'busy';
    END;
    PERFORM set_config('lock_timeout', '0', true);
    SELECT state INTO v_state FROM __S__.queue_ring_slots WHERE slot = p_slot;
    IF v_state IS DISTINCT FROM 'sealed' THEN
        RETURN 'not_sealed';
    END IF;
    v_blocker := __S__.queue_slot_blocker(p_slot);
    IF v_blocker IS NOT NULL THEN
        RETURN v_blocker;
    END IF;
    INSERT INTO __S__.done_entries (ready_slot, job_id, run_lease, queue, kind, args, priority, attempt,
                                    max_attempts, state, error, created_at, finalized_at)
    SELECT (SELECT slot FROM __S__.queue_ring_slots WHERE state = 'current'), d.job_id, d.run_lease, d.queue,
           d.kind, d.args, d.priority, d.attempt, d.max_attempts, d.state, d.error, d.created_at, d.finalized_at
    FROM __S__.done_entries d
    WHERE d.ready_slot = p_slot AND d.state <> 'completed' AND d.finalized_at > now() - p_keep_failed;
    EXECUTE 'TRUNCATE ' || v_children;
    UPDATE __S__.queue_ring_slots SET state = 'free', state_since = now() WHERE slot = p_slot;
    RETURN 'pruned';
END
$$;

CREATE FUNCTION __S__.prune_claim_slot(p_slot int, p_lock_timeout text DEFAULT '25ms') RETURNS text
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
        batch_deadline_cursor_at = NULL, batch_deadline_cursor_batch_id = NULL
    WHERE slot = p_slot;
    EXECUTE 'TRUNCATE ' || v_children;
    RETURN 'pruned';
END
$$;

-- Plan-time partition pruning for the maintenance functions, which address one slot by parameter.
-- The hot-path functions (enqueue, claim, complete, close) keep cached generic plans: they read the
-- lanes across every slot anyway, so a custom plan would lock the same children and cost ~5 ms of
-- planning per call. Their child locks are short; prune's lock_timeout bounds how long it can queue.
DO $$
DECLARE f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_proc p WHERE p.pronamespace = '__S__'::regnamespace
             AND p.prolang = (SELECT oid FROM pg_language WHERE lanname = 'plpgsql')
             AND (p.proname LIKE 'prune_%' OR p.proname LIKE 'rotate_%') LOOP
        EXECUTE format('ALTER FUNCTION %s SET plan_cache_mode = force_custom_plan', f);
    END LOOP;
END
$$;
