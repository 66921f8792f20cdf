-- Workflows (migration 0021): steps wait in workflow_steps until every step they depend on is final,
-- then go to the queue ring as ordinary jobs, with the job id they were given when added.
--
-- A step's final state is recorded where the job's is: completion (complete_batch calls
-- workflow_settle_many), failure and cancellation (the triggers on done_entries and dlq_entries below, so
-- that every path that ends a job, rescue and operator cancels included, settles its step). Each
-- settlement appends evidence (workflow_results, workflow_arrivals) under the workflow's advisory
-- lock; the arrival whose number equals a dependent's dependency count releases it, once.
--
-- Lock order: sequence keys' locks, then workflows' (several in id order), then attempt locks.
-- complete_batch, close_batch, cancel_job, resolve_callback and dlq_retry take the workflow locks of
-- their jobs first (lock_workflows_of), and rescue tries them first, so cancel_workflow, which holds
-- the workflow lock while it cancels the running steps, never waits in a cycle with a completion.
--
-- JIT is off in this plane's functions: their statements over a call's JSON steps are estimated
-- far above jit_above_cost, and compiling them took ten times longer than running them. So are
-- hash aggregates where steps are written (enqueue_workflows, workflow_write_steps): a nested JSON
-- array is estimated at 10,000 elements and more, and a hashed DISTINCT or GROUP BY allocated its
-- table for that many at every call (two of them were 40 % of a small call's instructions); a sort
-- of what is really there costs little. The setting reaches the functions they call, whose cached
-- plans keep whichever choice their first planning made. A
-- workflow's tables grow by thousands of rows in seconds, and a plan cached while they were small
-- scanned them whole for every step (a fan-in's completion batches slowed from 60 ms to 900 ms as
-- its arrivals grew). So a function either plans every statement for its arguments
-- (force_custom_plan) or, on the paths every step takes (settle, release), keeps its plans with
-- sequential scans, hash and merge joins off: each lookup is then an index probe of its own
-- workflow (docs/storage.md, "Plans").
--
-- Every function of the engine is defined exactly once, in the file of its plane, and installed with
-- CREATE OR REPLACE by src/schema.rs whenever the combined hash of these files changes. A function
-- that is removed is dropped by name in dropped.sql. __S__ is the validated schema name.

CREATE OR REPLACE FUNCTION __S__.lock_workflow(p_workflow_id bigint) RETURNS void
LANGUAGE sql AS $$
    SELECT pg_advisory_xact_lock(__S__.lock_ns('workflow'), (p_workflow_id % 2147483647)::int)
$$;

-- Lock the workflows these jobs are steps of, in one order. One index probe per job: with no
-- workflows this is the whole cost the feature adds to a completion batch. Sequential scans off:
-- its plan is cached for the session (a completion's plans are generic), and one made while
-- workflow_steps was nearly empty scanned the table whole at every completion once it was large.
CREATE OR REPLACE FUNCTION __S__.lock_workflows_of(p_job_ids bigint[]) RETURNS boolean
LANGUAGE plpgsql SET enable_seqscan = off AS $$
BEGIN
    -- one statement, the locks taken in the subquery's order (a statement per workflow, as a loop
    -- of PERFORMs made it, cost a completion batch of a thousand sequence keys a thousand)
    PERFORM __S__.lock_workflow(w.workflow_id)
    FROM (SELECT DISTINCT s.workflow_id FROM __S__.workflow_steps s WHERE s.job_id = ANY (p_job_ids) ORDER BY 1) w;
    RETURN FOUND;
END
$$;

-- What one final dependency means for one dependent: 'arrived' (an edge satisfied), 'cancel' (the
-- dependent is cancelled), or 'wait' (held until the dependency is retried and completes). A held
-- step waits only for a dead-lettered dependency, the one an operator can retry: one that failed
-- in a queue without a dead-letter queue, or was cancelled, can never complete, so it cancels.
CREATE OR REPLACE FUNCTION __S__.workflow_edge_effect(p_outcome text, p_policy text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_outcome = 'completed' OR p_policy = 'run' THEN 'arrived'
                WHEN p_policy = 'hold' AND p_outcome = 'dead_lettered' THEN 'wait'
                ELSE 'cancel' END
$$;

-- Append the arrival of p_depends_on at p_step (the caller holds the workflow lock); true when it is
-- the last of p_dependencies. An edge arrives once: a dependency that fails (policy 'run') and later
-- completes after a retry is counted once.
CREATE OR REPLACE FUNCTION __S__.workflow_arrive(p_workflow_id bigint, p_step text, p_depends_on text,
                                                 p_dependencies int) RETURNS boolean
LANGUAGE plpgsql SET jit = off SET plan_cache_mode = force_custom_plan AS $$
DECLARE
    v_seen int;
BEGIN
    INSERT INTO __S__.workflow_arrivals (workflow_id, step, seen, depends_on)
    SELECT p_workflow_id, p_step, coalesce(max(a.seen), 0) + 1, p_depends_on
    FROM __S__.workflow_arrivals a WHERE a.workflow_id = p_workflow_id AND a.step = p_step
    ON CONFLICT (workflow_id, step, depends_on) DO NOTHING
    RETURNING seen INTO v_seen;
    RETURN v_seen IS NOT NULL AND v_seen = p_dependencies;
END
$$;

-- Move these steps (p_steps[i] of workflow p_workflow_ids[i]) to the queue ring, one segment per
-- (queue, priority) whatever their workflows, in step job id order (the order they were added).
-- The caller holds the workflows' locks (or created the workflows in this transaction, where no
-- one else can see them) and has checked that each is due and not yet released.
-- Its plans are cached for the session (planning them at every call was about a fifth of a small
-- workflow's insert), and each step is found by an index probe of its own (a lateral lookup, with
-- sequential scans off): a plan cached while workflow_steps was small can then never scan it whole
-- once it is large.
CREATE OR REPLACE FUNCTION __S__.workflow_release_many(p_workflow_ids bigint[], p_steps text[]) RETURNS void
LANGUAGE plpgsql SET jit = off SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $$
DECLARE
    -- the engine's clock, read once: per row it was a function call each (clock.sql)
    v_now timestamptz := __S__.engine_now();
    v_group record;
    v_seg record;
BEGIN
    IF coalesce(cardinality(p_steps), 0) = 0 THEN
        RETURN;
    END IF;
    FOR v_group IN SELECT s.queue, s.priority, array_agg(s.job_id ORDER BY s.job_id) AS job_ids
                   FROM unnest(p_workflow_ids, p_steps) AS r(workflow_id, step)
                   CROSS JOIN LATERAL (SELECT s.queue, s.priority, s.job_id FROM __S__.workflow_steps s
                                       WHERE s.workflow_id = r.workflow_id AND s.step = r.step) s
                   GROUP BY s.queue, s.priority ORDER BY s.queue, s.priority LOOP
        SELECT * INTO v_seg FROM __S__.enqueue_segment(v_group.queue, v_group.priority,
                                                       cardinality(v_group.job_ids));
        INSERT INTO __S__.ready_entries (ready_slot, lane_id, lane_pos, job_id, queue, kind, args, priority,
                                         attempt, run_lease, max_attempts, created_at, timeout_ms, traceparent)
        SELECT v_seg.ready_slot, v_seg.lane_id, v_seg.base_pos + o.n - 1, s.job_id, s.queue, s.kind, s.args,
               s.priority, 0, 0, s.max_attempts, s.created_at, s.timeout_ms, s.traceparent
        FROM unnest(v_group.job_ids) WITH ORDINALITY o(job_id, n)
        CROSS JOIN LATERAL (SELECT s.* FROM __S__.workflow_steps s WHERE s.job_id = o.job_id) s;
    END LOOP;
    INSERT INTO __S__.workflow_released (workflow_id, step, released_at)
    SELECT r.workflow_id, r.step, v_now FROM unnest(p_workflow_ids, p_steps) AS r(workflow_id, step);
END
$$;

-- workflow_release_many for steps of one workflow.
CREATE OR REPLACE FUNCTION __S__.workflow_release(p_workflow_id bigint, p_steps text[]) RETURNS void
LANGUAGE sql AS $$
    SELECT __S__.workflow_release_many(array_fill(p_workflow_id, ARRAY[coalesce(cardinality(p_steps), 0)]), p_steps)
$$;

-- Record that these steps (p_steps[i] of workflow p_workflow_ids[i]) are final (outcomes
-- completed, failed, cancelled, dead_lettered; a step cancelled before its release has run lease 0),
-- and follow every consequence: arrivals at their dependents, dependents cancelled in turn (policy
-- 'cancel'), dependents released. The caller holds the workflows' locks. A step already recorded at
-- that run lease is skipped, so a repeat is harmless. Set-based over all the workflows at once, a
-- round per level of cancellations: a completion batch of a thousand steps, of one fan-in or of a
-- thousand sequences, is a handful of statements and one segment per queue.
CREATE OR REPLACE FUNCTION __S__.workflow_settle_many(p_workflow_ids bigint[], p_steps text[], p_run_leases bigint[],
                                                      p_outcomes text[]) RETURNS void
LANGUAGE plpgsql SET jit = off SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off AS $$
DECLARE
    -- the engine's clock, read once (as in workflow_release_many)
    v_now timestamptz := __S__.engine_now();
    v_workflows bigint[] := p_workflow_ids;
    v_steps text[] := p_steps;
    v_leases bigint[] := p_run_leases;
    v_outcomes text[] := p_outcomes;
    v_settled_workflows bigint[];
    v_settled text[];
    v_settled_outcomes text[];
    v_settled_leases bigint[];
    v_defer_workflows bigint[];
    v_defer_steps text[];
    v_defer_from text[];
    v_next_workflows bigint[];
    v_next_steps text[];
    v_release_workflows bigint[] := '{}';
    v_release text[] := '{}';
BEGIN
    WHILE coalesce(cardinality(v_steps), 0) > 0 LOOP
        -- the results, and which of them are new. The new ones come from RETURNING alone: joined
        -- back to the input (two CTEs, with hash and merge joins off) they were a nested loop of
        -- every row by every row, 30 ms for a batch of 512 completions under the workflow's lock.
        WITH input AS (
            SELECT DISTINCT ON (i.workflow_id, i.step, i.run_lease) i.workflow_id, i.step, i.run_lease, i.outcome
            FROM unnest(v_workflows, v_steps, v_leases, v_outcomes) WITH ORDINALITY
                 AS i(workflow_id, step, run_lease, outcome, n)
            ORDER BY i.workflow_id, i.step, i.run_lease, i.n
        ), added AS (
            INSERT INTO __S__.workflow_results (workflow_id, step, run_lease, outcome, finished_at)
            SELECT i.workflow_id, i.step, i.run_lease,
                   CASE WHEN i.outcome = 'dead_lettered' THEN 'failed' ELSE i.outcome END, v_now
            FROM input i
            ON CONFLICT DO NOTHING
            RETURNING workflow_id, step, run_lease, outcome
        )
        SELECT array_agg(a.workflow_id), array_agg(a.step), array_agg(a.outcome), array_agg(a.run_lease)
        INTO v_settled_workflows, v_settled, v_settled_outcomes, v_settled_leases
        FROM added a;
        EXIT WHEN v_settled IS NULL;
        IF 'dead_lettered' = ANY (v_outcomes) AND 'failed' <> ALL (v_outcomes) THEN
            -- a result stores a dead letter as failed; a held dependent tells them apart. With no
            -- plain failure in the input (the dead-letter trigger's calls) every new failed result
            -- is a dead letter
            v_settled_outcomes := array_replace(v_settled_outcomes, 'failed', 'dead_lettered');
        ELSIF 'dead_lettered' = ANY (v_outcomes) THEN
            -- both kinds in one call (no caller sends that today): each new failed result asks its
            -- input (its first occurrence, as above), a read of the input per result
            SELECT array_agg(CASE WHEN x.outcome = 'failed'
                                       AND (SELECT i.outcome
                                            FROM unnest(v_workflows, v_steps, v_leases, v_outcomes) WITH ORDINALITY
                                                 AS i(workflow_id, step, run_lease, outcome, n)
                                            WHERE i.workflow_id = x.workflow_id AND i.step = x.step
                                              AND i.run_lease = x.run_lease
                                            ORDER BY i.n LIMIT 1) = 'dead_lettered'
                                  THEN 'dead_lettered' ELSE x.outcome END ORDER BY x.n)
            INTO v_settled_outcomes
            FROM unnest(v_settled_workflows, v_settled, v_settled_outcomes, v_settled_leases) WITH ORDINALITY
                 AS x(workflow_id, step, outcome, run_lease, n);
        END IF;
        -- what each new result does to each dependent still waiting
        WITH effects AS (
            SELECT DISTINCT ON (e.workflow_id, e.step, e.depends_on) e.workflow_id, e.step, e.depends_on,
                   d.dependencies, d.on_dependency_failure AS policy,
                   -- a sequence job cancelled while it waited is skipped, not a turn: the job behind
                   -- it (continuing on failure) waits for what it waited for instead
                   CASE WHEN x.outcome = 'cancelled' AND x.run_lease = 0 AND d.on_dependency_failure = 'run'
                             AND EXISTS (SELECT 1 FROM __S__.workflow_sequences q WHERE q.workflow_id = e.workflow_id)
                             AND EXISTS (SELECT 1 FROM __S__.workflow_edges p
                                         WHERE p.workflow_id = e.workflow_id AND p.step = x.step
                                           AND NOT EXISTS (SELECT 1 FROM __S__.workflow_results r
                                                           WHERE r.workflow_id = p.workflow_id AND r.step = p.depends_on))
                        THEN 'defer'
                        ELSE __S__.workflow_edge_effect(x.outcome, d.on_dependency_failure) END AS effect
            FROM unnest(v_settled_workflows, v_settled, v_settled_outcomes, v_settled_leases)
                 AS x(workflow_id, step, outcome, run_lease)
            JOIN __S__.workflow_edges e ON e.workflow_id = x.workflow_id AND e.depends_on = x.step
            JOIN __S__.workflow_steps d ON d.workflow_id = e.workflow_id AND d.step = e.step
            WHERE NOT EXISTS (SELECT 1 FROM __S__.workflow_released r WHERE r.workflow_id = e.workflow_id AND r.step = e.step)
              AND NOT EXISTS (SELECT 1 FROM __S__.workflow_results r WHERE r.workflow_id = e.workflow_id AND r.step = e.step)
            ORDER BY e.workflow_id, e.step, e.depends_on,
                     -- a completion and a failure of one dependency in one call: the completion counts
                     CASE WHEN x.outcome = 'completed' THEN 0 ELSE 1 END
        ), counted AS (
            -- the edges that arrive now at dependents of several dependencies, numbered after the
            -- dependent's earlier arrivals. Under policy 'run' every end of a dependency arrives,
            -- so each edge has a row of its own and arrives once; under 'cancel' and 'hold' an
            -- edge can arrive only once (any other end of the dependency cancels or holds the
            -- dependent, and a completion is final), so a dependent's edges arriving in one call
            -- are one row, numbered by their count: a fan-in's completion batch of 500 children
            -- writes one arrival, not 500. A dependent of one dependency needs no count: its first
            -- arrival is its last, and it is released (or cancelled with its workflow) below,
            -- once, for a released step is never an effect
            SELECT f.workflow_id, f.step, f.depends_on, f.policy = 'run' AS each_edge,
                   row_number() OVER w AS k, count(*) OVER w AS n
            FROM effects f
            WHERE f.effect = 'arrived' AND f.dependencies > 1
              AND (f.policy <> 'run'
                   OR NOT EXISTS (SELECT 1 FROM __S__.workflow_arrivals a
                                  WHERE a.workflow_id = f.workflow_id AND a.step = f.step
                                    AND a.depends_on = f.depends_on))
            WINDOW w AS (PARTITION BY f.workflow_id, f.step ORDER BY f.depends_on
                         ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING)
        ), arrived AS (
            INSERT INTO __S__.workflow_arrivals (workflow_id, step, seen, depends_on)
            SELECT c.workflow_id, c.step, coalesce(m.seen, 0) + c.k, c.depends_on
            FROM counted c
            LEFT JOIN LATERAL (SELECT a.seen FROM __S__.workflow_arrivals a
                               WHERE a.workflow_id = c.workflow_id AND a.step = c.step
                               ORDER BY a.seen DESC LIMIT 1) m ON true
            WHERE c.each_edge OR c.k = c.n
            RETURNING workflow_id, step, seen
        ), next AS (
            -- the dependents whose last dependency arrived run, unless their workflow was
            -- cancelled; the dependents a failure cancels are settled in the next round
            SELECT DISTINCT a.workflow_id, a.step,
                   EXISTS (SELECT 1 FROM __S__.workflow_cancels c WHERE c.workflow_id = a.workflow_id) AS cancel
            FROM arrived a
            JOIN __S__.workflow_steps d ON d.workflow_id = a.workflow_id AND d.step = a.step
            WHERE a.seen = d.dependencies
            UNION
            SELECT f.workflow_id, f.step,
                   EXISTS (SELECT 1 FROM __S__.workflow_cancels c WHERE c.workflow_id = f.workflow_id)
            FROM effects f WHERE f.effect = 'arrived' AND f.dependencies = 1
            UNION
            SELECT f.workflow_id, f.step, true FROM effects f WHERE f.effect = 'cancel'
        )
        SELECT coalesce(array_agg(n.workflow_id) FILTER (WHERE n.cancel), '{}'),
               coalesce(array_agg(n.step) FILTER (WHERE n.cancel), '{}'),
               v_release_workflows || coalesce(array_agg(n.workflow_id) FILTER (WHERE NOT n.cancel), '{}'),
               v_release || coalesce(array_agg(n.step) FILTER (WHERE NOT n.cancel), '{}'),
               (SELECT array_agg(f.workflow_id) FROM effects f WHERE f.effect = 'defer'),
               (SELECT array_agg(f.step) FROM effects f WHERE f.effect = 'defer'),
               (SELECT array_agg(f.depends_on) FROM effects f WHERE f.effect = 'defer')
        INTO v_next_workflows, v_next_steps, v_release_workflows, v_release,
             v_defer_workflows, v_defer_steps, v_defer_from
        FROM next n;
        -- the skipped job's unfinished predecessor becomes the next one's (an edge appended); a
        -- statement only when a job was skipped (each costs its executor start, which at a few
        -- steps a call is most of a statement's cost)
        IF v_defer_workflows IS NOT NULL THEN
            INSERT INTO __S__.workflow_edges (workflow_id, depends_on, step)
            SELECT f.workflow_id, p.depends_on, f.step
            FROM unnest(v_defer_workflows, v_defer_steps, v_defer_from) AS f(workflow_id, step, from_step)
            JOIN __S__.workflow_edges p ON p.workflow_id = f.workflow_id AND p.step = f.from_step
            WHERE NOT EXISTS (SELECT 1 FROM __S__.workflow_results r
                              WHERE r.workflow_id = p.workflow_id AND r.step = p.depends_on)
            ON CONFLICT DO NOTHING;
        END IF;
        v_workflows := v_next_workflows;
        v_steps := v_next_steps;
        v_leases := array_fill(0::bigint, ARRAY[cardinality(v_steps)]);
        v_outcomes := array_fill('cancelled'::text, ARRAY[cardinality(v_steps)]);
    END LOOP;
    IF cardinality(v_release) > 0 THEN
        PERFORM __S__.workflow_release_many(v_release_workflows, v_release);
    END IF;
END
$$;

-- workflow_settle_many for steps of one workflow.
CREATE OR REPLACE FUNCTION __S__.workflow_settle_steps(p_workflow_id bigint, p_steps text[], p_run_leases bigint[],
                                                       p_outcomes text[]) RETURNS void
LANGUAGE sql AS $$
    SELECT __S__.workflow_settle_many(array_fill(p_workflow_id, ARRAY[coalesce(cardinality(p_steps), 0)]),
                                      p_steps, p_run_leases, p_outcomes)
$$;

-- Settle the workflow steps among these jobs (others are ignored): p_outcomes are the jobs' final
-- states (completed, failed, cancelled, dead_lettered: failed for a dependent).
CREATE OR REPLACE FUNCTION __S__.workflow_settle(p_job_ids bigint[], p_run_leases bigint[], p_outcomes text[])
RETURNS void
LANGUAGE plpgsql SET jit = off SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off AS $$
DECLARE
    v_workflows bigint[];
    v_steps text[];
    v_leases bigint[];
    v_outcomes text[];
BEGIN
    IF NOT __S__.lock_workflows_of(p_job_ids) THEN
        RETURN;
    END IF;
    SELECT array_agg(s.workflow_id ORDER BY s.job_id), array_agg(s.step ORDER BY s.job_id),
           array_agg(i.run_lease ORDER BY s.job_id), array_agg(i.outcome ORDER BY s.job_id)
    INTO v_workflows, v_steps, v_leases, v_outcomes
    FROM unnest(p_job_ids, p_run_leases, p_outcomes) AS i(job_id, run_lease, outcome)
    JOIN __S__.workflow_steps s ON s.job_id = i.job_id;
    PERFORM __S__.workflow_settle_many(v_workflows, v_steps, v_leases, v_outcomes);
END
$$;

-- Every path that fails or cancels a job for good writes a done_entries or dlq_entries row, and so
-- does a completion through a callback; these statement triggers settle the workflow steps among
-- them. complete_batch writes neither (it settles its own), and each trigger runs once per statement.
CREATE OR REPLACE FUNCTION __S__.workflow_settle_done() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- completed too: a job completed through its callback (callbacks.sql, end_wait) ends here
    PERFORM __S__.workflow_settle(array_agg(n.job_id), array_agg(n.run_lease), array_agg(n.state))
    FROM finished n WHERE n.state IN ('completed', 'failed', 'cancelled');
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION __S__.workflow_settle_dead_lettered() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM __S__.workflow_settle(array_agg(n.job_id), array_agg(n.run_lease), array_agg('dead_lettered'::text))
    FROM finished n;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER workflow_settle AFTER INSERT ON __S__.done_entries
    REFERENCING NEW TABLE AS finished FOR EACH STATEMENT EXECUTE FUNCTION __S__.workflow_settle_done();
CREATE OR REPLACE TRIGGER workflow_settle AFTER INSERT ON __S__.dlq_entries
    REFERENCING NEW TABLE AS finished FOR EACH STATEMENT EXECUTE FUNCTION __S__.workflow_settle_dead_lettered();

-- What enqueue refuses, for a job given as a JSON object (a workflow step, a batch member, a job of a
-- sequence): text fields must be strings, numbers numbers, and then validate_enqueue's rules and a
-- timeout of 1..2147483647 ms. p_what names the job in the error (SQLSTATE 22023).
CREATE OR REPLACE FUNCTION __S__.validate_step_job(p_job jsonb, p_what text) RETURNS void
LANGUAGE plpgsql SET jit = off AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM unnest(ARRAY['kind', 'queue', 'traceparent']) f
               WHERE p_job ? f AND jsonb_typeof(p_job->f) NOT IN ('string', 'null')) THEN
        RAISE EXCEPTION 'ringwork: %: step, kind, queue and traceparent must be strings', p_what
            USING ERRCODE = '22023';
    END IF;
    IF jsonb_typeof(p_job->'priority') IS DISTINCT FROM 'number' AND p_job ? 'priority'
       OR jsonb_typeof(p_job->'max_attempts') IS DISTINCT FROM 'number' AND p_job ? 'max_attempts'
       OR jsonb_typeof(p_job->'timeout_ms') NOT IN ('number', 'null') AND p_job ? 'timeout_ms' THEN
        RAISE EXCEPTION 'ringwork: %: priority, max_attempts and timeout_ms must be numbers', p_what
            USING ERRCODE = '22023';
    END IF;
    BEGIN
        PERFORM __S__.validate_enqueue(coalesce(p_job->>'queue', 'default'), p_job->>'kind',
                                       CASE WHEN p_job ? 'args' THEN
                                           CASE WHEN jsonb_typeof(p_job->'args') = 'null' THEN NULL
                                                ELSE p_job->'args' END
                                       ELSE '{}'::jsonb END,
                                       coalesce((p_job->>'priority')::int, 2),
                                       coalesce((p_job->>'max_attempts')::int, 25), p_job->>'traceparent');
        IF (p_job->>'timeout_ms')::int NOT BETWEEN 1 AND 2147483647 THEN
            RAISE EXCEPTION 'ringwork: timeout_ms must be 1..2147483647, got %', p_job->>'timeout_ms'
                USING ERRCODE = '22023';
        END IF;
    EXCEPTION
        WHEN invalid_parameter_value OR invalid_text_representation OR numeric_value_out_of_range THEN
            RAISE EXCEPTION 'ringwork: %: %', p_what, regexp_replace(SQLERRM, '^ringwork: ', '')
                USING ERRCODE = '22023';
    END;
END
$$;

-- Whether a step is of the shapes enqueue surely takes (a quick check, stricter than the
-- step-by-step one: a step it does not vouch for is looked at one by one, for its exact error).
-- Unnamed (p_named false): sequence jobs, which have no step name and no dependencies of their own.
-- One expression, so that it is inlined into its callers' aggregates: a set-returning subquery
-- per step (its keys, its dependencies) cost about 2 µs a step. Numbers beyond a 64-bit float, or
-- nesting 100 deep from a call's array, can only be in args (every other field's type is checked
-- here): the careful path.
CREATE OR REPLACE FUNCTION __S__.workflow_step_plain(e jsonb, p_named boolean, p_max_args bigint) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN jsonb_typeof(e) = 'object' THEN
               e - ARRAY['step', 'kind', 'args', 'queue', 'priority', 'max_attempts', 'timeout_ms', 'traceparent',
                         'depends_on', 'on_dependency_failure'] = '{}'::jsonb
               AND CASE WHEN p_named THEN jsonb_typeof(e->'step') = 'string' AND __S__.valid_name(e->>'step')
                        ELSE NOT e ?| ARRAY['step', 'depends_on', 'on_dependency_failure'] END
               AND jsonb_typeof(e->'kind') = 'string' AND __S__.valid_name(e->>'kind')
               AND (NOT e ? 'queue' OR (jsonb_typeof(e->'queue') = 'string' AND __S__.valid_name(e->>'queue')))
               AND (NOT e ? 'args' OR jsonb_typeof(e->'args') <> 'null')
               AND (NOT e ? 'priority' OR (jsonb_typeof(e->'priority') = 'number' AND e->>'priority' ~ '^[1-4]$'))
               AND (NOT e ? 'max_attempts' OR (jsonb_typeof(e->'max_attempts') = 'number'
                                               AND e->>'max_attempts' ~ '^[1-9][0-9]{0,5}$|^1000000$'))
               AND (NOT e ? 'timeout_ms' OR jsonb_typeof(e->'timeout_ms') = 'null'
                    OR (jsonb_typeof(e->'timeout_ms') = 'number' AND e->>'timeout_ms' ~ '^[1-9][0-9]{0,8}$'))
               AND (NOT e ? 'traceparent' OR jsonb_typeof(e->'traceparent') = 'null'
                    OR (jsonb_typeof(e->'traceparent') = 'string' AND __S__.valid_traceparent(e->>'traceparent')))
               AND coalesce(e->>'on_dependency_failure', 'cancel') IN ('cancel', 'run', 'hold')
               AND (NOT e ? 'depends_on' OR (jsonb_typeof(e->'depends_on') = 'array'
                    AND NOT jsonb_path_exists(e->'depends_on', 'strict $[*] ? (@.type() != "string")')))
               AND octet_length(coalesce(e->'args', '{}'::jsonb)::text) <= p_max_args
               AND NOT jsonb_path_exists(coalesce(e->'args', '{}'::jsonb), 'strict $.** ? (@.type() == "number"
                                         && (@ > 1.7976931348623157e308 || @ < -1.7976931348623157e308))')
               AND NOT jsonb_path_exists(coalesce(e->'args', '{}'::jsonb), 'strict $.**{98 to last}')
           ELSE false END
$$;

-- Whether every step of a JSON array is plain (workflow_step_plain). PL/pgSQL, not SQL: the SQL
-- function was never inlined (its body has a FROM), so each workflow insert planned it again,
-- about 0.27 ms of a ten-step workflow's 1.7; the args limit is read once, not per step.
CREATE OR REPLACE FUNCTION __S__.workflow_steps_plain(p_steps jsonb, p_named boolean DEFAULT true) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_max_args bigint := __S__.setting('max_args_bytes');
BEGIN
    RETURN (SELECT coalesce(bool_and(__S__.workflow_step_plain(e, p_named, v_max_args)), false)
            FROM jsonb_array_elements(p_steps) e);
END
$$;

-- ---------------------------------------------------------------------------------------------
-- Adding steps: a new workflow (enqueue_workflow) or more steps of a running one (a step that fans
-- out while it runs). p_steps is a JSON array of step objects:
--   {"step": "name", "kind": "...", "args": {...}, "queue": "default", "priority": 2,
--    "max_attempts": 25, "timeout_ms": null, "traceparent": null,
--    "depends_on": ["other step", ...], "on_dependency_failure": "cancel" | "run" | "hold"}
-- Only step and kind are required. A dependency names a step of the same call or one the workflow
-- already has; a step whose dependencies are all final (or that has none) is released at once.
-- Every step is checked before anything is written (SQLSTATE 22023 for bad input).
-- workflow_write_steps is the work, for a caller that holds the workflow's lock or created the
-- workflow in its transaction (no one else can see it yet); workflow_add_steps takes the lock.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION __S__.workflow_write_steps(p_workflow_id bigint, p_steps jsonb)
RETURNS TABLE (step text, job_id bigint)
-- plan_cache_mode is restored when the function returns (its own SET), whatever the body sets
LANGUAGE plpgsql SET jit = off SET plan_cache_mode = auto SET enable_hashagg = off AS $$
DECLARE
    -- the engine's clock, read once (as in workflow_release_many)
    v_now timestamptz := __S__.engine_now();
    v_step jsonb;
    v_name text;
    v_extra text[];
    v_deps jsonb;
    v_dep text;
    v_policy text;
    v_peeled jsonb := '{}';
    v_level jsonb;
    v_in_order boolean;
    v_first_job bigint;
    v_plain boolean;
    v_edge record;
    v_release text[] := '{}';
    v_cancel text[] := '{}';
    v_effect text;
BEGIN
    IF p_steps IS NULL OR jsonb_typeof(p_steps) <> 'array' OR jsonb_array_length(p_steps) = 0 THEN
        RAISE EXCEPTION 'ringwork: workflow steps must be a non-empty JSON array of step objects'
            USING ERRCODE = '22023';
    END IF;
    -- a large call plans each statement for its arguments (a generic plan cached while the tables
    -- were small scans them whole); a small one keeps the cached plans, whose planning would cost
    -- more than running them
    IF jsonb_array_length(p_steps) > 64 THEN
        PERFORM set_config('plan_cache_mode', 'force_custom_plan', true);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM __S__.workflows w WHERE w.workflow_id = p_workflow_id) THEN
        RAISE EXCEPTION 'ringwork: no workflow %', p_workflow_id USING ERRCODE = 'P0002';
    END IF;
    IF EXISTS (SELECT 1 FROM __S__.workflow_cancels c WHERE c.workflow_id = p_workflow_id) THEN
        RAISE EXCEPTION 'ringwork: workflow % is cancelled: no steps can be added', p_workflow_id
            USING ERRCODE = '22023';
    END IF;
    v_plain := __S__.workflow_steps_plain(p_steps);
    -- each step on its own: one statement for the common shapes, then, only if a step is not
    -- one of them, a step at a time for the exact error
    FOR v_step IN SELECT e FROM jsonb_array_elements(p_steps) e
                  WHERE NOT v_plain LOOP
        IF jsonb_typeof(v_step) <> 'object' THEN
            RAISE EXCEPTION 'ringwork: a workflow step must be a JSON object, got %', left(v_step::text, 200)
                USING ERRCODE = '22023';
        END IF;
        v_name := v_step->>'step';
        IF NOT __S__.valid_name(v_name) THEN
            RAISE EXCEPTION 'ringwork: invalid workflow step name %: must be 1..128 bytes without control or invisible format characters',
                quote_nullable(v_name) USING ERRCODE = '22023';
        END IF;
        SELECT array_agg(k ORDER BY k) INTO v_extra FROM jsonb_object_keys(v_step) k
        WHERE k NOT IN ('step', 'kind', 'args', 'queue', 'priority', 'max_attempts', 'timeout_ms', 'traceparent',
                        'depends_on', 'on_dependency_failure');
        IF v_extra IS NOT NULL THEN
            RAISE EXCEPTION 'ringwork: workflow step % has unknown fields %', quote_literal(v_name), v_extra
                USING ERRCODE = '22023';
        END IF;
        IF jsonb_typeof(v_step->'step') <> 'string' THEN
            RAISE EXCEPTION 'ringwork: workflow step %: step, kind, queue and traceparent must be strings',
                quote_literal(v_name) USING ERRCODE = '22023';
        END IF;
        PERFORM __S__.validate_step_job(v_step, 'workflow step ' || quote_literal(v_name));
        v_policy := coalesce(v_step->>'on_dependency_failure', 'cancel');
        IF v_policy NOT IN ('cancel', 'run', 'hold') THEN
            RAISE EXCEPTION 'ringwork: workflow step %: on_dependency_failure must be cancel, run or hold, got %',
                quote_literal(v_name), quote_literal(v_policy) USING ERRCODE = '22023';
        END IF;
        v_deps := coalesce(v_step->'depends_on', '[]'::jsonb);
        IF jsonb_typeof(v_deps) <> 'array'
           OR EXISTS (SELECT 1 FROM jsonb_array_elements(v_deps) d WHERE jsonb_typeof(d) <> 'string') THEN
            RAISE EXCEPTION 'ringwork: workflow step %: depends_on must be an array of step names',
                quote_literal(v_name) USING ERRCODE = '22023';
        END IF;
    END LOOP;
    -- names: each once, and new to the workflow (set-based: a call may carry thousands of steps)
    SELECT x.n INTO v_name FROM (SELECT e->>'step' AS n FROM jsonb_array_elements(p_steps) e) x
    GROUP BY x.n HAVING count(*) > 1 ORDER BY x.n LIMIT 1;
    IF v_name IS NULL THEN
        SELECT s.step INTO v_name FROM __S__.workflow_steps s
        JOIN (SELECT e->>'step' AS n FROM jsonb_array_elements(p_steps) e) x ON x.n = s.step
        WHERE s.workflow_id = p_workflow_id ORDER BY s.step LIMIT 1;
    END IF;
    IF v_name IS NOT NULL THEN
        RAISE EXCEPTION 'ringwork: workflow % has step % twice', p_workflow_id, quote_literal(v_name)
            USING ERRCODE = '22023';
    END IF;
    -- dependencies: known steps, not the step itself; and whether every dependency on a new step
    -- comes before its step in the call, which rules out a cycle at once (the common case: steps
    -- listed in the order they run)
    WITH new AS (SELECT x.e->>'step' AS step, x.n, x.e FROM jsonb_array_elements(p_steps) WITH ORDINALITY x(e, n)),
         edges AS (SELECT n.step, n.n, d AS dep, y.n AS dep_n
                   FROM new n CROSS JOIN jsonb_array_elements_text(coalesce(n.e->'depends_on', '[]'::jsonb)) d
                   LEFT JOIN new y ON y.step = d)
    SELECT b.step, b.dep, NOT EXISTS (SELECT 1 FROM edges x WHERE x.dep_n > x.n)
    INTO v_name, v_dep, v_in_order
    FROM (SELECT 1) one
    LEFT JOIN LATERAL (SELECT x.step, x.dep FROM edges x
                       WHERE x.dep = x.step
                          OR (x.dep_n IS NULL
                              AND NOT EXISTS (SELECT 1 FROM __S__.workflow_steps s
                                              WHERE s.workflow_id = p_workflow_id AND s.step = x.dep))
                       ORDER BY x.step, x.dep LIMIT 1) b ON true;
    IF v_dep = v_name THEN
        RAISE EXCEPTION 'ringwork: workflow step % depends on itself', quote_literal(v_name)
            USING ERRCODE = '22023';
    ELSIF v_name IS NOT NULL THEN
        RAISE EXCEPTION 'ringwork: workflow step % depends on %, which is not a step of workflow %',
            quote_literal(v_name), quote_literal(v_dep), p_workflow_id USING ERRCODE = '22023';
    END IF;
    -- no cycle among the new steps (existing steps cannot depend on new ones): peel off, a level at
    -- a time, the steps whose new dependencies are all peeled, until none is left or none can be
    LOOP
        EXIT WHEN v_in_order;
        WITH new AS (SELECT e->>'step' AS step, e FROM jsonb_array_elements(p_steps) e),
             edges AS (SELECT n.step, d AS dep FROM new n,
                              jsonb_array_elements_text(coalesce(n.e->'depends_on', '[]'::jsonb)) d
                       WHERE d IN (SELECT n2.step FROM new n2))
        SELECT jsonb_object_agg(n.step, true) INTO v_level FROM new n
        WHERE NOT v_peeled ? n.step
          AND NOT EXISTS (SELECT 1 FROM edges x WHERE x.step = n.step AND NOT v_peeled ? x.dep);
        EXIT WHEN v_level IS NULL;
        v_peeled := v_peeled || v_level;
    END LOOP;
    SELECT array_agg(e->>'step' ORDER BY e->>'step') INTO v_extra FROM jsonb_array_elements(p_steps) e
    WHERE NOT v_in_order AND NOT v_peeled ? (e->>'step');
    IF v_extra IS NOT NULL THEN
        RAISE EXCEPTION 'ringwork: workflow steps % depend on each other in a cycle', v_extra
            USING ERRCODE = '22023';
    END IF;
    -- write the steps and their edges, in input order (job ids follow it)
    v_first_job := nextval('__S__.job_ids');
    INSERT INTO __S__.workflow_steps (workflow_id, step, job_id, queue, kind, args, priority, max_attempts,
                                      timeout_ms, traceparent, on_dependency_failure, dependencies, created_at)
    SELECT p_workflow_id, e->>'step', CASE WHEN x.n = 1 THEN v_first_job ELSE nextval('__S__.job_ids') END, coalesce(e->>'queue', 'default'), e->>'kind',
           coalesce(e->'args', '{}'::jsonb), coalesce((e->>'priority')::int, 2)::smallint,
           coalesce((e->>'max_attempts')::int, 25), (e->>'timeout_ms')::int,
           __S__.traceparent_bytes(e->>'traceparent'), coalesce(e->>'on_dependency_failure', 'cancel'),
           (SELECT count(DISTINCT d) FROM jsonb_array_elements_text(coalesce(e->'depends_on', '[]'::jsonb)) d),
           v_now
    FROM jsonb_array_elements(p_steps) WITH ORDINALITY AS x(e, n) ORDER BY x.n;
    INSERT INTO __S__.workflow_edges (workflow_id, depends_on, step)
    SELECT DISTINCT p_workflow_id, d, e->>'step'
    FROM jsonb_array_elements(p_steps) e, jsonb_array_elements_text(coalesce(e->'depends_on', '[]'::jsonb)) d;
    -- edges from steps that are already final arrive now (a completed outcome wins over an earlier failure)
    FOR v_edge IN SELECT s.step, s.on_dependency_failure, s.dependencies, e.depends_on,
                         CASE WHEN bool_or(r.outcome = 'completed') THEN 'completed'
                              -- a failure an operator can still retry
                              WHEN EXISTS (SELECT 1 FROM __S__.dlq_entries q WHERE q.job_id = p.job_id)
                                  THEN 'dead_lettered'
                              ELSE (array_agg(r.outcome ORDER BY r.finished_at DESC))[1] END AS outcome
                  FROM __S__.workflow_steps s
                  JOIN __S__.workflow_edges e ON e.workflow_id = s.workflow_id AND e.step = s.step
                  JOIN __S__.workflow_steps p ON p.workflow_id = e.workflow_id AND p.step = e.depends_on
                  JOIN __S__.workflow_results r ON r.workflow_id = e.workflow_id AND r.step = e.depends_on
                  WHERE s.workflow_id = p_workflow_id AND s.job_id >= v_first_job
                  GROUP BY s.step, s.on_dependency_failure, s.dependencies, e.depends_on, p.job_id
                  ORDER BY s.step, e.depends_on LOOP
        v_effect := __S__.workflow_edge_effect(v_edge.outcome, v_edge.on_dependency_failure);
        IF v_effect = 'arrived' THEN
            PERFORM __S__.workflow_arrive(p_workflow_id, v_edge.step, v_edge.depends_on, v_edge.dependencies);
        ELSIF v_effect = 'cancel' AND NOT v_edge.step = ANY (v_cancel) THEN
            v_cancel := v_cancel || v_edge.step;
        END IF;
    END LOOP;
    IF cardinality(v_cancel) > 0 THEN
        PERFORM __S__.workflow_settle_steps(p_workflow_id, v_cancel,
                                            array_fill(0::bigint, ARRAY[cardinality(v_cancel)]),
                                            array_fill('cancelled'::text, ARRAY[cardinality(v_cancel)]));
    END IF;
    SELECT coalesce(array_agg(s.step ORDER BY s.job_id), '{}') INTO v_release
    FROM __S__.workflow_steps s
    WHERE s.workflow_id = p_workflow_id AND s.job_id >= v_first_job
      AND NOT EXISTS (SELECT 1 FROM __S__.workflow_results r WHERE r.workflow_id = s.workflow_id AND r.step = s.step)
      -- the cancel cascade above may have released it already
      AND NOT EXISTS (SELECT 1 FROM __S__.workflow_released r WHERE r.workflow_id = s.workflow_id AND r.step = s.step)
      AND s.dependencies = (SELECT coalesce(max(a.seen), 0) FROM __S__.workflow_arrivals a
                            WHERE a.workflow_id = s.workflow_id AND a.step = s.step);
    PERFORM __S__.workflow_release(p_workflow_id, v_release);
    RETURN QUERY SELECT s.step, s.job_id FROM __S__.workflow_steps s
                 WHERE s.workflow_id = p_workflow_id AND s.job_id >= v_first_job ORDER BY s.job_id;
