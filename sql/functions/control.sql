-- Operator controls: pause/resume, the dead-letter switch, cancel.
--
-- Every function of the engine is defined exactly once, in the file of its plane, and installed with
-- CREATE OR REPLACE by src/schema.rs whenever the combined hash of these files changes. A function
-- that is removed is dropped by name in dropped.sql. __S__ is the validated schema name.

CREATE OR REPLACE FUNCTION __S__.set_queue_paused(p_queue text, p_paused boolean) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM __S__.ensure_lane(p_queue, 2::smallint);
    UPDATE __S__.queues SET paused = p_paused WHERE queue = p_queue AND paused IS DISTINCT FROM p_paused;
    IF FOUND AND NOT p_paused THEN
        -- lanes parked while paused come back now, in order (a lane a claimer holds is brought
        -- back by that claimer)
        PERFORM __S__.unpark_queue(p_queue);
        -- wake the queue's dispatchers (a paused queue's dispatchers wait for a NOTIFY or the poll)
        PERFORM pg_notify('ringwork___S__', p_queue);
        RETURN true;
    END IF;
    RETURN FOUND;
END
$$;

CREATE OR REPLACE FUNCTION __S__.set_queue_dead_letter(p_queue text, p_enabled boolean) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM __S__.ensure_lane(p_queue, 2::smallint);
    UPDATE __S__.queues SET dlq_enabled = p_enabled WHERE queue = p_queue AND dlq_enabled IS DISTINCT FROM p_enabled;
    RETURN FOUND;
END
$$;

