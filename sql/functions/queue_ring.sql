-- Queue plane: lanes, lane cursors and enqueue into the queue ring (ready_slot).
--
-- Every function of the engine is defined exactly once, in the file of its plane, and installed with
-- CREATE OR REPLACE by src/schema.rs whenever the combined hash of these files changes. A function
-- that is removed is dropped by name in dropped.sql. __S__ is the validated schema name.

-- ---------------------------------------------------------------------------------------------
-- Lanes
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION __S__.ensure_lane(p_queue text, p_priority smallint) RETURNS __S__.queue_lanes
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
CREATE OR REPLACE FUNCTION __S__.lane_cursor(p_lane_id int) RETURNS bigint
LANGUAGE plpgsql STABLE SET plan_cache_mode = force_generic_plan AS $$
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

-- Is every segment of the lane below p_segment either committed or gone for good?
CREATE OR REPLACE FUNCTION __S__.lane_gap_resolved(p_lane_id int, p_segment bigint) RETURNS boolean
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
CREATE OR REPLACE FUNCTION __S__.enqueue_segment(p_queue text, p_priority smallint, p_count int,
                                      OUT ready_slot int, OUT lane_id int, OUT base_pos bigint)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
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

CREATE OR REPLACE FUNCTION __S__.enqueue_jobs(p_queue text, p_priority smallint, p_kinds text[], p_args jsonb[],
                                   p_max_attempts int[], p_timeouts_ms int[])
RETURNS SETOF bigint
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
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

-- ---------------------------------------------------------------------------------------------
-- Exact counts. Available jobs of a lane are the committed segment positions above the lane's claim
-- cursor, less tombstoned rows above it: a sum over ready_segments (one row per enqueue call, not
-- per job) and tombstones, never a scan of ready_entries. Running is the in-flight anti-join over
-- the active claim slots; scheduled/retryable and dlq count their backlog tables through an index;
-- completed/failed/cancelled count the terminal history still held by the queue ring (the retention
-- the ring and keep_failed give it).
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION __S__.lane_available(p_lane_id int) RETURNS bigint
LANGUAGE plpgsql STABLE SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_pos bigint := __S__.lane_cursor(p_lane_id);
    v_total bigint;
    v_spent bigint;
BEGIN
    SELECT coalesce(sum(CASE WHEN s.segment_no = (v_pos >> 20)
                             THEN greatest(s.job_count - ((v_pos & 1048575) + 1), 0)
                             ELSE s.job_count END), 0)
    INTO v_total
    FROM __S__.ready_segments s
    WHERE s.lane_id = p_lane_id AND s.segment_no >= (v_pos >> 20);
    -- driven by the tombstones (few), each checked against its ready row by index
    SELECT count(*) INTO v_spent
    FROM __S__.ready_tombstones t
    WHERE EXISTS (SELECT 1 FROM __S__.ready_entries e
                  WHERE e.ready_slot = t.ready_slot AND e.job_id = t.job_id AND e.run_lease = t.run_lease
                    AND e.lane_id = p_lane_id AND e.lane_pos > v_pos);
    RETURN v_total - v_spent;
END
$$;
