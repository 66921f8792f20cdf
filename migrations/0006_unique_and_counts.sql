-- ringwork schema version 6: unique jobs, exact per-queue counts, the terminal_jobs view.

-- ---------------------------------------------------------------------------------------------
-- Unique jobs. A unique insert names its key (kind + canonical args [+ queue] [+ period bucket],
-- built by the client) and the job states that count as "already there". The key table maps the
-- key's SHA-256 to the job that last took it. It is a backlog-class table: only unique inserts
-- write it (one INSERT, or one UPDATE when a released key is taken again) and maintenance expires
-- old keys in bounded batches; no ring table is touched beyond a normal insert.
--
-- Concurrency: every inserter of one key takes the same transaction-level advisory lock before it
-- looks, so a second inserter waits until the first commits or rolls back, then (in a new
-- statement, hence a new READ COMMITTED snapshot) sees its key row and returns that job's id.
-- ---------------------------------------------------------------------------------------------
CREATE TABLE __S__.unique_keys (
    unique_key bytea PRIMARY KEY,
    job_id     bigint NOT NULL,
    queue      text NOT NULL,
    kind       text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX unique_keys_job ON __S__.unique_keys (job_id);
CREATE INDEX unique_keys_created ON __S__.unique_keys (created_at);

CREATE FUNCTION __S__.unique_key_hash(p_key text) RETURNS bytea
LANGUAGE sql IMMUTABLE AS $$ SELECT sha256(convert_to(p_key, 'UTF8')) $$;

CREATE FUNCTION __S__.insert_unique(p_key text, p_states text[], p_queue text, p_priority smallint,
                                    p_kind text, p_args jsonb, p_max_attempts int, p_run_at timestamptz,
                                    p_timeout_ms int, OUT o_job_id bigint, OUT o_inserted boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_hash bytea := __S__.unique_key_hash(p_key);
    v_existing bigint;
    v_state text;
BEGIN
    PERFORM pg_advisory_xact_lock(__S__.lock_ns('unique'), hashtext(p_key));
    SELECT k.job_id INTO v_existing FROM __S__.unique_keys k WHERE k.unique_key = v_hash;
    IF FOUND THEN
        SELECT s.state INTO v_state FROM __S__.job_state(v_existing) s;
        IF v_state = ANY (p_states) THEN
            o_job_id := v_existing;
            o_inserted := false;
            RETURN;
        END IF;
    END IF;
    IF p_run_at IS NOT NULL AND p_run_at > now() THEN
        SELECT j INTO o_job_id
        FROM __S__.schedule_jobs(p_queue, p_priority, ARRAY[p_kind], ARRAY[p_args], ARRAY[p_max_attempts],
                                 ARRAY[p_run_at], ARRAY[p_timeout_ms]) j;
    ELSE
        SELECT j INTO o_job_id
        FROM __S__.enqueue_jobs(p_queue, p_priority, ARRAY[p_kind], ARRAY[p_args], ARRAY[p_max_attempts],
                                ARRAY[p_timeout_ms]) j;
    END IF;
    INSERT INTO __S__.unique_keys AS k (unique_key, job_id, queue, kind)
    VALUES (v_hash, o_job_id, p_queue, p_kind)
    ON CONFLICT (unique_key) DO UPDATE
        SET job_id = EXCLUDED.job_id, queue = EXCLUDED.queue, kind = EXCLUDED.kind, created_at = now();
    o_inserted := true;
END
$$;

-- The job that last took a key, if any (cancel by unique key).
CREATE FUNCTION __S__.unique_job(p_key text) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT k.job_id FROM __S__.unique_keys k WHERE k.unique_key = __S__.unique_key_hash(p_key)
$$;

-- Forget keys older than p_older whose job is no longer pending (or whose history is gone), at most
-- p_limit per call. A pending job's key is kept however old it is. The outer conditions repeat the
-- key's age and holder: if insert_unique re-takes the key while this DELETE waits for its row, the
-- row is re-checked against them (not against the subquery) and survives.
CREATE FUNCTION __S__.unique_keys_expire(p_older interval, p_limit int) RETURNS int
LANGUAGE sql AS $$
    WITH candidates AS MATERIALIZED (
        SELECT c.unique_key, c.job_id FROM __S__.unique_keys c
        WHERE c.created_at < now() - p_older
          AND coalesce((SELECT s.state FROM __S__.job_state(c.job_id) s), 'gone')
              NOT IN ('available', 'running', 'scheduled', 'retryable')
        ORDER BY c.created_at
        LIMIT p_limit
    ), gone AS (
        DELETE FROM __S__.unique_keys k USING candidates x
        WHERE k.unique_key = x.unique_key AND k.job_id = x.job_id AND k.created_at < now() - p_older
        RETURNING 1)
    SELECT count(*)::int FROM gone
$$;

-- ---------------------------------------------------------------------------------------------
-- Completion history per queue: a completion batch can span queues, so the history row is written
-- per (ready_slot, queue). Counting completions is then a sum over history rows, not over jobs.
-- ---------------------------------------------------------------------------------------------
ALTER TABLE __S__.receipt_completion_batches ADD COLUMN queue text;
CREATE INDEX ON __S__.receipt_completion_batches (queue);
CREATE INDEX ON __S__.done_entries (queue, state);
CREATE INDEX deferred_jobs_queue ON __S__.deferred_jobs (queue, attempt);

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
        SELECT DISTINCT ON (i.claim_slot, i.receipt_id) i.*, o.shape, o.ready_slot, o.queue
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
        INSERT INTO __S__.receipt_completion_batches (ready_slot, batch_id, job_ids, run_leases, completed_count, queue)
        SELECT o.ready_slot, nextval('__S__.evidence_batch_ids'), array_agg(o.job_id), array_agg(o.run_lease),
               count(*), o.queue
        FROM open o GROUP BY o.ready_slot, o.queue
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
-- Exact counts. Available jobs of a lane are the committed segment positions above the lane's claim
-- cursor, less tombstoned rows above it: a sum over ready_segments (one row per enqueue call, not
-- per job) and tombstones, never a scan of ready_entries. Running is the in-flight anti-join over
-- the active claim slots; scheduled/retryable and dlq count their backlog tables through an index;
-- completed/failed/cancelled count the terminal history still held by the queue ring (the retention
-- the ring and keep_failed give it).
-- ---------------------------------------------------------------------------------------------
CREATE FUNCTION __S__.lane_available(p_lane_id int) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
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

CREATE FUNCTION __S__.queue_counts(p_queue text DEFAULT NULL)
RETURNS TABLE (queue text, paused boolean, available bigint, scheduled bigint, retryable bigint, running bigint,
               completed bigint, failed bigint, cancelled bigint, dead_lettered bigint)
LANGUAGE sql STABLE AS $$
    SELECT q.queue, q.paused,
           (SELECT coalesce(sum(__S__.lane_available(l.lane_id)), 0)::bigint
            FROM __S__.queue_lanes l WHERE l.queue = q.queue),
           (SELECT count(*) FROM __S__.deferred_jobs d WHERE d.queue = q.queue AND d.attempt = 0),
           (SELECT count(*) FROM __S__.deferred_jobs d WHERE d.queue = q.queue AND d.attempt > 0),
           __S__.count_in_flight(q.queue)::bigint,
           (SELECT coalesce(sum(b.completed_count), 0)::bigint
            FROM __S__.receipt_completion_batches b WHERE b.queue = q.queue)
           + (SELECT count(*) FROM __S__.done_entries d WHERE d.queue = q.queue AND d.state = 'completed'),
           (SELECT count(*) FROM __S__.done_entries d WHERE d.queue = q.queue AND d.state = 'failed'),
           (SELECT count(*) FROM __S__.done_entries d WHERE d.queue = q.queue AND d.state = 'cancelled'),
           (SELECT count(*) FROM __S__.dlq_entries d WHERE d.queue = q.queue)
    FROM __S__.queues q
    WHERE p_queue IS NULL OR q.queue = p_queue
    ORDER BY q.queue
$$;

-- ---------------------------------------------------------------------------------------------
-- Terminal history as one relation: explicit terminal rows (failed, cancelled) and compact
-- successes expanded from their completion batches, with the job's record from its ready row
-- (same queue-ring slot, so both live and are pruned together).
-- ---------------------------------------------------------------------------------------------
CREATE VIEW __S__.terminal_jobs AS
    SELECT d.job_id, d.run_lease, d.queue, d.kind, d.args, d.priority, d.attempt, d.max_attempts,
           d.state, d.error, d.created_at, d.finalized_at
    FROM __S__.done_entries d
    UNION ALL
    SELECT c.job_id, c.run_lease, e.queue, e.kind, e.args, e.priority, e.attempt + 1, e.max_attempts,
           'completed', NULL, e.created_at, b.finalized_at
    FROM __S__.receipt_completion_batches b
    CROSS JOIN LATERAL unnest(b.job_ids, b.run_leases) AS c(job_id, run_lease)
    LEFT JOIN LATERAL (SELECT r.* FROM __S__.ready_entries r
                       WHERE r.ready_slot = b.ready_slot AND r.job_id = c.job_id AND r.run_lease = c.run_lease - 1
                       LIMIT 1) e ON true;

-- One job's recorded history, oldest attempt first: its terminal rows (completed, failed,
-- cancelled), earlier failed attempts carried in deferred_jobs.last_error, and a dead-letter entry.
CREATE FUNCTION __S__.job_history(p_job_id bigint)
RETURNS TABLE (run_lease bigint, state text, error text, at timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT h.run_lease, h.state, h.error, h.at FROM (
        SELECT t.run_lease, t.state, t.error, t.finalized_at AS at
        FROM __S__.terminal_jobs t WHERE t.job_id = p_job_id
        UNION ALL
        SELECT d.run_lease, CASE WHEN d.attempt = 0 THEN 'scheduled' ELSE 'retryable' END, d.last_error, d.run_at
        FROM __S__.deferred_jobs d WHERE d.job_id = p_job_id
        UNION ALL
        SELECT x.run_lease, 'dead_lettered', x.error, x.failed_at
        FROM __S__.dlq_entries x WHERE x.job_id = p_job_id
    ) h
    ORDER BY h.run_lease, h.at
$$;
