-- Completion plane (seed ADR-023): the open-claim evidence of an attempt, and batched completion,
-- close and heartbeats, each guarded by (job_id, run_lease) and the attempt's claim slot and receipt.
--
-- Every function of the engine is defined exactly once, in the file of its plane, and installed with
-- CREATE OR REPLACE by src/schema.rs whenever the combined hash of these files changes. A function
-- that is removed is dropped by name in dropped.sql. __S__ is the validated schema name.
--
-- A batch's parallel arrays are unnested in a select list, where they run in step, rather than by a
-- FROM unnest(a, b, ...), which fills and reads a tuplestore per array for every element.

-- ---------------------------------------------------------------------------------------------
-- Open-claim evidence by shape. Compact: a batch item with no covering closure batch. Row-local:
-- a lease_claims row with no lease_claim_closures row. Both lookups name the claim slot.
-- ---------------------------------------------------------------------------------------------
-- The attempts of a batch (a completion, close or heartbeat batch) that are still open, with their
-- evidence's shape and where their job lives. A compact claim batch is looked up once, however many of its attempts the input
-- names: its row, and the closure batches that overlap it (one GiST probe), give its still-open
-- receipts, and each attempt is checked against them in memory. A completion batch of 27 attempts
-- from 3 claim batches costs 3 probes of each kind instead of 27 (and 27 of the row-local kind).
-- Only attempts that are not open compact members probe the row-local evidence (open_attempts), and
-- a completion whose claim slots hold no row-local claim does not ask (complete_batch).
-- The LATERAL subqueries end in LIMIT/OFFSET so that they stay parameterized index probes under
-- the callers' generic plans (a hash join would read every claim batch of the ring).
-- p_first_slot and p_last_slot are the lowest and highest of p_claim_slots, passed as the caller's
-- own variables: the function is inlined, so they reach the executor as parameters it can prune
-- the claim ring's partitions with before it opens them. A probe keyed only by each input row's
-- slot is pruned per row, after every partition and index of the ring was opened; at 400 jobs/s
-- that opening was about a quarter of a completion's time. A batch usually names one slot.
CREATE OR REPLACE FUNCTION __S__.open_compact_attempts(p_claim_slots int[], p_receipt_ids bigint[],
                                                       p_job_ids bigint[], p_run_leases bigint[],
                                                       p_first_slot int, p_last_slot int)
RETURNS TABLE (claim_slot int, receipt_id bigint, job_id bigint, run_lease bigint, shape text, ready_slot int,
               attempt int, max_attempts int, queue text)
LANGUAGE sql STABLE AS $$
    WITH input AS (
        SELECT unnest(p_claim_slots) AS claim_slot, unnest(p_receipt_ids) AS receipt_id,
               unnest(p_job_ids) AS job_id, unnest(p_run_leases) AS run_lease
    ), batches AS MATERIALIZED (
        -- [:] copies each array once, decompressed: a claim batch's row over 2 kB (about 60 jobs) is
        -- stored compressed, and an element read from a compressed array decompresses all of it, so
        -- every attempt looked up in the batch below would decompress its arrays again
        SELECT k.claim_slot, k.batch_id, b.job_ids[:] AS job_ids, b.run_leases[:] AS run_leases,
               b.ready_slots[:] AS ready_slots, b.attempts[:] AS attempts, b.max_attempts[:] AS max_attempts,
               b.queue, b.receipt_ranges - coalesce(x.closed, '{}'::int8multirange) AS open_receipts
        FROM (SELECT DISTINCT i.claim_slot, i.receipt_id / 4096 AS batch_id FROM input i) k
        CROSS JOIN LATERAL (
            SELECT b.* FROM __S__.lease_claim_batches b
            WHERE b.claim_slot = k.claim_slot AND b.batch_id = k.batch_id
              AND b.claim_slot BETWEEN p_first_slot AND p_last_slot
            LIMIT 1
        ) b
        CROSS JOIN LATERAL (
            SELECT range_agg(c.receipt_ranges) AS closed
            FROM __S__.lease_claim_closure_batches c
            WHERE c.claim_slot = k.claim_slot AND c.receipt_ranges && b.receipt_ranges
              AND c.claim_slot BETWEEN p_first_slot AND p_last_slot
        ) x
    )
    SELECT i.claim_slot, i.receipt_id, i.job_id, i.run_lease, 'compact', b.ready_slots[o.i], b.attempts[o.i],
           b.max_attempts[o.i], b.queue
    FROM input i
    JOIN batches b ON b.claim_slot = i.claim_slot AND b.batch_id = i.receipt_id / 4096
    CROSS JOIN LATERAL (SELECT (i.receipt_id - b.batch_id * 4096 + 1)::int AS i) o
    WHERE b.job_ids[o.i] = i.job_id AND b.run_leases[o.i] = i.run_lease AND b.open_receipts @> i.receipt_id