END
$$;

-- Add steps to a workflow under its lock: the SQL API's call for a running workflow (a step that
-- fans out), and a batch's members and its seal.
CREATE OR REPLACE FUNCTION __S__.workflow_add_steps(p_workflow_id bigint, p_steps jsonb)
RETURNS TABLE (step text, job_id bigint)
LANGUAGE plpgsql SET jit = off AS $$
BEGIN
    PERFORM __S__.lock_workflow(p_workflow_id);
    RETURN QUERY SELECT w.step, w.job_id FROM __S__.workflow_write_steps(p_workflow_id, p_steps) w;
END
$$;

-- A new workflow with these steps (workflow_write_steps), inside the caller's transaction: if it
-- rolls back, nothing of the workflow exists. Not enqueue_workflows with one workflow: wrapping
-- that call's result cost a 10,002-step workflow's insert about a tenth more.
CREATE OR REPLACE FUNCTION __S__.enqueue_workflow(p_steps jsonb)
RETURNS TABLE (workflow_id bigint, step text, job_id bigint)
LANGUAGE plpgsql SET jit = off AS $$
DECLARE
    v_id bigint := nextval('__S__.workflow_ids');
BEGIN
    INSERT INTO __S__.workflows (workflow_id, created_at) VALUES (v_id, __S__.engine_now());
    RETURN QUERY SELECT v_id, a.step, a.job_id FROM __S__.workflow_write_steps(v_id, p_steps) a;
