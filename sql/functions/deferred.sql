-- Deferred jobs (deferred_jobs): scheduled and retryable jobs, promoted to the queue ring when due,
-- and jobs held back by a key limit until their key has room.
--
-- Every function of the engine is defined exactly once, in the file of its plane, and installed with
-- CREATE OR REPLACE by src/schema.rs whenever the combined hash of these files changes. A function
-- that is removed is dropped by name in dropped.sql. __S__ is the validated schema name.

-- Tell the maintenance leader that a deferred job may be due sooner than it knows. Between
-- promotions the leader sleeps until the earliest run_at it saw (promote_due's next_due_in), or at
-- most a few seconds while its process LISTENs (src/maintenance/runner.rs); every statement that
-- inserts a deferred job that is not held, or moves a run_at earlier, calls this, so such a job is
-- still promoted within a tick of being due. Delivered at commit, once per transaction.
CREATE OR REPLACE FUNCTION __S__.wake_promotion() RETURNS void
LANGUAGE sql AS $$
    SELECT pg_notify('ringwork___S__.maintenance', 'deferred')
$$;

CREATE OR REPLACE FUNCTION __S__.schedule_jobs(p_queue text, p_priority smallint, p_kinds text[], p_args jsonb[],
                                    p_max_attempts int[], p_run_at timestamptz[], p_timeouts_ms int[],
                                    p_traceparents text[])
RETURNS SETOF bigint
LANGUAGE sql AS $$
    SELECT __S__.ensure_lane(p_queue, p_priority);
    SELECT __S__.wake_promotion();
    INSERT INTO __S__.deferred_jobs (job_id, queue, kind, args, priority, attempt, run_lease, max_attempts,
                                     run_at, created_at, timeout_ms, traceparent)
    SELECT nextval('__S__.job_ids'), p_queue, k, a, p_priority, 0, 0, m, r, now(), t, __S__.traceparent_bytes(tp)
    FROM unnest(p_kinds, p_args, p_max_attempts, p_run_at, p_timeouts_ms, p_traceparents) AS u(k, a, m, r, t, tp)
    RETURNING job_id;
$$;

-- Promotion without a temp table (creating one per call churns the system catalogs): lock the due
-- rows of one lane, reserve a segment of that size, then move exactly those rows.
-- Move these deferred jobs (one queue and priority, locked by the caller) to the queue ring as one
-- segment, in this order. A held job (migration 0012) comes back at its creation time: it has
-- waited since then, so the claim walk reaches it before younger work.
CREATE OR REPLACE FUNCTION __S__.promote_jobs(p_queue text, p_priority smallint, p_ids bigint[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_seg record;
BEGIN
    SELECT * INTO v_seg FROM __S__.enqueue_segment(p_queue, p_priority, cardinality(p_ids));
    WITH due AS (
        DELETE FROM __S__.deferred_jobs d WHERE d.job_id = ANY (p_ids) RETURNING d.*
    )
    INSERT INTO __S__.ready_entries (ready_slot, lane_id, lane_pos, job_id, queue, kind, args, priority,
                                     attempt, run_lease, max_attempts, run_at, created_at, timeout_ms,
                                     traceparent)
    SELECT v_seg.ready_slot, v_seg.lane_id, v_seg.base_pos + array_position(p_ids, p.job_id) - 1,
           p.job_id, p.queue, p.kind, p.args, p.priority, p.attempt, p.run_lease, p.max_attempts,
           CASE WHEN p.held_key IS NULL THEN p.run_at ELSE p.created_at END, p.created_at, p.timeout_ms,
           p.traceparent
    FROM due p;
END
$$;

-- Bring back held jobs (migration 0012) of the keys with room, given each key's room (p_room; a
-- key absent from it has p_default_room): for each held key (found by a loose index scan, one
-- probe per key rather than one per held job), its oldest held jobs, at most its room. Called by a
-- claim of the queue under its limit lock, so two claims cannot both use one key's room.
CREATE OR REPLACE FUNCTION __S__.release_held(p_queue text, p_room jsonb, p_default_room int) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    v_key text;
    v_room int;
    v_group record;
    v_total int := 0;
BEGIN
    FOR v_key IN
        WITH RECURSIVE keys (k) AS (
            (SELECT d.held_key FROM __S__.deferred_jobs d
             WHERE d.queue = p_queue AND d.held_key IS NOT NULL ORDER BY d.held_key LIMIT 1)
            UNION ALL
            SELECT (SELECT d.held_key FROM __S__.deferred_jobs d
                    WHERE d.queue = p_queue AND d.held_key > keys.k ORDER BY d.held_key LIMIT 1)
            FROM keys WHERE keys.k IS NOT NULL
        )
        SELECT keys.k FROM keys WHERE keys.k IS NOT NULL
    LOOP
        v_room := coalesce((p_room ->> v_key)::int, p_default_room);
        CONTINUE WHEN v_room <= 0;
        FOR v_group IN
            SELECT h.priority, array_agg(h.job_id ORDER BY h.job_id) AS ids
            FROM (SELECT d.job_id, d.priority FROM __S__.deferred_jobs d
                  WHERE d.queue = p_queue AND d.held_key = v_key
                  ORDER BY d.job_id LIMIT v_room FOR UPDATE SKIP LOCKED) h
            GROUP BY h.priority
        LOOP
            PERFORM __S__.promote_jobs(p_queue, v_group.priority, v_group.ids);
            v_total := v_total + cardinality(v_group.ids);
        END LOOP;
    END LOOP;
    RETURN v_total;
END
$$;

-- Move up to p_limit due deferred jobs to the queue ring; next_due_in is how long until the
-- earliest deferred job left is due (at most zero when some are due already: the batch was full;
-- NULL when none waits; a job held under a key limit waits at 9999-01-01, never due).
CREATE OR REPLACE FUNCTION __S__.promote_due_next(p_limit int, OUT promoted int, OUT next_due_in interval)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_group record;
    v_ids bigint[];
    v_now timestamptz := __S__.engine_now();
BEGIN
    promoted := 0;
    IF EXISTS (SELECT 1 FROM __S__.deferred_jobs WHERE run_at <= v_now) THEN
        FOR v_group IN SELECT DISTINCT d.queue, d.priority FROM __S__.deferred_jobs d WHERE d.run_at <= v_now LOOP
            EXIT WHEN promoted >= p_limit;
            SELECT array_agg(x.job_id ORDER BY x.run_at, x.job_id) INTO v_ids
            FROM (SELECT d.job_id, d.run_at FROM __S__.deferred_jobs d
                  WHERE d.queue = v_group.queue AND d.priority = v_group.priority AND d.run_at <= v_now
                  ORDER BY d.run_at, d.job_id LIMIT p_limit - promoted FOR UPDATE SKIP LOCKED) x;
            CONTINUE WHEN v_ids IS NULL;
            PERFORM __S__.promote_jobs(v_group.queue, v_group.priority, v_ids);
            promoted := promoted + cardinality(v_ids);
        END LOOP;
    END IF;
    -- the first entry of deferred_jobs_due; rows locked by another promotion count as waiting
    next_due_in := (SELECT d.run_at FROM __S__.deferred_jobs d ORDER BY d.run_at, d.job_id LIMIT 1) - v_now;
END
$$;

-- promote_due_next's count alone: what processes of an earlier build call while a rollout replaces
-- them (docs/operations.md, "Upgrading").
CREATE OR REPLACE FUNCTION __S__.promote_due(p_limit int) RETURNS int
LANGUAGE sql AS $$
    SELECT n.promoted FROM __S__.promote_due_next(p_limit) n
$$;

-- Make a queue's scheduled and retryable jobs due now (the next promotion moves them to ready):
-- an operator's "run now", and how a test drains retries without waiting out their backoff.
CREATE OR REPLACE FUNCTION __S__.run_deferred_now(p_queue text) RETURNS int
LANGUAGE sql AS $$
    SELECT __S__.wake_promotion();
    WITH due AS (
        UPDATE __S__.deferred_jobs d SET run_at = __S__.engine_now()
        WHERE d.queue = p_queue AND d.run_at > __S__.engine_now() AND d.held_key IS NULL RETURNING 1
    ) SELECT count(*)::int FROM due
$$;