$$;

-- Both shapes: the open compact members, then a row-local probe for each attempt of the input that is
-- not one of them (a compact receipt never has a lease_claims row, so its probe finds nothing).
CREATE OR REPLACE FUNCTION __S__.open_attempts(p_claim_slots int[], p_receipt_ids bigint[], p_job_ids bigint[],
                                               p_run_leases bigint[], p_first_slot int, p_last_slot int)
RETURNS TABLE (claim_slot int, receipt_id bigint, job_id bigint, run_lease bigint, shape text, ready_slot int,
               attempt int, max_attempts int, queue text)
LANGUAGE sql STABLE AS $$
    WITH compact AS MATERIALIZED (
        SELECT * FROM __S__.open_compact_attempts(p_claim_slots, p_receipt_ids, p_job_ids, p_run_leases,
                                                  p_first_slot, p_last_slot)
    )
    SELECT * FROM compact
    UNION ALL
    SELECT i.claim_slot, i.receipt_id, i.job_id, i.run_lease, 'row', l.ready_slot, l.attempt, l.max_attempts, l.queue
    FROM (SELECT unnest(p_claim_slots) AS claim_slot, unnest(p_receipt_ids) AS receipt_id,
                 unnest(p_job_ids) AS job_id, unnest(p_run_leases) AS run_lease) i
    CROSS JOIN LATERAL (
        SELECT l.* FROM __S__.lease_claims l
        WHERE l.claim_slot = i.claim_slot AND l.receipt_id = i.receipt_id
          AND l.job_id = i.job_id AND l.run_lease = i.run_lease
          AND l.claim_slot BETWEEN p_first_slot AND p_last_slot
          AND NOT EXISTS (SELECT 1 FROM __S__.lease_claim_closures c
                          WHERE c.claim_slot = i.claim_slot AND c.receipt_id = i.receipt_id
                            AND c.claim_slot BETWEEN p_first_slot AND p_last_slot)
        OFFSET 0
    ) l
    WHERE NOT EXISTS (SELECT 1 FROM compact c WHERE c.claim_slot = i.claim_slot AND c.receipt_id = i.receipt_id)
$$;

CREATE OR REPLACE FUNCTION __S__.complete_batch(p_claim_slots int[], p_receipt_ids bigint[], p_job_ids bigint[],
                                     p_run_leases bigint[])
RETURNS TABLE (job_id bigint, run_lease bigint, accepted boolean)
-- Sequential scans off: the plans are generic and cached for the session, and one made while a table
-- was nearly empty (workflow_steps, attempt_state) would scan it whole at every completion once large.
-- JIT off: a scan that has no index to use instead (the row-local claims of a slot, ended by its first
-- row) keeps the cost that turns sequential scans off, far above jit_above_cost.
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET jit = off AS $$
DECLARE
    -- the claim slots the batch names, as bounds open_attempts can prune the claim ring with
    v_first_slot int;
    v_last_slot int;
    -- workflow steps among the jobs: their workflows' locks come first (lock order, workflows.sql)
    v_workflows boolean;
    -- row-local claims in those slots: without any, the completion looks for compact members only
    v_row_local boolean;
    -- the batch's lowest and highest job: one probe of that range answers "none of them has a
    -- workflow step" (or a heartbeat row) for a batch of any size, where an = ANY probed once a job
    v_first_job bigint;
    v_last_job bigint;