END
$$;

-- New workflows, inside the caller's transaction: p_workflows is a JSON array whose elements are
-- each a workflow's steps, as workflow_add_steps takes them. Returns each step's job id with its
-- workflow's position in the call (1-based) and id, in job id order (the order given).
--
-- Set-based over every step of the call: a PL/pgSQL statement costs some 14 µs whatever it does,
-- and a workflow through workflow_write_steps is about 25 of them, so here they are paid once a call,
-- and the due steps of all the workflows go to the ring in one segment per (queue, priority).
-- No workflow lock is taken: a workflow this call creates is invisible to every other transaction
-- until it commits, so nothing can settle, cancel or add to it meanwhile (and an advisory lock per
-- workflow would fill the shared lock table in a large call).
-- A call whose steps are not all of the shapes workflow_steps_plain vouches for, or that names a
-- step twice in a workflow, a dependency that is not a step of its own workflow, or a cycle, goes a
-- workflow at a time through workflow_write_steps (no lock either), which inserts the unusual
-- shapes and raises the exact error for bad input. Its errors do not say which workflow of the
-- call (a few name it by the id the call gave it, which its rollback undoes): not in a
-- subtransaction per workflow to add the position, since more than 64 in one transaction would
-- overflow the backend's cache of subtransactions and slow every snapshot on the server while it
-- lasts. The Rust client checks each workflow first and names its position.
CREATE OR REPLACE FUNCTION __S__.enqueue_workflows(p_workflows jsonb)
RETURNS TABLE (workflow_index int, workflow_id bigint, step text, job_id bigint)
LANGUAGE plpgsql SET jit = off SET enable_hashagg = off AS $$
DECLARE
    v_now timestamptz := __S__.engine_now();
    v_count int;
    v_id bigint;
    v_ids bigint[];
    v_careful boolean;
    v_in_order boolean;
    v_peeled jsonb := '{}';
    v_level jsonb;
    v_steps jsonb;
    v_index int;
    v_added_ids bigint[];
    v_added_steps text[];
    v_added_jobs bigint[];
    v_release_ids bigint[];
    v_release_steps text[];
