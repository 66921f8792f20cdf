-- ringwork schema version 5: snooze (no attempt used) and the dead-letter queue.

-- Per-queue opt-in, set from QueueConfig.dead_letter when a client starts (or by an operator).
ALTER TABLE __S__.queues ADD COLUMN dlq_enabled boolean NOT NULL DEFAULT false;

-- Operator hold table (backlog/hold class: row vacuum, off the hot path).
CREATE TABLE __S__.dlq_entries (
    job_id       bigint PRIMARY KEY,
    queue        text NOT NULL,
    kind         text NOT NULL,
    args         jsonb NOT NULL,
    priority     smallint NOT NULL,
    attempt      int NOT NULL,
    run_lease    bigint NOT NULL,
    max_attempts int NOT NULL,
    error        text,
    created_at   timestamptz NOT NULL,
    failed_at    timestamptz NOT NULL DEFAULT now(),
    timeout_ms   int
);
CREATE INDEX dlq_entries_queue_failed ON __S__.dlq_entries (queue, failed_at);
CREATE INDEX dlq_entries_failed ON __S__.dlq_entries (failed_at);

CREATE FUNCTION __S__.set_queue_dead_letter(p_queue text, p_enabled boolean) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM __S__.ensure_lane(p_queue, 2::smallint);
    UPDATE __S__.queues SET dlq_enabled = p_enabled WHERE queue = p_queue AND dlq_enabled IS DISTINCT FROM p_enabled;
    RETURN FOUND;
END
$$;

-- Outcomes now also: 'snoozed' (back to deferred_jobs at p_retry_at without using an attempt), and
-- terminal failures of a dead-letter queue go to dlq_entries instead of done_entries.
CREATE OR REPLACE FUNCTION __S__.close_batch(p_claim_slots int[], p_receipt_ids bigint[], p_job_ids bigint[],
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
               CASE WHEN i.outcome = 'cancelled' THEN 'cancelled'
                    WHEN i.outcome = 'snoozed' THEN 'snoozed'
                    WHEN i.outcome <> 'failed' AND i.retry_at IS NOT NULL THEN 'retry'
                    WHEN q.dlq_enabled THEN 'dlq'
                    ELSE 'failed' END AS route
        FROM input i
        CROSS JOIN LATERAL __S__.open_claim(i.claim_slot, i.receipt_id, i.job_id, i.run_lease) o
        JOIN __S__.ready_entries e
          ON e.ready_slot = o.ready_slot AND e.job_id = i.job_id AND e.run_lease = i.run_lease - 1
        JOIN __S__.queues q ON q.queue = e.queue
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
        -- a snooze does not use an attempt: the next claim counts this attempt again
        SELECT o.job_id, o.queue, o.kind, o.args, o.priority,
               CASE WHEN o.route = 'snoozed' THEN o.attempt - 1 ELSE o.attempt END, o.run_lease, o.max_attempts,
               o.retry_at, o.created_at, o.error, o.timeout_ms
        FROM open o WHERE o.route IN ('retry', 'snoozed')
        RETURNING 1
    ), dead_lettered AS (
        INSERT INTO __S__.dlq_entries (job_id, queue, kind, args, priority, attempt, run_lease, max_attempts,
                                       error, created_at, timeout_ms)
        SELECT o.job_id, o.queue, o.kind, o.args, o.priority, o.attempt, o.run_lease, o.max_attempts,
               o.error, o.created_at, o.timeout_ms
        FROM open o WHERE o.route = 'dlq'
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


-- Retry a dead-lettered job: it leaves the DLQ (DELETE ... RETURNING: of two concurrent retries
-- exactly one gets the row) and is scheduled now with fresh attempts and its run_lease kept, so
-- the next claim's run_lease is higher than any before it.
CREATE FUNCTION __S__.dlq_retry(p_job_id bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v __S__.dlq_entries;
BEGIN
    DELETE FROM __S__.dlq_entries WHERE job_id = p_job_id RETURNING * INTO v;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO __S__.deferred_jobs (job_id, queue, kind, args, priority, attempt, run_lease, max_attempts,
                                     run_at, created_at, last_error, timeout_ms)
    VALUES (v.job_id, v.queue, v.kind, v.args, v.priority, 0, v.run_lease, v.max_attempts, now(),
            v.created_at, v.error, v.timeout_ms);
    RETURN true;
END
$$;

-- Retention: delete DLQ rows older than p_keep, at most p_limit per call.
CREATE FUNCTION __S__.dlq_expire(p_keep interval, p_limit int) RETURNS int
LANGUAGE sql AS $$
    WITH gone AS (
        DELETE FROM __S__.dlq_entries WHERE job_id IN (
            SELECT job_id FROM __S__.dlq_entries WHERE failed_at < now() - p_keep
            ORDER BY failed_at LIMIT p_limit FOR UPDATE SKIP LOCKED)
        RETURNING 1
    )
    SELECT count(*)::int FROM gone
$$;

-- job_state learns about the DLQ.
CREATE OR REPLACE FUNCTION __S__.job_state(p_job_id bigint)
RETURNS TABLE (state text, queue text, kind text, attempt int, run_lease bigint, detail text)
LANGUAGE sql STABLE AS $$
    WITH ready AS (
        SELECT e.* FROM __S__.ready_entries e WHERE e.job_id = p_job_id ORDER BY e.run_lease DESC LIMIT 1
    )
    SELECT s.state, s.queue, s.kind, s.attempt, s.run_lease, s.detail FROM (
        SELECT 'dead_lettered' AS state, d.queue, d.kind, d.attempt, d.run_lease, d.error AS detail, 0 AS rank
        FROM __S__.dlq_entries d WHERE d.job_id = p_job_id
        UNION ALL
        SELECT d.state, d.queue, d.kind, d.attempt, d.run_lease, d.error, 1
        FROM __S__.done_entries d WHERE d.job_id = p_job_id
          AND NOT EXISTS (SELECT 1 FROM __S__.deferred_jobs x WHERE x.job_id = p_job_id AND x.run_lease > d.run_lease)
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