BEGIN
    -- A completion's fixed cost is counted in statements: the workflow question rides on the first,
    -- asked of the batch's job range, and of its jobs one by one only when some step is in that range.
    SELECT b.first_slot, b.last_slot, b.first_job, b.last_job,
           EXISTS (SELECT 1 FROM __S__.workflow_steps w WHERE w.job_id BETWEEN b.first_job AND b.last_job)
    INTO v_first_slot, v_last_slot, v_first_job, v_last_job, v_workflows
    FROM (SELECT min(s) AS first_slot, max(s) AS last_slot, min(j) AS first_job, max(j) AS last_job
          FROM (SELECT unnest(p_claim_slots) AS s, unnest(p_job_ids) AS j) i) b;
    IF v_workflows THEN
        v_workflows := EXISTS (SELECT 1 FROM __S__.workflow_steps w WHERE w.job_id = ANY (p_job_ids));
    END IF;
    IF v_workflows THEN
        PERFORM __S__.lock_workflows_of(p_job_ids);
    END IF;
    -- The attempt locks, before the statement that decides (its snapshot then sees what a competing
    -- closer committed).
    PERFORM __S__.lock_attempt(j) FROM (SELECT DISTINCT unnest(p_job_ids) AS j ORDER BY 1) t;
    -- Only then a claim-ring table: its lock is held to the transaction's end, and held while this
    -- call waits for an attempt lock it would queue a prune's TRUNCATE of the slot, and every reader
    -- of the slot behind that, on the attempt lock's holder. A row-local claim an input names
    -- committed before this call began (its receipt came from it), so this statement sees it.
    SELECT EXISTS (SELECT 1 FROM __S__.lease_claims l WHERE l.claim_slot BETWEEN v_first_slot AND v_last_slot)
    INTO v_row_local;
    -- The workflow steps among the attempts this call closes below (their locks keep them open
    -- until it does), settled under the workflow locks taken above; each step found by an index
    -- probe of its own (OFFSET 0 keeps the lookup a nested loop: the plan is cached, and a join
    -- planned while workflow_steps was small could read it whole once it is large).
    IF v_workflows AND v_row_local THEN
        PERFORM __S__.workflow_settle_many(array_agg(w.workflow_id ORDER BY w.job_id), array_agg(w.step ORDER BY w.job_id),
                                           array_agg(o.run_lease ORDER BY w.job_id), array_agg('completed'::text))
        FROM __S__.open_attempts(p_claim_slots, p_receipt_ids, p_job_ids, p_run_leases, v_first_slot, v_last_slot) o
        CROSS JOIN LATERAL (SELECT s.workflow_id, s.step, s.job_id FROM __S__.workflow_steps s
                            WHERE s.job_id = o.job_id OFFSET 0) w;
    ELSIF v_workflows THEN
        PERFORM __S__.workflow_settle_many(array_agg(w.workflow_id ORDER BY w.job_id), array_agg(w.step ORDER BY w.job_id),
                                           array_agg(o.run_lease ORDER BY w.job_id), array_agg('completed'::text))
        FROM __S__.open_compact_attempts(p_claim_slots, p_receipt_ids, p_job_ids, p_run_leases, v_first_slot,
                                         v_last_slot) o
        CROSS JOIN LATERAL (SELECT s.workflow_id, s.step, s.job_id FROM __S__.workflow_steps s
                            WHERE s.job_id = o.job_id OFFSET 0) w;
    END IF;
    IF v_row_local THEN
        RETURN QUERY
        WITH input AS (
            SELECT unnest(p_claim_slots) AS claim_slot, unnest(p_receipt_ids) AS receipt_id,
                   unnest(p_job_ids) AS job_id, unnest(p_run_leases) AS run_lease
        ), open AS MATERIALIZED (
            -- DISTINCT: an attempt listed twice must be closed (and counted) once
            SELECT DISTINCT ON (o.claim_slot, o.receipt_id) o.claim_slot, o.receipt_id, o.job_id, o.run_lease,
                   o.shape, o.ready_slot, o.queue
            FROM __S__.open_attempts(p_claim_slots, p_receipt_ids, p_job_ids, p_run_leases, v_first_slot,
                                     v_last_slot) o
        ), closure AS (
            INSERT INTO __S__.lease_claim_closure_batches (claim_slot, batch_id, receipt_ranges, closed_count, outcome)
            SELECT o.claim_slot, nextval('__S__.evidence_batch_ids'),
                   range_agg(int8range(o.receipt_id, o.receipt_id + 1)), count(*), 'completed'
            FROM open o WHERE o.shape = 'compact' GROUP BY o.claim_slot ORDER BY o.claim_slot
            RETURNING 1
        ), row_closure AS (
            INSERT INTO __S__.lease_claim_closures (claim_slot, receipt_id, job_id, run_lease, outcome)
            SELECT o.claim_slot, o.receipt_id, o.job_id, o.run_lease, 'completed'
            FROM open o WHERE o.shape = 'row' ORDER BY o.claim_slot, o.job_id, o.run_lease
            RETURNING 1
        ), history AS (
            INSERT INTO __S__.receipt_completion_batches (ready_slot, batch_id, job_ids, run_leases, completed_count,
                                                          queue)
            SELECT o.ready_slot, nextval('__S__.evidence_batch_ids'), array_agg(o.job_id), array_agg(o.run_lease),
                   count(*), o.queue
            FROM open o GROUP BY o.ready_slot, o.queue
            RETURNING 1
        ), heartbeat AS (
            -- the job is done: its heartbeat row and the progress its earlier attempts left go with it.
            -- Most batches have no such row: the range probe (one-time filter) skips the scan.
            DELETE FROM __S__.attempt_state a
            WHERE EXISTS (SELECT 1 FROM __S__.attempt_state x WHERE x.job_id BETWEEN v_first_job AND v_last_job)
              AND a.job_id = ANY (ARRAY(SELECT o.job_id FROM open o))
            RETURNING 1
        )
        SELECT i.job_id, i.run_lease,
               EXISTS (SELECT 1 FROM open o WHERE o.receipt_id = i.receipt_id AND o.claim_slot = i.claim_slot
                              AND o.job_id = i.job_id AND o.run_lease = i.run_lease)
        FROM input i;
    ELSE
        -- the same statement without the row-local shape: its probes and its closure insert were
        -- about 6 % of the server's instructions for an enqueue, claim and completion of five jobs
        RETURN QUERY
        WITH input AS (
            SELECT unnest(p_claim_slots) AS claim_slot, unnest(p_receipt_ids) AS receipt_id,
                   unnest(p_job_ids) AS job_id, unnest(p_run_leases) AS run_lease
        ), open AS MATERIALIZED (
            SELECT DISTINCT ON (o.claim_slot, o.receipt_id) o.claim_slot, o.receipt_id, o.job_id, o.run_lease,
                   o.ready_slot, o.queue
            FROM __S__.open_compact_attempts(p_claim_slots, p_receipt_ids, p_job_ids, p_run_leases, v_first_slot,
                                             v_last_slot) o
        ), closure AS (
            INSERT INTO __S__.lease_claim_closure_batches (claim_slot, batch_id, receipt_ranges, closed_count, outcome)
            SELECT o.claim_slot, nextval('__S__.evidence_batch_ids'),
                   range_agg(int8range(o.receipt_id, o.receipt_id + 1)), count(*), 'completed'
            FROM open o GROUP BY o.claim_slot ORDER BY o.claim_slot
            RETURNING 1
        ), history AS (
            INSERT INTO __S__.receipt_completion_batches (ready_slot, batch_id, job_ids, run_leases, completed_count,
                                                          queue)
            SELECT o.ready_slot, nextval('__S__.evidence_batch_ids'), array_agg(o.job_id), array_agg(o.run_lease),
                   count(*), o.queue
            FROM open o GROUP BY o.ready_slot, o.queue
            RETURNING 1
        ), heartbeat AS (
            DELETE FROM __S__.attempt_state a
            WHERE EXISTS (SELECT 1 FROM __S__.attempt_state x WHERE x.job_id BETWEEN v_first_job AND v_last_job)
              AND a.job_id = ANY (ARRAY(SELECT o.job_id FROM open o))
            RETURNING 1
        )
        SELECT i.job_id, i.run_lease,
               EXISTS (SELECT 1 FROM open o WHERE o.receipt_id = i.receipt_id AND o.claim_slot = i.claim_slot
                              AND o.job_id = i.job_id AND o.run_lease = i.run_lease)
        FROM input i;
    END IF;