BEGIN
    IF p_workflows IS NULL OR jsonb_typeof(p_workflows) <> 'array' OR jsonb_array_length(p_workflows) = 0 THEN
        RAISE EXCEPTION 'ringwork: workflows must be a non-empty JSON array of step arrays'
            USING ERRCODE = '22023';
    END IF;
    v_count := jsonb_array_length(p_workflows);
    -- the quick checks, over every step at once; any doubt sends the call down the careful path,
    -- and so does a single workflow, for which that path's statements cost less
    v_careful := v_count = 1 OR EXISTS (SELECT 1 FROM jsonb_array_elements(p_workflows) w
                         WHERE jsonb_typeof(w) <> 'array' OR w = '[]'::jsonb)
        OR NOT __S__.workflow_steps_plain(jsonb_path_query_array(p_workflows, 'lax $[*][*]'));
    IF NOT v_careful THEN
        -- names once per workflow, dependencies on other steps of the same workflow; and whether
        -- every dependency comes before its step in the call, which rules out a cycle at once
        WITH steps AS (SELECT w.i, s.n, s.e->>'step' AS step, s.e->'depends_on' AS deps
                       FROM jsonb_array_elements(p_workflows) WITH ORDINALITY w(steps, i),
                            jsonb_array_elements(w.steps) WITH ORDINALITY s(e, n)),
             edges AS (SELECT x.n, x.step, d AS dep, y.n AS dep_n
                       FROM steps x CROSS JOIN jsonb_array_elements_text(coalesce(x.deps, '[]'::jsonb)) d
                       LEFT JOIN steps y ON y.i = x.i AND y.step = d)
        SELECT EXISTS (SELECT 1 FROM steps x GROUP BY x.i, x.step HAVING count(*) > 1)
               OR EXISTS (SELECT 1 FROM edges x WHERE x.dep = x.step OR x.dep_n IS NULL),
               NOT EXISTS (SELECT 1 FROM edges x WHERE x.dep_n > x.n)
        INTO v_careful, v_in_order;
    END IF;
    IF NOT v_careful AND NOT v_in_order THEN
        -- no cycle: peel off, a level at a time, the steps whose dependencies are all peeled (keys
        -- "position/step": names are unique within a workflow)
        LOOP
            SELECT jsonb_object_agg(w.i || '/' || (s->>'step'), true) INTO v_level
            FROM jsonb_array_elements(p_workflows) WITH ORDINALITY w(steps, i), jsonb_array_elements(w.steps) s
            WHERE NOT v_peeled ? (w.i || '/' || (s->>'step'))
              AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements_text(coalesce(s->'depends_on', '[]'::jsonb)) d
                              WHERE NOT v_peeled ? (w.i || '/' || d));
            EXIT WHEN v_level IS NULL;
            v_peeled := v_peeled || v_level;
        END LOOP;
        v_careful := (SELECT count(*) FROM jsonb_object_keys(v_peeled))
                     <> (SELECT count(*) FROM jsonb_array_elements(p_workflows) w, jsonb_array_elements(w) s);
    END IF;
    IF v_careful THEN
        FOR v_index, v_steps IN SELECT w.i, w.steps FROM jsonb_array_elements(p_workflows) WITH ORDINALITY w(steps, i)
                                ORDER BY w.i LOOP
            v_id := nextval('__S__.workflow_ids');
            INSERT INTO __S__.workflows (workflow_id, created_at) VALUES (v_id, v_now);
            RETURN QUERY SELECT v_index, v_id, a.step, a.job_id FROM __S__.workflow_write_steps(v_id, v_steps) a;
        END LOOP;
        RETURN;
    END IF;
    v_ids := ARRAY(SELECT nextval('__S__.workflow_ids') FROM generate_series(1, v_count));
    INSERT INTO __S__.workflows (workflow_id, created_at) SELECT w.id, v_now FROM unnest(v_ids) w(id);
    -- the steps and their edges, in the order given (job ids follow it: nextval is evaluated after
    -- the sort, being volatile)
    WITH added AS (
        INSERT INTO __S__.workflow_steps (workflow_id, step, job_id, queue, kind, args, priority, max_attempts,
                                          timeout_ms, traceparent, on_dependency_failure, dependencies, created_at)
        SELECT v_ids[w.i], s.e->>'step', nextval('__S__.job_ids'), coalesce(s.e->>'queue', 'default'), s.e->>'kind',
               coalesce(s.e->'args', '{}'::jsonb), coalesce((s.e->>'priority')::int, 2)::smallint,
               coalesce((s.e->>'max_attempts')::int, 25), (s.e->>'timeout_ms')::int,
               __S__.traceparent_bytes(s.e->>'traceparent'), coalesce(s.e->>'on_dependency_failure', 'cancel'),
               (SELECT count(DISTINCT d) FROM jsonb_array_elements_text(coalesce(s.e->'depends_on', '[]'::jsonb)) d),
               v_now
        FROM jsonb_array_elements(p_workflows) WITH ORDINALITY w(steps, i),
             jsonb_array_elements(w.steps) WITH ORDINALITY s(e, n)
        ORDER BY w.i, s.n
        RETURNING workflow_steps.workflow_id, workflow_steps.step, workflow_steps.job_id, workflow_steps.dependencies)
    SELECT array_agg(a.workflow_id ORDER BY a.job_id), array_agg(a.step ORDER BY a.job_id),
           array_agg(a.job_id ORDER BY a.job_id),
           array_agg(a.workflow_id ORDER BY a.job_id) FILTER (WHERE a.dependencies = 0),
           array_agg(a.step ORDER BY a.job_id) FILTER (WHERE a.dependencies = 0)
    INTO v_added_ids, v_added_steps, v_added_jobs, v_release_ids, v_release_steps FROM added a;
    INSERT INTO __S__.workflow_edges (workflow_id, depends_on, step)
    SELECT DISTINCT v_ids[w.i], d, s->>'step'
    FROM jsonb_array_elements(p_workflows) WITH ORDINALITY w(steps, i), jsonb_array_elements(w.steps) s,
         jsonb_array_elements_text(coalesce(s->'depends_on', '[]'::jsonb)) d;
    PERFORM __S__.workflow_release_many(v_release_ids, v_release_steps);
    -- from what was written, not from workflow_steps: a plan cached while that table is small could
    -- scan it whole once it is large
    RETURN QUERY SELECT o.i::int, a.workflow_id, a.step, a.job_id
                 FROM unnest(v_added_ids, v_added_steps, v_added_jobs) a(workflow_id, step, job_id)
                 JOIN unnest(v_ids) WITH ORDINALITY o(id, i) ON o.id = a.workflow_id
                 ORDER BY a.job_id;