-- Set one of the schema's settings (queue_ring.sql, setting); NULL puts back the default. The
-- limits take 64 and more; archive_search (archive.sql, archive_slot_search) is 1 (on) or NULL. A running
-- Rust process reads max_args_bytes once, at its first insert: restart producers after lowering it
-- (the SQL API and a process started after the change check the new value).
CREATE OR REPLACE FUNCTION __S__.set_setting(p_name text, p_value bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_max bigint;
BEGIN
    IF p_name IS NULL OR p_name NOT IN ('max_args_bytes', 'max_error_chars', 'archive_search') THEN
        RAISE EXCEPTION 'ringwork: unknown setting %: expected max_args_bytes, max_error_chars or archive_search',
            quote_nullable(p_name) USING ERRCODE = '22023';
    END IF;
    IF p_name = 'archive_search' AND p_value <> 1 THEN
        RAISE EXCEPTION 'ringwork: archive_search is 1 (on) or NULL (off), got %', p_value USING ERRCODE = '22023';
    END IF;
    -- errors are read back whole up to 65,536 characters (read.rs, MAX_DETAIL_CHARS)
    v_max := CASE p_name WHEN 'max_error_chars' THEN 65536 ELSE 268435456 END;
    IF p_value IS NOT NULL AND p_name <> 'archive_search' AND p_value NOT BETWEEN 64 AND v_max THEN
        RAISE EXCEPTION 'ringwork: % must be 64..%, got %', p_name, v_max, p_value USING ERRCODE = '22023';
    END IF;
    IF p_value IS NULL THEN
        DELETE FROM __S__.settings s WHERE s.name = p_name;
    ELSE
        INSERT INTO __S__.settings (name, value) VALUES (p_name, p_value)
        ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value;
    END IF;
    RETURN __S__.setting(p_name);
END
$$;

-- The queue's running mark (migration 0010), a sequence created as the schema's owner: the roles
-- that set limits need no CREATE on the schema (the same as create_lane_shard, queue_ring.sql).
CREATE OR REPLACE FUNCTION __S__.create_running_mark(p_queue text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_seq text := 'running_mark_' || nextval('__S__.lane_ids');
BEGIN
    EXECUTE format('CREATE SEQUENCE %I.%I MINVALUE 0 START 0', '__S__', v_seq);
    UPDATE __S__.queues SET running_mark_seq = format('%I.%I', '__S__', v_seq)::regclass
    WHERE queue = p_queue;
END
$$;
REVOKE EXECUTE ON FUNCTION __S__.create_running_mark(text) FROM PUBLIC;

-- Fleet-wide limits of a queue (NULL: none); claim reads them (sql/functions/claim.sql, claim_room). A
-- queue whose limits were raised or removed gets a NOTIFY, so its waiting dispatchers claim now.
CREATE OR REPLACE FUNCTION __S__.set_queue_limits(p_queue text, p_max_running int, p_rate_limit int,
                                                  p_rate_period interval, p_key_path text[],
                                                  p_key_max_running int, p_key_rate_limit int,
                                                  p_key_rate_period interval) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_mark regclass;
    v_old_path text[];
BEGIN
    PERFORM __S__.ensure_lane(p_queue, 2::smallint);
    -- under the queue row's lock: two operators setting limits at once serialize here
    SELECT q.running_mark_seq, q.key_path INTO v_mark, v_old_path
    FROM __S__.queues q WHERE q.queue = p_queue FOR UPDATE;
    -- a concurrency limit, of the queue or per key, needs the queue's running mark (migration 0010)
    IF (p_max_running IS NOT NULL OR p_key_max_running IS NOT NULL) AND v_mark IS NULL THEN
        PERFORM __S__.create_running_mark(p_queue);
    END IF;
    UPDATE __S__.queues
    SET max_running = p_max_running, rate_limit = p_rate_limit, rate_period = p_rate_period,
        key_path = p_key_path, key_max_running = p_key_max_running, key_rate_limit = p_key_rate_limit,
        key_rate_period = p_key_rate_period
    WHERE queue = p_queue
      AND (max_running, rate_limit, rate_period, key_path, key_max_running, key_rate_limit, key_rate_period)
          IS DISTINCT FROM (p_max_running, p_rate_limit, p_rate_period, p_key_path, p_key_max_running,
                            p_key_rate_limit, p_key_rate_period);
    IF FOUND THEN
        -- jobs held under a key limit that is gone, or now reads another key, are due again at their
        -- creation time; under a changed limit on the same key, claims bring them back as room allows
        IF v_old_path IS NOT NULL AND v_old_path IS DISTINCT FROM p_key_path THEN
            UPDATE __S__.deferred_jobs d SET held_key = NULL, run_at = d.created_at
            WHERE d.queue = p_queue AND d.held_key IS NOT NULL;
            IF FOUND THEN
                PERFORM __S__.wake_promotion();
            END IF;
        END IF;
        PERFORM pg_notify('ringwork___S__', p_queue);
        RETURN true;
    END IF;
    RETURN false;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- Cancel by id. Returns what happened: 'cancelled' (available or scheduled: it will never run),
-- 'cancelled_running' (its open claim was closed as cancelled; the handler is told through NOTIFY
-- and any late completion is stale), 'already_finished', or 'not_found'.
--
-- An available job is cancelled with a ready_tombstones row (INSERT only). Deciding "available"
-- versus "claimed" takes the lane's lock (lock_lane) — the lock every claimer takes — and then
-- reads the lane cursor in a new statement, so a claim and a cancel of the same job serialize:
-- the job is either tombstoned before any claim reads it, or cancelled as a running attempt.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION __S__.cancel_job(p_job_id bigint, p_reason text DEFAULT 'cancelled') RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_deferred __S__.deferred_jobs;
    v_ready record;
    v_current int;
    v_claim record;
    v_parked_lane int;
    v_parked __S__.parked_entries;
    v_lease __S__.leases;
    v_step_state text;
BEGIN
    p_reason := __S__.bounded_text(p_reason, __S__.setting('max_error_chars'));
    -- a workflow step: its workflow's lock before the attempt lock (workflows.sql); a step still
    -- waiting for its dependencies has no job row yet and is cancelled where it waits
    IF __S__.lock_workflows_of(ARRAY[p_job_id]) THEN
        v_step_state := __S__.cancel_waiting_step(p_job_id);
        IF v_step_state IS NOT NULL THEN
            RETURN v_step_state;
        END IF;
    END IF;
    v_current := __S__.current_queue_slot();
    -- waiting for a callback (callbacks.sql): the wait ends as cancelled; a later callback finds
    -- nothing. The ring's shared lock first, as every lease operation takes it.
    -- The attempt lock first, so an attempt that starts to wait (await_callback) does so before or
    -- after this cancel looks, never in between.
    PERFORM __S__.lease_ring_shared();
    PERFORM __S__.lock_attempt(p_job_id);
    SELECT * INTO v_lease FROM __S__.leases l WHERE l.job_id = p_job_id AND l.state = 'waiting';
    IF FOUND THEN
        PERFORM __S__.end_wait(v_lease, 'cancel', NULL, p_reason);
        RETURN 'cancelled';
    END IF;
    -- scheduled or waiting for a retry
    DELETE FROM __S__.deferred_jobs d WHERE d.job_id = p_job_id RETURNING * INTO v_deferred;
    IF FOUND THEN
        INSERT INTO __S__.done_entries (ready_slot, job_id, run_lease, queue, kind, args, priority, attempt,
                                        max_attempts, state, error, created_at)
        VALUES (v_current, v_deferred.job_id, v_deferred.run_lease, v_deferred.queue, v_deferred.kind,
                v_deferred.args, v_deferred.priority, v_deferred.attempt, v_deferred.max_attempts, 'cancelled',
                p_reason, v_deferred.created_at);
        -- the progress a retried or snoozed attempt left goes with the job
        DELETE FROM __S__.attempt_state a WHERE a.job_id = p_job_id;
        RETURN 'cancelled';
    END IF;
    IF EXISTS (SELECT 1 FROM __S__.done_entries WHERE job_id = p_job_id)
       OR EXISTS (SELECT 1 FROM __S__.archived_job(p_job_id)) THEN
        RETURN 'already_finished';
    END IF;
    -- parked (sql/functions/parking.sql): under the lane's lock, which unpark needs too, mark the row;
    -- it goes back to the ring with a tombstone. Unparked meanwhile: cancel it in the ring below.
    SELECT p.lane_id INTO v_parked_lane FROM __S__.parked_entries p WHERE p.job_id = p_job_id AND NOT p.cancelled;
    IF FOUND THEN
        PERFORM __S__.lock_lane(v_parked_lane);
        UPDATE __S__.parked_entries p SET cancelled = true
        WHERE p.job_id = p_job_id AND NOT p.cancelled RETURNING p.* INTO v_parked;
        IF FOUND THEN
            INSERT INTO __S__.done_entries (ready_slot, job_id, run_lease, queue, kind, args, priority, attempt,
                                            max_attempts, state, error, created_at)
            VALUES (v_current, p_job_id, v_parked.run_lease, v_parked.queue, v_parked.kind, v_parked.args,
                    v_parked.priority, v_parked.attempt, v_parked.max_attempts, 'cancelled', p_reason,
                    v_parked.created_at);
            -- the progress a retried or snoozed attempt left goes with the job
            DELETE FROM __S__.attempt_state a WHERE a.job_id = p_job_id;
            RETURN 'cancelled';
        END IF;
    END IF;
    SELECT e.* INTO v_ready FROM __S__.ready_entries e WHERE e.job_id = p_job_id ORDER BY e.run_lease DESC LIMIT 1;
    IF NOT FOUND THEN
        RETURN 'not_found';
    END IF;
    PERFORM __S__.lock_lane(v_ready.lane_id);
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
        -- the progress a retried or snoozed attempt left goes with the job
        DELETE FROM __S__.attempt_state a WHERE a.job_id = p_job_id;
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
        PERFORM pg_notify('ringwork___S__.cancel', p_job_id || ':' || (v_ready.run_lease + 1));
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
        -- the progress a retried or snoozed attempt left goes with the job
        DELETE FROM __S__.attempt_state a WHERE a.job_id = p_job_id;
        RETURN 'cancelled';
    END IF;
    RETURN 'already_finished';
END
$$;

-- ---------------------------------------------------------------------------------------------
-- Bulk operations by filter: cancel, retry, delete. Each call is one bounded
-- step: at most p_limit jobs, in job_id order after p_after, so an operation over a million jobs is
-- many short transactions, never one long lock. The caller (Storage::bulk_*) loops, passing the
-- returned last_job_id back, until a step looks at fewer than p_limit jobs. Filters: queue and kind
-- (NULL: any), states (the JobStatus names), and p_before: jobs created before it (waiting and
-- running jobs), or finished before it (dead-lettered and history rows). The sweep is by job id,
-- so a job that changes state behind it (a retry of a job it passed) is not revisited: run again.
-- ---------------------------------------------------------------------------------------------

-- Cancel waiting (pending, available, scheduled, retryable) and running jobs, each through cancel_job, so a
-- bulk cancel takes the same locks and wins or loses the same races as a cancel by id.
CREATE OR REPLACE FUNCTION __S__.bulk_cancel(p_queue text, p_kind text, p_states text[], p_before timestamptz,
                                             p_after bigint, p_limit int, p_reason text)
RETURNS TABLE (last_job_id bigint, looked_at int, cancelled int)
LANGUAGE plpgsql AS $$
DECLARE
    v_job bigint;
    v_outcome text;
BEGIN
    last_job_id := NULL;
    looked_at := 0;
    cancelled := 0;
    -- each branch takes its own first p_limit in job-id order (an index walk that stops early), so
    -- the merge below is exact: every candidate below the last one returned was returned
    FOR v_job IN
        SELECT c.job_id FROM (
            (SELECT e.job_id FROM __S__.ready_entries e
             WHERE 'available' = ANY (p_states) AND e.job_id > p_after
               AND (p_queue IS NULL OR e.queue = p_queue) AND (p_kind IS NULL OR e.kind = p_kind)
               AND e.created_at < p_before
               AND e.lane_pos > __S__.lane_cursor(e.lane_id)
               AND NOT EXISTS (SELECT 1 FROM __S__.ready_tombstones t
                               WHERE t.ready_slot = e.ready_slot AND t.job_id = e.job_id
                                 AND t.run_lease = e.run_lease)
             ORDER BY e.job_id LIMIT p_limit)
            UNION
            (SELECT x.job_id FROM __S__.parked_entries x
             WHERE 'available' = ANY (p_states) AND x.job_id > p_after AND NOT x.cancelled
               AND (p_queue IS NULL OR x.queue = p_queue) AND (p_kind IS NULL OR x.kind = p_kind)
               AND x.created_at < p_before
             ORDER BY x.job_id LIMIT p_limit)
            UNION
            (SELECT d.job_id FROM __S__.deferred_jobs d
             WHERE d.job_id > p_after
               AND (CASE WHEN d.held_key IS NOT NULL THEN 'available'
                         WHEN d.attempt = 0 THEN 'scheduled' ELSE 'retryable' END) = ANY (p_states)
               AND (p_queue IS NULL OR d.queue = p_queue) AND (p_kind IS NULL OR d.kind = p_kind)
               AND d.created_at < p_before
             ORDER BY d.job_id LIMIT p_limit)
            UNION
            (SELECT r.job_id FROM (
                SELECT b.job_ids[i] AS job_id, b.run_leases[i] AS run_lease, b.ready_slots[i] AS ready_slot
                FROM __S__.lease_claim_batches b, generate_subscripts(b.job_ids, 1) i
                WHERE 'running' = ANY (p_states) AND (p_queue IS NULL OR b.queue = p_queue)
                  AND b.job_ids[i] > p_after
                  AND b.receipt_ranges @> (b.batch_id * 4096 + i - 1)
                  AND NOT EXISTS (SELECT 1 FROM __S__.lease_claim_closure_batches c
                                  WHERE c.claim_slot = b.claim_slot
                                    AND c.receipt_ranges @> (b.batch_id * 4096 + i - 1))
                UNION ALL
                SELECT l.job_id, l.run_lease, l.ready_slot FROM __S__.lease_claims l
                WHERE 'running' = ANY (p_states) AND (p_queue IS NULL OR l.queue = p_queue)
                  AND l.job_id > p_after
                  AND NOT EXISTS (SELECT 1 FROM __S__.lease_claim_closures c
                                  WHERE c.claim_slot = l.claim_slot AND c.receipt_id = l.receipt_id)
             ) r
             WHERE EXISTS (SELECT 1 FROM __S__.ready_entries e
                           WHERE e.ready_slot = r.ready_slot AND e.job_id = r.job_id
                             AND e.run_lease = r.run_lease - 1
                             AND (p_kind IS NULL OR e.kind = p_kind) AND e.created_at < p_before)
             ORDER BY r.job_id LIMIT p_limit)
            UNION
            -- workflow steps waiting for their dependencies (workflows.sql)
            (SELECT s.job_id FROM __S__.workflow_steps s
             WHERE 'pending' = ANY (p_states) AND s.job_id > p_after
               AND (p_queue IS NULL OR s.queue = p_queue) AND (p_kind IS NULL OR s.kind = p_kind)
               AND s.created_at < p_before
               AND NOT EXISTS (SELECT 1 FROM __S__.workflow_released r
                               WHERE r.workflow_id = s.workflow_id AND r.step = s.step)
               AND NOT EXISTS (SELECT 1 FROM __S__.workflow_results r
                               WHERE r.workflow_id = s.workflow_id AND r.step = s.step)
             ORDER BY s.job_id LIMIT p_limit)
        ) c
        ORDER BY c.job_id LIMIT p_limit
    LOOP
        looked_at := looked_at + 1;
        last_job_id := v_job;
        v_outcome := __S__.cancel_job(v_job, p_reason);
        IF v_outcome IN ('cancelled', 'cancelled_running') THEN
            cancelled := cancelled + 1;
        END IF;
    END LOOP;
    RETURN NEXT;
END
$$;

-- Retry: scheduled and retryable jobs become due now (promotion moves them to the ring), and
-- dead-lettered jobs run again with fresh attempts (dlq_retry).
CREATE OR REPLACE FUNCTION __S__.bulk_retry(p_queue text, p_kind text, p_states text[], p_before timestamptz,
                                            p_after bigint, p_limit int)
RETURNS TABLE (last_job_id bigint, looked_at int, retried int)
LANGUAGE plpgsql AS $$
DECLARE
    v_job bigint;
    v_dead boolean;
BEGIN
    last_job_id := NULL;
    looked_at := 0;
    retried := 0;
    FOR v_job, v_dead IN
        SELECT c.job_id, c.dead FROM (
            (SELECT d.job_id, false AS dead FROM __S__.deferred_jobs d
             WHERE d.job_id > p_after
               AND (CASE WHEN d.held_key IS NOT NULL THEN 'available'
                         WHEN d.attempt = 0 THEN 'scheduled' ELSE 'retryable' END) = ANY (p_states)
               AND (p_queue IS NULL OR d.queue = p_queue) AND (p_kind IS NULL OR d.kind = p_kind)
               AND d.created_at < p_before
             ORDER BY d.job_id LIMIT p_limit)
            UNION ALL
            (SELECT x.job_id, true FROM __S__.dlq_entries x
             WHERE 'dead_lettered' = ANY (p_states) AND x.job_id > p_after
               AND (p_queue IS NULL OR x.queue = p_queue) AND (p_kind IS NULL OR x.kind = p_kind)
               AND x.failed_at < p_before
             ORDER BY x.job_id LIMIT p_limit)
        ) c
        ORDER BY c.job_id LIMIT p_limit
    LOOP
        looked_at := looked_at + 1;
        last_job_id := v_job;
        IF v_dead THEN
            IF __S__.dlq_retry(v_job) THEN
                retried := retried + 1;
            END IF;
        ELSE
            UPDATE __S__.deferred_jobs d SET run_at = __S__.engine_now()
            WHERE d.job_id = v_job AND d.run_at > __S__.engine_now();
            IF FOUND THEN
                retried := retried + 1;
                PERFORM __S__.wake_promotion();
            END IF;
        END IF;
    END LOOP;
    RETURN NEXT;
END
$$;

-- Delete dead-lettered jobs (dlq_entries, a hold table: row vacuum, off the hot path). Terminal
-- history is not deleted row by row: it lives in ring storage (the queue ring, then the archive's
-- time buckets), reclaimed whole slots and buckets at a time by prune and retention
-- (keep_completed, keep_failed), and a DELETE there would break the no-dead-tuple contract.
CREATE OR REPLACE FUNCTION __S__.bulk_delete(p_queue text, p_kind text, p_states text[], p_before timestamptz,
                                             p_after bigint, p_limit int)
RETURNS TABLE (last_job_id bigint, looked_at int, deleted int)
LANGUAGE sql AS $$
    WITH picked AS (
        SELECT x.job_id FROM __S__.dlq_entries x
        WHERE 'dead_lettered' = ANY (p_states) AND x.job_id > p_after
          AND (p_queue IS NULL OR x.queue = p_queue) AND (p_kind IS NULL OR x.kind = p_kind)
          AND x.failed_at < p_before
        ORDER BY x.job_id LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM __S__.dlq_entries x USING picked p WHERE x.job_id = p.job_id RETURNING x.job_id
    )
    SELECT (SELECT max(p.job_id) FROM picked p), (SELECT count(*)::int FROM picked),
           (SELECT count(*)::int FROM gone)
$$;

-- Retry one job now (the dashboard's button, `Storage::retry_job`): a dead-lettered job runs again
-- with fresh attempts (dlq_retry); a scheduled or retryable job becomes due now. Returns
-- 'retried', or 'not_retryable' when the job is in neither place (it is waiting, running, finished,
-- or unknown). A failed or cancelled job in history is not retried: history is not rewritten.
CREATE OR REPLACE FUNCTION __S__.retry_job(p_job_id bigint) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM __S__.dlq_entries x WHERE x.job_id = p_job_id) THEN
        RETURN CASE WHEN __S__.dlq_retry(p_job_id) THEN 'retried' ELSE 'not_retryable' END;
    END IF;
    -- already due (not yet promoted) counts as retried: it runs at the next promotion
    UPDATE __S__.deferred_jobs d SET run_at = least(d.run_at, __S__.engine_now())
    WHERE d.job_id = p_job_id AND d.held_key IS NULL;
    IF FOUND THEN
        PERFORM __S__.wake_promotion();
        RETURN 'retried';
    END IF;
    RETURN 'not_retryable';
END
$$;