END
$$;

-- Outcomes now also: 'snoozed' (back to deferred_jobs at p_retry_at without using an attempt), and
-- terminal failures of a dead-letter queue go to dlq_entries instead of done_entries.
CREATE OR REPLACE FUNCTION __S__.close_batch(p_claim_slots int[], p_receipt_ids bigint[], p_job_ids bigint[],
                                  p_run_leases bigint[], p_outcomes text[], p_retry_at timestamptz[],
                                  p_errors text[])
RETURNS TABLE (job_id bigint, run_lease bigint, accepted boolean)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    -- the claim slots the batch names, as bounds open_attempts can prune the claim ring with
    v_first_slot int;
    v_last_slot int;
    v_max_error bigint := __S__.setting('max_error_chars');
BEGIN
    SELECT min(s), max(s) INTO v_first_slot, v_last_slot FROM unnest(p_claim_slots) s;
    -- a job that ends here settles its workflow step (the done_entries and dlq_entries triggers of
    -- workflows.sql): its workflow's lock first, before the attempt locks (lock order)
    PERFORM __S__.lock_workflows_of(p_job_ids);
    PERFORM __S__.lock_attempt(j) FROM (SELECT DISTINCT unnest(p_job_ids) AS j ORDER BY 1) t;
    RETURN QUERY
    WITH input AS (
        SELECT i.claim_slot, i.receipt_id, i.job_id, i.run_lease, i.outcome, i.retry_at,
               __S__.bounded_text(i.error, v_max_error) AS error
        FROM (SELECT unnest(p_claim_slots) AS claim_slot, unnest(p_receipt_ids) AS receipt_id,
                     unnest(p_job_ids) AS job_id, unnest(p_run_leases) AS run_lease, unnest(p_outcomes) AS outcome,
                     unnest(p_retry_at) AS retry_at, unnest(p_errors) AS error) i
    ), open AS MATERIALIZED (
        -- DISTINCT: an attempt listed twice must be closed (and counted) once
        SELECT DISTINCT ON (i.claim_slot, i.receipt_id) i.*, o.shape, o.ready_slot, o.attempt, e.queue, e.kind, e.args, e.priority, e.max_attempts,
               e.created_at, e.timeout_ms, e.traceparent,
               CASE WHEN i.outcome = 'cancelled' THEN 'cancelled'
                    WHEN i.outcome = 'snoozed' THEN 'snoozed'
                    WHEN i.outcome <> 'failed' AND i.retry_at IS NOT NULL THEN 'retry'
                    WHEN q.dlq_enabled THEN 'dlq'
                    ELSE 'failed' END AS route
        FROM input i
        JOIN __S__.open_attempts(p_claim_slots, p_receipt_ids, p_job_ids, p_run_leases, v_first_slot, v_last_slot) o
          ON o.claim_slot = i.claim_slot AND o.receipt_id = i.receipt_id AND o.job_id = i.job_id
         AND o.run_lease = i.run_lease
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
                                         run_at, created_at, last_error, timeout_ms, traceparent)
        -- a snooze does not use an attempt: the next claim counts this attempt again
        SELECT o.job_id, o.queue, o.kind, o.args, o.priority,
               CASE WHEN o.route = 'snoozed' THEN o.attempt - 1 ELSE o.attempt END, o.run_lease, o.max_attempts,
               o.retry_at, o.created_at, o.error, o.timeout_ms, o.traceparent
        FROM open o WHERE o.route IN ('retry', 'snoozed')
        RETURNING 1
    ), dead_lettered AS (
        INSERT INTO __S__.dlq_entries (job_id, queue, kind, args, priority, attempt, run_lease, max_attempts,
                                       error, created_at, timeout_ms, traceparent)
        SELECT o.job_id, o.queue, o.kind, o.args, o.priority, o.attempt, o.run_lease, o.max_attempts,
               o.error, o.created_at, o.timeout_ms, o.traceparent
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
        -- A job that runs again (retry, snooze, rescue) keeps the last progress an attempt recorded,
        -- for the next attempt to resume from; a job that ends takes all of its rows with it. So the
        -- table holds at most one kept row per pending job plus one per running long attempt.
        DELETE FROM __S__.attempt_state a USING open o
        WHERE a.job_id = o.job_id
          AND (o.route NOT IN ('retry', 'snoozed')
               OR (a.run_lease = o.run_lease AND a.progress IS NULL AND a.callback IS NULL))
        RETURNING 1
    )
    SELECT i.job_id, i.run_lease,
           EXISTS (SELECT 1 FROM open o WHERE o.receipt_id = i.receipt_id AND o.claim_slot = i.claim_slot
                          AND o.job_id = i.job_id AND o.run_lease = i.run_lease)
    FROM input i;
    -- a retry or a snooze is due later, and the maintenance leader may sleep past it unless told
    IF EXISTS (SELECT 1 FROM __S__.deferred_jobs d WHERE d.job_id = ANY (p_job_ids)) THEN
        PERFORM __S__.wake_promotion();
    END IF;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- Heartbeats (long jobs only): upsert attempt_state while the attempt is open, under the same