END
$$;
-- Cancel a workflow: no step is released after this; steps still waiting are cancelled, steps
-- released and not finished are cancelled like any job (cancel_job). Returns the steps cancelled,
-- or NULL for an unknown workflow.
CREATE OR REPLACE FUNCTION __S__.cancel_workflow(p_workflow_id bigint) RETURNS int
LANGUAGE plpgsql SET jit = off SET plan_cache_mode = force_custom_plan AS $$
DECLARE
    v_waiting text[];
    v_job bigint;
    v_count int;
BEGIN
    PERFORM __S__.lock_workflow(p_workflow_id);
    IF NOT EXISTS (SELECT 1 FROM __S__.workflows w WHERE w.workflow_id = p_workflow_id) THEN
        RETURN NULL;
    END IF;
    INSERT INTO __S__.workflow_cancels (workflow_id, cancelled_at) VALUES (p_workflow_id, __S__.engine_now())
    ON CONFLICT DO NOTHING;
    SELECT coalesce(array_agg(s.step ORDER BY s.job_id), '{}') INTO v_waiting FROM __S__.workflow_steps s
    WHERE s.workflow_id = p_workflow_id
      AND NOT EXISTS (SELECT 1 FROM __S__.workflow_released r WHERE r.workflow_id = s.workflow_id AND r.step = s.step)
      AND NOT EXISTS (SELECT 1 FROM __S__.workflow_results r WHERE r.workflow_id = s.workflow_id AND r.step = s.step);
    v_count := cardinality(v_waiting);
    PERFORM __S__.workflow_settle_steps(p_workflow_id, v_waiting,
                                        array_fill(0::bigint, ARRAY[v_count]),
                                        array_fill('cancelled'::text, ARRAY[v_count]));
    FOR v_job IN SELECT s.job_id FROM __S__.workflow_steps s
                 JOIN __S__.workflow_released r ON r.workflow_id = s.workflow_id AND r.step = s.step
                 WHERE s.workflow_id = p_workflow_id
                   AND NOT EXISTS (SELECT 1 FROM __S__.workflow_results x
                                   WHERE x.workflow_id = s.workflow_id AND x.step = s.step)
                 ORDER BY s.job_id LOOP
        IF __S__.cancel_job(v_job, 'workflow cancelled') IN ('cancelled', 'cancelled_running') THEN
            v_count := v_count + 1;
        END IF;
    END LOOP;
    RETURN v_count;
END
$$;

-- A waiting (unreleased) step cancelled by its job id, for cancel_job: 'cancelled', or NULL when the
-- job is not a waiting step.
CREATE OR REPLACE FUNCTION __S__.cancel_waiting_step(p_job_id bigint) RETURNS text
LANGUAGE plpgsql SET jit = off SET plan_cache_mode = force_custom_plan AS $$
DECLARE
    v_step __S__.workflow_steps;
BEGIN
    SELECT * INTO v_step FROM __S__.workflow_steps s WHERE s.job_id = p_job_id;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    PERFORM __S__.lock_workflow(v_step.workflow_id);
    IF EXISTS (SELECT 1 FROM __S__.workflow_released r WHERE r.workflow_id = v_step.workflow_id
                                                         AND r.step = v_step.step) THEN
        RETURN NULL;
    END IF;
    IF EXISTS (SELECT 1 FROM __S__.workflow_results r WHERE r.workflow_id = v_step.workflow_id
                                                        AND r.step = v_step.step) THEN
        RETURN 'already_finished';
    END IF;
    PERFORM __S__.workflow_settle_steps(v_step.workflow_id, ARRAY[v_step.step], ARRAY[0::bigint],
                                        ARRAY['cancelled']);
    RETURN 'cancelled';
END
$$;

-- Every step of a workflow: its job, its state (pending while it waits for dependencies; the job's
-- own state once released; its recorded outcome when the job's rows are gone), what it depends on,
-- and when it finished. No rows for an unknown workflow.
CREATE OR REPLACE FUNCTION __S__.workflow_status(p_workflow_id bigint)
RETURNS TABLE (step text, job_id bigint, queue text, kind text, state text, depends_on text[],
               on_dependency_failure text, finished_at timestamptz, cancelled boolean)
LANGUAGE sql STABLE SET jit = off AS $$
    SELECT s.step, s.job_id, s.queue, s.kind,
           coalesce(CASE WHEN rel.released AND (res.outcome IS NULL OR res.outcome = 'failed')
                         THEN (SELECT j.state FROM __S__.job_state(s.job_id) j) END,
                    res.outcome, 'pending'),
           coalesce((SELECT array_agg(e.depends_on ORDER BY e.depends_on) FROM __S__.workflow_edges e
                     WHERE e.workflow_id = s.workflow_id AND e.step = s.step), '{}'),
           s.on_dependency_failure, res.finished_at,
           EXISTS (SELECT 1 FROM __S__.workflow_cancels c WHERE c.workflow_id = s.workflow_id)
    FROM __S__.workflow_steps s
    CROSS JOIN LATERAL (SELECT EXISTS (SELECT 1 FROM __S__.workflow_released r
                                       WHERE r.workflow_id = s.workflow_id AND r.step = s.step) AS released) rel
    LEFT JOIN LATERAL (SELECT r.outcome, r.finished_at FROM __S__.workflow_results r
                       WHERE r.workflow_id = s.workflow_id AND r.step = s.step
                       ORDER BY r.finished_at DESC, r.run_lease DESC LIMIT 1) res ON true
    WHERE s.workflow_id = p_workflow_id
    ORDER BY s.job_id
$$;

-- The workflow and step of a job; no row for a job that is not a step.
CREATE OR REPLACE FUNCTION __S__.workflow_of(p_job_id bigint)
RETURNS TABLE (workflow_id bigint, step text)
LANGUAGE sql STABLE AS $$
    SELECT s.workflow_id, s.step FROM __S__.workflow_steps s WHERE s.job_id = p_job_id
$$;

-- A step's handler records its output for the steps that depend on it (the last write wins). False
-- when the job is not a workflow step.
CREATE OR REPLACE FUNCTION __S__.set_workflow_output(p_job_id bigint, p_output jsonb) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_step record;
BEGIN
    PERFORM __S__.validate_args(p_output);
    SELECT s.workflow_id, s.step INTO v_step FROM __S__.workflow_steps s WHERE s.job_id = p_job_id;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO __S__.workflow_outputs (workflow_id, step, output) VALUES (v_step.workflow_id, v_step.step, p_output)
    ON CONFLICT (workflow_id, step) DO UPDATE SET output = excluded.output;
    RETURN true;
END
$$;

-- The output a step of p_job_id's workflow recorded (NULL when none).
CREATE OR REPLACE FUNCTION __S__.workflow_output(p_job_id bigint, p_step text) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT o.output FROM __S__.workflow_steps s
    JOIN __S__.workflow_outputs o ON o.workflow_id = s.workflow_id AND o.step = p_step
    WHERE s.job_id = p_job_id
$$;

-- Delete finished workflows (every step has an outcome) whose last step finished more than p_keep
-- ago, at most p_limit workflows per call; a cancelled workflow counts from its cancel. Each under
-- its lock, tried (a busy one waits for the next call) and checked again once held, so a step added
-- meanwhile keeps its workflow.
CREATE OR REPLACE FUNCTION __S__.workflow_expire(p_keep interval, p_limit int) RETURNS int
LANGUAGE plpgsql SET jit = off SET plan_cache_mode = force_custom_plan AS $$
DECLARE
    v_candidates bigint[];
    v_locked bigint[] := '{}';
    v_id bigint;
    v_ids bigint[];
BEGIN
    SELECT array_agg(w.workflow_id ORDER BY w.workflow_id) INTO v_candidates FROM (
        SELECT w.workflow_id FROM __S__.workflows w
        WHERE w.created_at < __S__.engine_now() - p_keep AND __S__.workflow_finished(w.workflow_id, p_keep)
        ORDER BY w.workflow_id LIMIT p_limit
    ) w;
    IF v_candidates IS NULL THEN
        RETURN 0;
    END IF;
    FOREACH v_id IN ARRAY v_candidates LOOP
        IF pg_try_advisory_xact_lock(__S__.lock_ns('workflow'), (v_id % 2147483647)::int) THEN
            v_locked := v_locked || v_id;
        END IF;
    END LOOP;
    SELECT array_agg(x) INTO v_ids FROM unnest(v_locked) x WHERE __S__.workflow_finished(x, p_keep);
    IF v_ids IS NULL THEN
        RETURN 0;
    END IF;
    DELETE FROM __S__.workflow_arrivals x WHERE x.workflow_id = ANY (v_ids);
    DELETE FROM __S__.workflow_edges x WHERE x.workflow_id = ANY (v_ids);
    DELETE FROM __S__.workflow_results x WHERE x.workflow_id = ANY (v_ids);
    DELETE FROM __S__.workflow_released x WHERE x.workflow_id = ANY (v_ids);
    DELETE FROM __S__.workflow_outputs x WHERE x.workflow_id = ANY (v_ids);
    DELETE FROM __S__.workflow_cancels x WHERE x.workflow_id = ANY (v_ids);
    DELETE FROM __S__.workflow_batches x WHERE x.workflow_id = ANY (v_ids);
    DELETE FROM __S__.workflow_sequences x WHERE x.workflow_id = ANY (v_ids);
    DELETE FROM __S__.workflow_steps x WHERE x.workflow_id = ANY (v_ids);
    DELETE FROM __S__.workflows x WHERE x.workflow_id = ANY (v_ids);
    RETURN cardinality(v_ids);
END
$$;

-- Whether every step of the workflow has an outcome, the last more than p_keep ago.
CREATE OR REPLACE FUNCTION __S__.workflow_finished(p_workflow_id bigint, p_keep interval) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT NOT EXISTS (SELECT 1 FROM __S__.workflow_steps s
                       WHERE s.workflow_id = p_workflow_id
                         AND NOT EXISTS (SELECT 1 FROM __S__.workflow_results r
                                         WHERE r.workflow_id = s.workflow_id AND r.step = s.step))
       AND NOT EXISTS (SELECT 1 FROM __S__.workflow_results r
                       WHERE r.workflow_id = p_workflow_id AND r.finished_at >= __S__.engine_now() - p_keep)
$$;

-- ---------------------------------------------------------------------------------------------
-- Batches (migration 0022): a workflow whose steps are its members (jobs, each named member-<n>),
-- and, once sealed, one step named callback that depends on every member. The callback runs once
-- when every member is final: whatever their outcomes (policy run), or only when all completed
-- (policy cancel: a member that failed for good or was cancelled cancels it). Members are added
-- while the batch is open; sealing adds the callback, and a member already final arrives at once.
-- p_members is a JSON array of job objects (kind, args, queue, priority, max_attempts, timeout_ms,
-- traceparent; only kind is required), p_callback one such object.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION __S__.batch_steps(p_jobs jsonb) RETURNS jsonb
LANGUAGE plpgsql SET jit = off AS $$
BEGIN
    IF p_jobs IS NULL OR jsonb_typeof(p_jobs) <> 'array' OR jsonb_array_length(p_jobs) = 0 THEN
        RAISE EXCEPTION 'ringwork: batch members must be a non-empty JSON array of job objects'
            USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT 1 FROM jsonb_array_elements(p_jobs) e
               WHERE jsonb_typeof(e) <> 'object' OR e ? 'step' OR e ? 'depends_on' OR e ? 'on_dependency_failure') THEN
        RAISE EXCEPTION 'ringwork: a batch member is a job object (kind, args, queue, priority, max_attempts, timeout_ms, traceparent), without step, depends_on or on_dependency_failure'
            USING ERRCODE = '22023';
    END IF;
    RETURN (SELECT jsonb_agg(e || jsonb_build_object('step', 'member-' || nextval('__S__.batch_member_ids'))
                             ORDER BY n)
            FROM jsonb_array_elements(p_jobs) WITH ORDINALITY AS x(e, n));
END
$$;

-- Lock a batch that is still open (no callback step yet), or refuse: 'ringwork: batch N is sealed'
-- followed by p_refusal.
CREATE OR REPLACE FUNCTION __S__.lock_open_batch(p_batch_id bigint, p_refusal text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM __S__.lock_workflow(p_batch_id);
    IF NOT EXISTS (SELECT 1 FROM __S__.workflow_batches b WHERE b.workflow_id = p_batch_id) THEN
        RAISE EXCEPTION 'ringwork: no batch %', p_batch_id USING ERRCODE = 'P0002';
    END IF;
    IF EXISTS (SELECT 1 FROM __S__.workflow_steps s WHERE s.workflow_id = p_batch_id AND s.step = 'callback') THEN
        RAISE EXCEPTION 'ringwork: batch % is sealed%', p_batch_id, p_refusal USING ERRCODE = '22023';
    END IF;
END
$$;

-- Members added to an open batch; their job ids, in order.
CREATE OR REPLACE FUNCTION __S__.batch_add(p_batch_id bigint, p_members jsonb) RETURNS SETOF bigint
LANGUAGE plpgsql SET jit = off AS $$
BEGIN
    PERFORM __S__.lock_open_batch(p_batch_id, ': no members can be added');
    RETURN QUERY SELECT a.job_id FROM __S__.workflow_add_steps(p_batch_id, __S__.batch_steps(p_members)) a;
END
$$;

-- Seal an open batch with its callback: the callback's job id. p_success_only: run it only if
-- every member completed.
CREATE OR REPLACE FUNCTION __S__.seal_batch(p_batch_id bigint, p_callback jsonb, p_success_only boolean DEFAULT false)
RETURNS bigint
LANGUAGE plpgsql SET jit = off AS $$
DECLARE
    v_members jsonb;
BEGIN
    PERFORM __S__.lock_open_batch(p_batch_id, ' already');
    IF p_success_only IS NULL THEN
        RAISE EXCEPTION 'ringwork: success_only must be true or false, not NULL' USING ERRCODE = '22023';
    END IF;
    IF p_callback IS NULL OR jsonb_typeof(p_callback) <> 'object' OR p_callback ? 'step' OR p_callback ? 'depends_on'
       OR p_callback ? 'on_dependency_failure' THEN
        RAISE EXCEPTION 'ringwork: a batch callback is a job object (kind, args, queue, priority, max_attempts, timeout_ms, traceparent)'
            USING ERRCODE = '22023';
    END IF;
    SELECT coalesce(jsonb_agg(s.step), '[]'::jsonb) INTO v_members
    FROM __S__.workflow_steps s WHERE s.workflow_id = p_batch_id;
    RETURN (SELECT a.job_id FROM __S__.workflow_add_steps(p_batch_id, jsonb_build_array(
               p_callback || jsonb_build_object('step', 'callback', 'depends_on', v_members,
                                                'on_dependency_failure',
                                                CASE WHEN p_success_only THEN 'cancel' ELSE 'run' END))) a);
END
$$;

-- A new batch with these members, sealed at once when p_callback is given. Rows: the batch id and
-- each member's job id, then the callback's (callback true).
CREATE OR REPLACE FUNCTION __S__.enqueue_batch(p_members jsonb, p_callback jsonb DEFAULT NULL,
                                               p_success_only boolean DEFAULT false)
RETURNS TABLE (batch_id bigint, job_id bigint, callback boolean)
LANGUAGE plpgsql SET jit = off AS $$
DECLARE
    v_id bigint := nextval('__S__.workflow_ids');
BEGIN
    INSERT INTO __S__.workflows (workflow_id, created_at) VALUES (v_id, __S__.engine_now());
    INSERT INTO __S__.workflow_batches (workflow_id, created_at) VALUES (v_id, __S__.engine_now());
    RETURN QUERY SELECT v_id, a, false FROM __S__.batch_add(v_id, p_members) a;
    IF p_callback IS NOT NULL THEN
        RETURN QUERY SELECT v_id, __S__.seal_batch(v_id, p_callback, p_success_only), true;
    END IF;
END
$$;

-- The members of p_job_id's workflow other than itself, by their last outcome (what a batch
-- callback reports); no row when the job is not a workflow step.
CREATE OR REPLACE FUNCTION __S__.workflow_counts(p_job_id bigint)
RETURNS TABLE (workflow_id bigint, completed bigint, failed bigint, cancelled bigint, unfinished bigint)
LANGUAGE sql STABLE SET jit = off AS $$
    SELECT me.workflow_id,
           count(*) FILTER (WHERE r.outcome = 'completed'),
           count(*) FILTER (WHERE r.outcome = 'failed'),
           count(*) FILTER (WHERE r.outcome = 'cancelled'),
           count(*) FILTER (WHERE r.outcome IS NULL)
    FROM __S__.workflow_steps me
    JOIN __S__.workflow_steps s ON s.workflow_id = me.workflow_id AND s.job_id <> me.job_id
    LEFT JOIN LATERAL (SELECT x.outcome FROM __S__.workflow_results x
                       WHERE x.workflow_id = s.workflow_id AND x.step = s.step
                       ORDER BY x.finished_at DESC, x.run_lease DESC LIMIT 1) r ON true
    WHERE me.job_id = p_job_id
    GROUP BY me.workflow_id
$$;