-- per-attempt lock as completion and rescue, so a heartbeat never recreates a closed attempt's row.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION __S__.heartbeat_batch(p_claim_slots int[], p_receipt_ids bigint[], p_job_ids bigint[],
                                      p_run_leases bigint[], p_progress jsonb[])
RETURNS TABLE (job_id bigint, run_lease bigint, accepted boolean)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    -- the claim slots the batch names, as bounds open_attempts can prune the claim ring with
    v_first_slot int;
    v_last_slot int;
BEGIN
    SELECT min(s), max(s) INTO v_first_slot, v_last_slot FROM unnest(p_claim_slots) s;
    PERFORM __S__.lock_attempt(j) FROM (SELECT DISTINCT unnest(p_job_ids) AS j ORDER BY 1) t;
    RETURN QUERY
    WITH input AS (
        SELECT unnest(p_claim_slots) AS claim_slot, unnest(p_receipt_ids) AS receipt_id,
               unnest(p_job_ids) AS job_id, unnest(p_run_leases) AS run_lease, unnest(p_progress) AS progress
    ), open AS MATERIALIZED (
        SELECT DISTINCT ON (i.job_id, i.run_lease) i.* FROM input i
        JOIN __S__.open_attempts(p_claim_slots, p_receipt_ids, p_job_ids, p_run_leases, v_first_slot, v_last_slot) o
          ON o.claim_slot = i.claim_slot AND o.receipt_id = i.receipt_id AND o.job_id = i.job_id
         AND o.run_lease = i.run_lease
    ), upsert AS (
        INSERT INTO __S__.attempt_state AS a (job_id, run_lease, heartbeat_at, progress)
        SELECT o.job_id, o.run_lease, __S__.engine_now(), o.progress FROM open o
        ON CONFLICT ON CONSTRAINT attempt_state_pkey DO UPDATE
            SET heartbeat_at = excluded.heartbeat_at, progress = coalesce(excluded.progress, a.progress)
        RETURNING 1
    ), superseded AS (
        -- new progress replaces what an earlier attempt of the job left
        DELETE FROM __S__.attempt_state a USING open o
        WHERE o.progress IS NOT NULL AND a.job_id = o.job_id AND a.run_lease < o.run_lease
          -- a resume's payload stays for every later attempt (callbacks.sql, callback_payload)
          AND a.callback IS NULL
        RETURNING 1
    )
    SELECT i.job_id, i.run_lease,
           EXISTS (SELECT 1 FROM open o WHERE o.job_id = i.job_id AND o.run_lease = i.run_lease
                                            AND o.claim_slot = i.claim_slot AND o.receipt_id = i.receipt_id)
    FROM input i;
END
$$;