-- ---------------------------------------------------------------------------------------------
-- Sequences (migration 0023): jobs that share a key run one at a time, in enqueue order. Each job
-- is a step (link-<n>) of the key's current workflow that depends on the key's previous job; the
-- next one is released when the previous is final, by the same evidence as any step. Policy on a
-- final failure, the next job's: 'run' (continue with it, the default), 'hold' (the rest waits
-- until the failed job, dead-lettered, is retried and completes; a failure nothing can retry
-- cancels the rest) or 'cancel' (the jobs waiting behind it are cancelled). Keys are independent: a key's waiting jobs are off the ring and never in another's way.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION __S__.validate_sequence_job(p_job jsonb) RETURNS void
LANGUAGE plpgsql SET jit = off AS $$
DECLARE
    v_extra text[];
BEGIN
    IF p_job IS NULL OR jsonb_typeof(p_job) <> 'object' THEN
        RAISE EXCEPTION 'ringwork: a sequence job is a job object (kind, args, queue, priority, max_attempts, timeout_ms, traceparent)'
            USING ERRCODE = '22023';
    END IF;
    SELECT array_agg(k ORDER BY k) INTO v_extra FROM jsonb_object_keys(p_job) k
    WHERE k NOT IN ('kind', 'args', 'queue', 'priority', 'max_attempts', 'timeout_ms', 'traceparent');
    IF v_extra IS NOT NULL THEN
        RAISE EXCEPTION 'ringwork: a sequence job has unknown fields %', v_extra USING ERRCODE = '22023';
    END IF;
    PERFORM __S__.validate_step_job(p_job, 'sequence job');
END
$$;

-- Many jobs appended to their keys in one statement, each key's jobs in the order given (a
-- producer's transaction of sequence jobs: the Rust client sorts them by key so that two
-- producers take the keys' locks in one order; keys are locked in the order of their first job).
-- Each job is a step (link-<n>) that depends on the job before it: the key's tail for its first
-- job in the call, the previous job of its key in the call for the others. Set-based over the
-- call: the keys' locks, their tails and new workflows are a few statements for all keys, and
-- the steps and edges of all jobs two writes (row by row, an append was a dozen statements). A
-- key's first job due at once (no tail, or a tail dead-lettered that counts as arrived) is
-- released with the others in one segment per queue (a segment each cost a shard lock, a
-- sequence, a segment row and a NOTIFY). The jobs' shapes are checked at once when all are plain
-- (workflow_step_plain), else one by one for the exact error. Returns each job's position in
-- the arrays (1-based) with its id.
CREATE OR REPLACE FUNCTION __S__.enqueue_in_sequence_many(p_keys text[], p_jobs jsonb[], p_on_failures text[])
RETURNS TABLE (ord int, job_id bigint)
LANGUAGE plpgsql SET jit = off SET enable_seqscan = off AS $$
DECLARE
    v_n int := coalesce(cardinality(p_keys), 0);
    v_plain boolean;
    v_max_args bigint;
    v_bad_policy text[];
    v_bad_key text[];
    v_unknown bigint;
    v_is_fresh boolean[];
    v_states text[];
    v_leases bigint[];
    v_state text;
    v_lease bigint;
    -- per key: its tail in its newest workflow
    v_tail_steps text[];
    v_tail_jobs bigint[];
    v_tail_waits boolean[];
    v_result_leases bigint[];
    v_result_outcomes text[];
    v_cancelled boolean[];
    v_key record;
    v_ids bigint[];
    v_links bigint[];
    v_now timestamptz;
    -- per key of the call, in the order of its first job: its newest workflow, then the one its
    -- jobs go to
    v_keys text[] := '{}';
    v_firsts int[] := '{}';
    v_newest bigint[];
    v_workflows bigint[] := '{}';
    v_tails text[] := '{}';
    v_first_policies text[];
    -- per key, whether its first job is due and how: 'release', 'arrive' behind a dead-lettered
    -- tail then release, 'cancel', or NULL (it waits)
    v_effects text[];
    v_release_workflows bigint[] := '{}';
    v_release_steps text[] := '{}';
BEGIN
    IF cardinality(p_keys) IS DISTINCT FROM cardinality(p_jobs)
       OR cardinality(p_keys) IS DISTINCT FROM cardinality(p_on_failures) THEN
        RAISE EXCEPTION 'ringwork: enqueue_in_sequence_many takes as many keys, jobs and policies, got %, % and %',
            cardinality(p_keys), cardinality(p_jobs), cardinality(p_on_failures) USING ERRCODE = '22023';
    END IF;
    -- each array is read by position (1..n) and by unnest, which agree only for lists
    IF v_n > 0 AND (array_ndims(p_keys) <> 1 OR array_ndims(p_jobs) <> 1 OR array_ndims(p_on_failures) <> 1
                    OR array_lower(p_keys, 1) <> 1 OR array_lower(p_jobs, 1) <> 1
                    OR array_lower(p_on_failures, 1) <> 1) THEN
        RAISE EXCEPTION 'ringwork: enqueue_in_sequence_many takes lists (one-dimensional arrays from 1) of keys, jobs and policies'
            USING ERRCODE = '22023';
    END IF;
    IF v_n = 0 THEN
        RETURN;
    END IF;
    v_max_args := __S__.setting('max_args_bytes');
    v_plain := (SELECT coalesce(bool_and(__S__.workflow_step_plain(e, false, v_max_args)), false) FROM unnest(p_jobs) e);
    IF v_plain IS NOT TRUE THEN
        FOR i IN 1 .. v_n LOOP
            PERFORM __S__.validate_sequence_job(p_jobs[i]);
        END LOOP;
    END IF;
    -- the keys, each with the position and policy of its first job, and the first bad policy and
    -- bad key if any (one statement: at a job a call, each statement's start is a large share)
    SELECT array_agg(x.k ORDER BY x.i), array_agg(x.i::int ORDER BY x.i), array_agg(x.f ORDER BY x.i),
           (SELECT ARRAY[f] FROM unnest(p_on_failures) f WHERE f IS NULL OR f NOT IN ('run', 'hold', 'cancel') LIMIT 1),
           (array_agg(ARRAY[x.k] ORDER BY x.i) FILTER (WHERE NOT coalesce(__S__.valid_name(x.k), false)))[1:1]
    INTO v_keys, v_firsts, v_first_policies, v_bad_policy, v_bad_key
    FROM (SELECT DISTINCT ON (u.k) u.k, u.i, u.f FROM unnest(p_keys, p_on_failures) WITH ORDINALITY u(k, f, i)
          ORDER BY u.k, u.i) x;
    IF v_bad_policy IS NOT NULL THEN
        RAISE EXCEPTION 'ringwork: on a failure a sequence continues (run), holds (hold) or cancels its waiting jobs (cancel), got %',
            quote_nullable(v_bad_policy[1]) USING ERRCODE = '22023';
    END IF;
    IF v_bad_key IS NOT NULL THEN
        RAISE EXCEPTION 'ringwork: invalid sequence key %: must be 1..128 bytes without control or invisible format characters',
            quote_nullable(v_bad_key[1][1]) USING ERRCODE = '22023';
    END IF;
    -- the keys' locks (two producers append to a key one after the other), in the order of their
    -- first job; then their newest workflows' locks in id order, the order a completion batch
    -- takes them (lock_workflows_of), so an append and a completion never wait for each other in
    -- a cycle (key by key, a key's workflow then the next key's lock, they could)
    PERFORM pg_advisory_xact_lock(__S__.lock_ns('sequence'), hashtext(k.k))
    FROM unnest(v_keys) WITH ORDINALITY k(k, n) ORDER BY k.n;
    v_newest := ARRAY(SELECT (SELECT max(q.workflow_id) FROM __S__.workflow_sequences q WHERE q.sequence_key = k.k)
                      FROM unnest(v_keys) WITH ORDINALITY k(k, n) ORDER BY k.n);
    PERFORM __S__.lock_workflow(w.id)
    FROM (SELECT DISTINCT x.id FROM unnest(v_newest) x(id) WHERE x.id IS NOT NULL ORDER BY 1) w;
    -- each key's tail in its newest workflow, for all keys in one statement: its last job
    -- (skipping jobs cancelled while they waited: they never had a turn), whether it was
    -- released, its latest result, and whether the workflow was cancelled; each a lookup of its
    -- own key by index (sequential scans are off in this function: a plan whose estimate for one
    -- workflow counts a 10,000-step fan-out's rows scanned workflow_steps whole at every append)
    SELECT array_agg(t.step ORDER BY k.n), array_agg(t.job_id ORDER BY k.n),
           array_agg(NOT EXISTS (SELECT 1 FROM __S__.workflow_released r
                                 WHERE r.workflow_id = k.id AND r.step = t.step) ORDER BY k.n),
           array_agg(x.run_lease ORDER BY k.n), array_agg(x.outcome ORDER BY k.n),
           array_agg(EXISTS (SELECT 1 FROM __S__.workflow_cancels c WHERE c.workflow_id = k.id) ORDER BY k.n)
    INTO v_tail_steps, v_tail_jobs, v_tail_waits, v_result_leases, v_result_outcomes, v_cancelled
    FROM unnest(v_newest) WITH ORDINALITY k(id, n)
    LEFT JOIN LATERAL (SELECT s.step, s.job_id FROM __S__.workflow_steps s
                       WHERE s.workflow_id = k.id
                         AND NOT EXISTS (SELECT 1 FROM __S__.workflow_results r
                                         WHERE r.workflow_id = s.workflow_id AND r.step = s.step
                                           AND r.outcome = 'cancelled' AND r.run_lease = 0)
                       ORDER BY s.job_id DESC LIMIT 1) t ON true
    LEFT JOIN LATERAL (SELECT r.run_lease, r.outcome FROM __S__.workflow_results r
                       WHERE r.workflow_id = k.id AND r.step = t.step
                       ORDER BY r.run_lease DESC LIMIT 1) x ON true;
    -- each key's tail's state, known from the rows read above in the common cases: never
    -- released (under the workflow's lock, so it cannot be meanwhile) and not cancelled (skipped
    -- above), it waits behind its own tail, as job_state's search of every plane would say
    -- ('pending', its step row alone), so a key with a backlog appends in constant time; released
    -- and never settled, it is available, running or waiting for a retry, not final (every path
    -- that ends a job or dead-letters it settles its step, a result row, in that transaction,
    -- under the workflow lock held here); its last attempt completed or was cancelled, it is
    -- final (only a dead-lettered job is retried, and its result says failed; a result is written
    -- by the attempt's own end, under the run-lease guard, so no later attempt exists)
    SELECT array_agg(x.state ORDER BY x.n), count(*) FILTER (WHERE x.tail IS NOT NULL AND x.state IS NULL)
    INTO v_states, v_unknown
    FROM (SELECT k.n, k.tail,
                 CASE WHEN k.tail IS NULL THEN NULL
                      WHEN k.waits THEN 'pending'
                      WHEN k.result_lease IS NULL THEN 'unsettled'
                      WHEN k.outcome IN ('completed', 'cancelled') THEN k.outcome END AS state
          FROM unnest(v_tail_steps, v_tail_waits, v_result_leases, v_result_outcomes)
               WITH ORDINALITY k(tail, waits, result_lease, outcome, n)) x;
    v_leases := array_fill(NULL::bigint, ARRAY[cardinality(v_keys)]);
    -- the rest (a failure, dead-lettered or retried since) ask job_state's search of every plane
    -- (about 1.5 ms)
    IF v_unknown > 0 THEN
        FOR v_key IN SELECT k.n FROM unnest(v_tail_steps, v_states) WITH ORDINALITY k(tail, state, n)
                     WHERE k.tail IS NOT NULL AND k.state IS NULL LOOP
            SELECT j.state, j.run_lease INTO v_state, v_lease FROM __S__.job_state(v_tail_jobs[v_key.n]) j;
            v_states[v_key.n] := v_state;
            v_leases[v_key.n] := v_lease;
        END LOOP;
    END IF;
    -- a key whose last job is final starts a new workflow, so the old one can expire, and its
    -- first job is due. A dead-lettered job is not final (it may be retried, and a held job waits
    -- for it), nor is one retried since its result (waiting again, or running at a higher lease);
    -- one whose dead-letter entry was purged is (its claim's rows alone look like a running
    -- attempt). Behind a dead-lettered tail the first job is due by its own policy
    SELECT array_agg(f.fresh ORDER BY k.n),
           array_agg(CASE WHEN f.fresh THEN NULL ELSE k.tail END ORDER BY k.n),
           array_agg(e.effect ORDER BY k.n)
    INTO v_is_fresh, v_tails, v_effects
    FROM unnest(v_tail_steps, v_states, v_leases, v_result_leases, v_cancelled, v_first_policies)
         WITH ORDINALITY k(tail, state, lease, result_lease, cancelled, first_policy, n)
    CROSS JOIN LATERAL (
        SELECT coalesce(k.tail IS NULL OR k.state IN ('completed', 'failed', 'cancelled')
                        OR (k.state = 'running' AND k.lease <= k.result_lease) OR k.cancelled, false) AS fresh) f
    CROSS JOIN LATERAL (
        SELECT CASE WHEN f.fresh THEN 'release'
                    WHEN k.state = 'dead_lettered' THEN
                        CASE __S__.workflow_edge_effect('dead_lettered', k.first_policy)
                            WHEN 'arrived' THEN 'arrive' WHEN 'cancel' THEN 'cancel' END
               END AS effect) e;
    -- a new workflow for each key that starts one, created together (invisible to every other
    -- transaction until this one commits, so no lock is needed on them)
    v_now := __S__.engine_now();
    IF true = ANY (v_is_fresh) THEN
        SELECT array_agg(CASE WHEN x.fresh THEN nextval('__S__.workflow_ids') ELSE x.id END ORDER BY x.n)
        INTO v_workflows
        FROM unnest(v_newest, v_is_fresh) WITH ORDINALITY AS x(id, fresh, n);
        WITH created AS (
            INSERT INTO __S__.workflows (workflow_id, created_at)
            SELECT x.id, v_now FROM unnest(v_workflows, v_is_fresh) x(id, fresh) WHERE x.fresh
        )
        INSERT INTO __S__.workflow_sequences (sequence_key, workflow_id)
        SELECT x.k, x.id FROM unnest(v_keys, v_workflows, v_is_fresh) x(k, id, fresh) WHERE x.fresh;
    ELSE
        v_workflows := v_newest;
    END IF;
    -- ids in ascending order by position: a key's tail is its step with the highest job id
    SELECT array_agg(x.job_id ORDER BY x.job_id), array_agg(x.link ORDER BY x.link) INTO v_ids, v_links
    FROM (SELECT nextval('__S__.job_ids') AS job_id, nextval('__S__.sequence_link_ids') AS link
          FROM generate_series(1, v_n)) x;
    -- (arrays are read by unnest, not subscripted by position: a subscript of a PL/pgSQL array in
    -- a statement cost about 3 µs a row)
    WITH jobs AS (
        SELECT t.workflow_id, 'link-' || u.link AS step, u.job_id, u.job, u.on_failure,
               coalesce(lag('link-' || u.link) OVER (PARTITION BY u.k ORDER BY u.i), t.tail) AS depends_on
        FROM unnest(p_keys, p_jobs, p_on_failures, v_ids, v_links) WITH ORDINALITY u(k, job, on_failure, job_id, link, i)
        JOIN unnest(v_keys, v_workflows, v_tails) t(k, workflow_id, tail) ON t.k = u.k
    ), steps AS (
        INSERT INTO __S__.workflow_steps (workflow_id, step, job_id, queue, kind, args, priority, max_attempts,
                                          timeout_ms, traceparent, on_dependency_failure, dependencies, created_at)
        SELECT j.workflow_id, j.step, j.job_id, coalesce(j.job->>'queue', 'default'), j.job->>'kind',
               coalesce(j.job->'args', '{}'::jsonb), coalesce((j.job->>'priority')::int, 2)::smallint,
               coalesce((j.job->>'max_attempts')::int, 25), (j.job->>'timeout_ms')::int,
               __S__.traceparent_bytes(j.job->>'traceparent'), j.on_failure,
               CASE WHEN j.depends_on IS NULL THEN 0 ELSE 1 END, v_now
        FROM jobs j
    )
    INSERT INTO __S__.workflow_edges (workflow_id, depends_on, step)
    SELECT j.workflow_id, j.depends_on, j.step FROM jobs j WHERE j.depends_on IS NOT NULL;
    -- the keys' first jobs that are due: released together; behind a dead-lettered tail, arrived
    -- (then released) or cancelled by their policy
    -- (behind a dead-lettered tail: rare, and a statement only then)
    IF 'cancel' = ANY (v_effects) OR 'arrive' = ANY (v_effects) THEN
        FOR v_key IN SELECT x.workflow_id, 'link-' || l.link AS step, x.tail, x.effect
                     FROM unnest(v_workflows, v_firsts, v_tails, v_effects) x(workflow_id, first, tail, effect)
                     JOIN unnest(v_links) WITH ORDINALITY l(link, at) ON l.at = x.first
                     WHERE x.effect IN ('cancel', 'arrive') LOOP
            IF v_key.effect = 'cancel' THEN
                PERFORM __S__.workflow_settle_steps(v_key.workflow_id, ARRAY[v_key.step], ARRAY[0::bigint],
                                                    ARRAY['cancelled']);
            ELSE
                PERFORM __S__.workflow_arrive(v_key.workflow_id, v_key.step, v_key.tail, 1);
            END IF;
        END LOOP;
    END IF;
    IF 'release' = ANY (v_effects) OR 'arrive' = ANY (v_effects) THEN
        SELECT array_agg(x.workflow_id ORDER BY x.n), array_agg('link-' || l.link ORDER BY x.n)
        INTO v_release_workflows, v_release_steps
        FROM unnest(v_workflows, v_firsts, v_effects) WITH ORDINALITY x(workflow_id, first, effect, n)
        JOIN unnest(v_links) WITH ORDINALITY l(link, at) ON l.at = x.first
        WHERE x.effect IN ('release', 'arrive');
        PERFORM __S__.workflow_release_many(v_release_workflows, v_release_steps);
    END IF;
    RETURN QUERY SELECT u.at::int, u.job_id FROM unnest(v_ids) WITH ORDINALITY u(job_id, at);
END
$$;

-- One job appended to its key.
CREATE OR REPLACE FUNCTION __S__.enqueue_in_sequence(p_key text, p_job jsonb, p_on_failure text DEFAULT 'run')
RETURNS bigint
LANGUAGE sql AS $$
    SELECT m.job_id FROM __S__.enqueue_in_sequence_many(ARRAY[p_key], ARRAY[p_job], ARRAY[p_on_failure]) m
$$;

-- The key's jobs that are not final, oldest first (the head is running or available, the rest
-- pending), and each one's state.
CREATE OR REPLACE FUNCTION __S__.sequence_pending(p_key text, p_limit int DEFAULT 100)
RETURNS TABLE (job_id bigint, state text)
LANGUAGE sql STABLE SET jit = off AS $$
    SELECT s.job_id, coalesce((SELECT j.state FROM __S__.job_state(s.job_id) j), 'pending')
    FROM __S__.workflow_sequences q
    JOIN __S__.workflow_steps s ON s.workflow_id = q.workflow_id
    WHERE q.sequence_key = p_key
      AND (NOT EXISTS (SELECT 1 FROM __S__.workflow_results r WHERE r.workflow_id = s.workflow_id AND r.step = s.step)
           OR EXISTS (SELECT 1 FROM __S__.dlq_entries d WHERE d.job_id = s.job_id))
    ORDER BY s.job_id LIMIT p_limit
$$;

-- Workflows kept, by kind and state: running while a step has no outcome, then failed (a step
-- failed for good), cancelled (a step was cancelled) or completed. Reads the steps of every
-- workflow kept: bounded by retention (keep_completed after a workflow's last step).
CREATE OR REPLACE FUNCTION __S__.workflows_by_state()
RETURNS TABLE (kind text, state text, n bigint)
LANGUAGE sql STABLE SET jit = off AS $$
    WITH per AS (
        SELECT s.workflow_id,
               CASE WHEN bool_or(r.outcome IS NULL) THEN 'running'
                    WHEN bool_or(r.outcome = 'failed') THEN 'failed'
                    WHEN bool_or(r.outcome = 'cancelled') THEN 'cancelled'
                    ELSE 'completed' END AS state
        FROM __S__.workflow_steps s
        LEFT JOIN LATERAL (SELECT x.outcome FROM __S__.workflow_results x
                           WHERE x.workflow_id = s.workflow_id AND x.step = s.step
                           ORDER BY x.finished_at DESC, x.run_lease DESC LIMIT 1) r ON true
        GROUP BY s.workflow_id
    )
    SELECT CASE WHEN EXISTS (SELECT 1 FROM __S__.workflow_batches b WHERE b.workflow_id = p.workflow_id)
                    THEN 'batch'
                WHEN EXISTS (SELECT 1 FROM __S__.workflow_sequences q WHERE q.workflow_id = p.workflow_id)
                    THEN 'sequence'
                ELSE 'workflow' END,
           p.state, count(*)
    FROM per p GROUP BY 1, 2
$$;

-- A dead-lettered step whose entry is deleted other than by a retry (a purge, retention) can never
-- complete: the steps held by it (policy hold) are cancelled, as if it had failed where nothing can
-- retry it. dlq_retry schedules the job before it deletes the entry, so a retried job is told
-- apart by its deferred row.
CREATE OR REPLACE FUNCTION __S__.workflow_dead_letter_gone() RETURNS trigger
LANGUAGE plpgsql SET jit = off AS $$
DECLARE
    v_jobs bigint[];
    v_workflows bigint[];
    v_steps text[];
BEGIN
    SELECT array_agg(g.job_id) INTO v_jobs FROM gone g
    WHERE NOT EXISTS (SELECT 1 FROM __S__.deferred_jobs x WHERE x.job_id = g.job_id);
    IF v_jobs IS NULL OR NOT __S__.lock_workflows_of(v_jobs) THEN
        RETURN NULL;
    END IF;
    SELECT array_agg(d.workflow_id), array_agg(d.step) INTO v_workflows, v_steps
    FROM __S__.workflow_steps s
    JOIN __S__.workflow_edges e ON e.workflow_id = s.workflow_id AND e.depends_on = s.step
    JOIN __S__.workflow_steps d ON d.workflow_id = e.workflow_id AND d.step = e.step
    WHERE s.job_id = ANY (v_jobs) AND d.on_dependency_failure = 'hold'
      AND NOT EXISTS (SELECT 1 FROM __S__.workflow_released r WHERE r.workflow_id = d.workflow_id AND r.step = d.step)
      AND NOT EXISTS (SELECT 1 FROM __S__.workflow_results r WHERE r.workflow_id = d.workflow_id AND r.step = d.step);
    IF v_steps IS NOT NULL THEN
        PERFORM __S__.workflow_settle_many(v_workflows, v_steps, array_fill(0::bigint, ARRAY[cardinality(v_steps)]),
                                          array_fill('cancelled'::text, ARRAY[cardinality(v_steps)]));
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER workflow_dead_letter_gone AFTER DELETE ON __S__.dlq_entries
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION __S__.workflow_dead_letter_gone();
