-- Reads: a job's state and history, exact per-queue counts. No writes.
--
-- Every function of the engine is defined exactly once, in the file of its plane, and installed with
-- CREATE OR REPLACE by src/schema.rs whenever the combined hash of these files changes. A function
-- that is removed is dropped by name in dropped.sql. __S__ is the validated schema name.

-- job_state learns about the DLQ.
-- A time every reader can decode. PostgreSQL keeps -infinity, infinity and years up to 294276; a
-- client decodes far less (chrono: year 262143). The enqueue checks refuse such times now
-- (validate_run_at), and the readers' statements pass stored times through this, so a row stored
-- before them lists at the bound instead of failing the page it is on.
CREATE OR REPLACE FUNCTION __S__.readable_time(p_at timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT least(greatest(p_at, '0001-01-01 00:00:00+00'::timestamptz), '9999-12-31 23:59:59+00'::timestamptz)
$$;

CREATE OR REPLACE FUNCTION __S__.job_state(p_job_id bigint)
RETURNS TABLE (state text, queue text, kind text, attempt int, run_lease bigint, detail text)
-- jit off: one job's rows, found by index in every partition; the plan's cost over all of them
-- can pass jit_above_cost, and compiling it took seconds for a lookup of milliseconds.
-- PL/pgSQL with a generic plan, not SQL: a SQL function with this body is planned at every call,
-- over every partition of every table it reads (about 5 ms, most of the call); the job id is not a
-- partition key, so a custom plan prunes nothing and the cached generic plan is the same plan
-- (about 1.3 ms a call). Every column is qualified: the result's names are variables here.
LANGUAGE plpgsql STABLE SET jit = off SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    RETURN QUERY
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
        -- finished and archived (sql/functions/archive.sql): its slot is gone
        SELECT a.state, a.queue, a.kind, a.attempt, a.run_lease, a.error, 1
        FROM __S__.archived_job(p_job_id) a
        WHERE NOT EXISTS (SELECT 1 FROM __S__.deferred_jobs x WHERE x.job_id = p_job_id AND x.run_lease > a.run_lease)
        UNION ALL
        -- waiting for a callback (migration 0015): its claim is closed, its lease carries it
        SELECT 'waiting', l.queue, l.kind, l.attempt, l.run_lease,
               'waiting for a callback until ' || to_char(l.timeout_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS UTC'), 1
        FROM __S__.leases l WHERE l.job_id = p_job_id AND l.state = 'waiting'
        UNION ALL
        -- held under a key limit (migration 0012): waiting like any available job
        SELECT CASE WHEN d.held_key IS NOT NULL THEN 'available'
                    WHEN d.attempt = 0 THEN 'scheduled' ELSE 'retryable' END, d.queue, d.kind, d.attempt,
               d.run_lease, CASE WHEN d.held_key IS NOT NULL THEN 'held: key at its limit' ELSE d.last_error END, 2
        FROM __S__.deferred_jobs d WHERE d.job_id = p_job_id
        UNION ALL
        -- parked (sql/functions/parking.sql): waiting like any available job, or cancelled while
        -- it waited (its cancel row may be gone from the archive long before the parked row)
        SELECT CASE WHEN p.cancelled THEN 'cancelled' ELSE 'available' END, p.queue, p.kind, p.attempt,
               p.run_lease, 'parked', 3
        FROM __S__.parked_entries p WHERE p.job_id = p_job_id
        UNION ALL
        SELECT 'completed', r.queue, r.kind, r.attempt + 1, r.run_lease + 1, NULL, 3
        FROM ready r WHERE EXISTS (SELECT 1 FROM __S__.receipt_completion_batches c
                                   WHERE c.ready_slot = r.ready_slot AND p_job_id = ANY (c.job_ids)
                                     AND (r.run_lease + 1) = ANY (c.run_leases))
        UNION ALL
        -- a workflow step waiting for its dependencies (workflows.sql), or cancelled before its
        -- release: it has no job row yet
        SELECT coalesce(x.outcome, 'pending'), s.queue, s.kind, 0, 0,
               CASE WHEN x.outcome IS NULL THEN
                   'waiting for ' || (s.dependencies - (SELECT coalesce(max(a.seen), 0) FROM __S__.workflow_arrivals a
                                                         WHERE a.workflow_id = s.workflow_id AND a.step = s.step))
                   || ' of ' || s.dependencies || ' dependencies' END, 5
        FROM __S__.workflow_steps s
        LEFT JOIN LATERAL (SELECT r.outcome FROM __S__.workflow_results r
                           WHERE r.workflow_id = s.workflow_id AND r.step = s.step LIMIT 1) x ON true
        WHERE s.job_id = p_job_id
          AND NOT EXISTS (SELECT 1 FROM __S__.workflow_released r WHERE r.workflow_id = s.workflow_id AND r.step = s.step)
        UNION ALL
        SELECT x.state, r.queue, r.kind,
               CASE WHEN x.state = 'running' THEN r.attempt + 1 ELSE r.attempt END,
               CASE WHEN x.state = 'running' THEN r.run_lease + 1 ELSE r.run_lease END, NULL, 4
        FROM ready r,
             LATERAL (SELECT CASE WHEN EXISTS (SELECT 1 FROM __S__.ready_tombstones t
                                               WHERE t.ready_slot = r.ready_slot AND t.job_id = r.job_id
                                                 AND t.run_lease = r.run_lease) THEN 'cancelled'
                                  WHEN r.lane_pos > __S__.lane_cursor(r.lane_id) THEN 'available'
                                  ELSE 'running' END AS state) x
    ) s ORDER BY s.rank LIMIT 1;
END
$$;

-- Exact counts per queue, in every state (one queue, or all).
--
-- A slot's TRUNCATE (prune, park) and a totals bucket's (fold) are not MVCC-safe: a statement whose
-- snapshot was taken before one of them committed, and that then waited for its lock, finds the
-- slot empty and the rows the same transaction recorded instead (terminal_totals, parked_entries)
-- invisible, and undercounts. So the count first takes ACCESS SHARE on the tables those
-- transactions truncate (waiting out any in progress), and only then runs, in a statement of its
-- own with a snapshot taken after them: VOLATILE, so that PL/pgSQL gives it a new snapshot.
--
-- Counting a queue reads the sequences of its 32 shards, and each stays locked to the end of the
-- transaction: over every queue of a schema with a few hundred queues, one call takes more locks
-- than the server's lock table holds ("out of shared memory"). Count many queues a few at a time,
-- each call in its own transaction (queue_counts_page, as Storage::queue_counts does).
CREATE OR REPLACE FUNCTION __S__.queue_counts(p_queue text DEFAULT NULL)
RETURNS TABLE (queue text, paused boolean, available bigint, scheduled bigint, retryable bigint, running bigint,
               completed bigint, failed bigint, cancelled bigint, dead_lettered bigint, waiting bigint,
               pending bigint)
-- jit off: a custom plan of this statement over every ring partition can estimate above
-- jit_above_cost, and compiling it took about a second for a count that runs in milliseconds.
-- A generic plan, kept for the session: its probes are by queue through an index in every
-- partition either way, and a custom plan made per call (per queue, on a page of queues) cost
-- more than the count (a queue's count took 4.7-6.7 ms with custom plans, 2.3-3.0 ms without).
LANGUAGE plpgsql VOLATILE SET jit = off SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
BEGIN
    LOCK TABLE __S__.ready_entries, __S__.ready_segments, __S__.receipt_completion_batches,
               __S__.done_entries, __S__.terminal_totals IN ACCESS SHARE MODE;
    RETURN QUERY
    SELECT q.queue, q.paused,
           (SELECT coalesce(sum(__S__.lane_available(l.lane_id)), 0)::bigint
            FROM __S__.queue_lanes l WHERE l.queue = q.queue) + __S__.parked_count(q.queue)
           + (SELECT count(*) FROM __S__.deferred_jobs d WHERE d.queue = q.queue AND d.held_key IS NOT NULL),
           (SELECT count(*) FROM __S__.deferred_jobs d
            WHERE d.queue = q.queue AND d.attempt = 0 AND d.held_key IS NULL),
           (SELECT count(*) FROM __S__.deferred_jobs d
            WHERE d.queue = q.queue AND d.attempt > 0 AND d.held_key IS NULL),
           __S__.count_in_flight(q.queue)::bigint,
           -- terminal counts are durable totals: what the ring still holds plus what prune recorded
           -- in terminal_totals for the slots it truncated (archive.sql)
           (SELECT coalesce(sum(b.completed_count), 0)::bigint
            FROM __S__.receipt_completion_batches b WHERE b.queue = q.queue)
           + (SELECT count(*) FROM __S__.done_entries d WHERE d.queue = q.queue AND d.state = 'completed')
           + tt.completed,
           (SELECT count(*) FROM __S__.done_entries d WHERE d.queue = q.queue AND d.state = 'failed')
           + tt.failed,
           (SELECT count(*) FROM __S__.done_entries d WHERE d.queue = q.queue AND d.state = 'cancelled')
           + tt.cancelled,
           (SELECT count(*) FROM __S__.dlq_entries d WHERE d.queue = q.queue),
           __S__.waiting_count(q.queue),
           -- workflow steps waiting for the jobs before them: not released, not ended (cancelled
           -- before their release); through the steps' queue index (migration 0025)
           (SELECT count(*) FROM __S__.workflow_steps s
            WHERE s.queue = q.queue
              AND NOT EXISTS (SELECT 1 FROM __S__.workflow_released r
                              WHERE r.workflow_id = s.workflow_id AND r.step = s.step)
              AND NOT EXISTS (SELECT 1 FROM __S__.workflow_results r
                              WHERE r.workflow_id = s.workflow_id AND r.step = s.step))
    FROM __S__.queues q
    CROSS JOIN LATERAL (
        SELECT coalesce(sum(t.completed), 0)::bigint AS completed, coalesce(sum(t.failed), 0)::bigint AS failed,
               coalesce(sum(t.cancelled), 0)::bigint AS cancelled
        FROM __S__.terminal_totals t WHERE t.queue = q.queue
    ) tt
    WHERE p_queue IS NULL OR q.queue = p_queue
    ORDER BY q.queue;
END
$$;

-- One page of queues in name order (after p_after; with p_contains, only names that hold it) and
-- their exact counts: a page over a thousand queues counts only the ones it shows.
-- queue_counts for each named queue, in name order (a name that is not a queue gives no row). A
-- reader that knows a page's names counts it a few queues per call, several calls at once.
CREATE OR REPLACE FUNCTION __S__.queue_counts_of(p_queues text[])
RETURNS TABLE (queue text, paused boolean, available bigint, scheduled bigint, retryable bigint, running bigint,
               completed bigint, failed bigint, cancelled bigint, dead_lettered bigint, waiting bigint,
               pending bigint)
LANGUAGE sql STABLE SET jit = off AS $$
    SELECT c.* FROM __S__.queues q CROSS JOIN LATERAL __S__.queue_counts(q.queue) c
    WHERE q.queue = ANY (p_queues)
    ORDER BY c.queue
$$;

CREATE OR REPLACE FUNCTION __S__.queue_counts_page(p_after text, p_contains text, p_limit int)
RETURNS TABLE (queue text, paused boolean, available bigint, scheduled bigint, retryable bigint, running bigint,
               completed bigint, failed bigint, cancelled bigint, dead_lettered bigint, waiting bigint,
               pending bigint)
LANGUAGE sql STABLE SET jit = off AS $$
    SELECT c.* FROM (
        SELECT q.queue FROM __S__.queues q
        WHERE (p_after IS NULL OR q.queue > p_after)
          AND (p_contains IS NULL OR strpos(q.queue, p_contains) > 0)
        ORDER BY q.queue LIMIT greatest(p_limit, 0)
    ) page CROSS JOIN LATERAL __S__.queue_counts(page.queue) c
    ORDER BY c.queue
$$;

-- How long the queue's oldest available job has waited since its run_at, or NULL when none: one
-- index probe (the head of the lane past its cursor) per shard that may hold work, plus the oldest
-- parked job; never a scan of job rows. A cancelled job at a lane's head counts until a claim steps
-- past it; a job still in its producer's open transaction is not visible, so it does not count.
-- The wait is on the engine's clock (clock.sql), as the promotion that made the job due is.
CREATE OR REPLACE FUNCTION __S__.oldest_available_wait(p_queue text) RETURNS interval
-- PL/pgSQL with a generic plan kept for the session: as a SQL function (not inlined, for its SET)
-- it was planned at every call, over every ready_entries partition: about 3 ms a queue, for a
-- probe that runs in a fraction of that (the dashboard's overview asks it for every queue shown)
LANGUAGE plpgsql STABLE SET jit = off SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    RETURN (SELECT __S__.engine_now() - min(h.run_at) FROM (
        SELECT (SELECT e.run_at FROM __S__.ready_entries e
                WHERE e.lane_id = l.lane_id AND e.lane_pos > __S__.lane_cursor(l.lane_id)
                ORDER BY e.lane_pos LIMIT 1) AS run_at
        FROM __S__.queue_lanes l
        WHERE l.queue = p_queue
          AND __S__.shard_may_have_work(pg_sequence_last_value(l.segment_seq),
                                        pg_sequence_last_value(l.cursor_seq))
        UNION ALL
        SELECT min(p.run_at) FROM __S__.parked_entries p WHERE p.queue = p_queue AND NOT p.cancelled
    ) h);
END
$$;

-- When a process last claimed from the queue: the newest claim-ledger row of each of its lanes
-- (one index probe per lane and queue slot), on the engine's clock as the claim wrote it. NULL
-- when the ring holds none (never claimed, or not within a ring cycle). A claim that found nothing
-- writes no row, so a queue held back by its own rate limit reads as unclaimed too.
CREATE OR REPLACE FUNCTION __S__.queue_last_claim(p_queue text) RETURNS timestamptz
LANGUAGE sql STABLE SET jit = off AS $$
    SELECT max((SELECT a.attempted_at FROM __S__.ready_claim_attempt_batches a
                WHERE a.lane_id = l.lane_id ORDER BY upper(a.lane_range) DESC LIMIT 1))
    FROM __S__.queue_lanes l
    WHERE l.queue = p_queue
$$;

-- One job's recorded history, oldest attempt first: its terminal rows (completed, failed,
-- cancelled), earlier failed attempts carried in deferred_jobs.last_error, and a dead-letter entry.
CREATE OR REPLACE FUNCTION __S__.job_history(p_job_id bigint)
RETURNS TABLE (run_lease bigint, state text, error text, at timestamptz)
-- jit off: one job's rows, found by index in every partition; the plan's cost over all of them
-- can pass jit_above_cost, and compiling it took seconds for a lookup of milliseconds
LANGUAGE sql STABLE SET jit = off AS $$
    SELECT h.run_lease, h.state, h.error, h.at FROM (
        SELECT t.run_lease, t.state, t.error, t.finalized_at AS at
        FROM __S__.terminal_jobs t WHERE t.job_id = p_job_id
        UNION ALL
        SELECT a.run_lease, a.state, a.error, a.finalized_at FROM __S__.archived_job(p_job_id) a
        UNION ALL
        SELECT d.run_lease,
               CASE WHEN d.held_key IS NOT NULL THEN 'available'
                    WHEN d.attempt = 0 THEN 'scheduled' ELSE 'retryable' END,
               d.last_error, CASE WHEN d.held_key IS NOT NULL THEN d.created_at ELSE d.run_at END
        FROM __S__.deferred_jobs d WHERE d.job_id = p_job_id
        UNION ALL
        SELECT x.run_lease, 'dead_lettered', x.error, x.failed_at
        FROM __S__.dlq_entries x WHERE x.job_id = p_job_id
    ) h
    ORDER BY h.run_lease, h.at
$$;

-- Jobs waiting to run (available, scheduled, retryable; parked ones as available), optionally of
-- one queue and one kind, oldest first. Seen from the caller's transaction, so it lists jobs that
-- transaction enqueued and has not committed (what a test asserts). Reads the ready rows above each
-- lane's cursor: for tests and small inspections, not for scraping a large queue.
CREATE OR REPLACE FUNCTION __S__.pending_jobs(p_queue text DEFAULT NULL, p_kind text DEFAULT NULL,
                                             p_limit int DEFAULT 1000)
RETURNS TABLE (job_id bigint, state text, queue text, kind text, args jsonb, priority smallint, attempt int,
               run_at timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT p.job_id, p.state, p.queue, p.kind, p.args, p.priority, p.attempt, p.run_at FROM (
        SELECT e.job_id, 'available' AS state, e.queue, e.kind, e.args, e.priority, e.attempt, e.run_at
        FROM __S__.queue_lanes l
        JOIN __S__.ready_entries e ON e.lane_id = l.lane_id AND e.lane_pos > __S__.lane_cursor(l.lane_id)
        WHERE (p_queue IS NULL OR l.queue = p_queue) AND (p_kind IS NULL OR e.kind = p_kind)
          AND NOT EXISTS (SELECT 1 FROM __S__.ready_tombstones t
                          WHERE t.ready_slot = e.ready_slot AND t.job_id = e.job_id AND t.run_lease = e.run_lease)
        UNION ALL
        SELECT d.job_id, CASE WHEN d.held_key IS NOT NULL THEN 'available'
                              WHEN d.attempt = 0 THEN 'scheduled' ELSE 'retryable' END, d.queue, d.kind, d.args,
               d.priority, d.attempt, CASE WHEN d.held_key IS NOT NULL THEN d.created_at ELSE d.run_at END
        FROM __S__.deferred_jobs d
        WHERE (p_queue IS NULL OR d.queue = p_queue) AND (p_kind IS NULL OR d.kind = p_kind)
        UNION ALL
        SELECT x.job_id, 'available', x.queue, x.kind, x.args, x.priority, x.attempt, x.run_at
        FROM __S__.parked_entries x
        WHERE NOT x.cancelled AND (p_queue IS NULL OR x.queue = p_queue) AND (p_kind IS NULL OR x.kind = p_kind)
    ) p ORDER BY p.run_at, p.job_id LIMIT p_limit
$$;

-- The last progress recorded for a job (by its running attempt, or left by an earlier attempt that
-- was retried, snoozed or rescued), with the run_lease that recorded it and when.
CREATE OR REPLACE FUNCTION __S__.job_progress(p_job_id bigint)
RETURNS TABLE (run_lease bigint, progress jsonb, recorded_at timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT a.run_lease, a.progress, a.heartbeat_at FROM __S__.attempt_state a
    WHERE a.job_id = p_job_id AND a.progress IS NOT NULL
    ORDER BY a.run_lease DESC LIMIT 1
$$;

-- ---------------------------------------------------------------------------------------------
-- Job listings for the dashboard: one page of jobs of one state, optionally of one queue
-- and one kind, with keyset paging. Each row carries its page_key; the next page passes the last
-- row's page_key as p_after (NULL: the first page). The backlog tables (deferred, parked, DLQ,
-- leases) and the archive are walked by index from the page key, stopping after p_limit rows;
-- waiting jobs in the ring are walked lane by lane from each lane's cursor. What the rings hold of
-- finished and running jobs (the last few rotations: seconds to minutes of history) is read
-- whole for the queue and sorted, as exact counts read it:
--   available:  lane by lane, highest priority first (ready_entries by (lane_id, lane_pos) past
--               the lane's cursor: each lane in its pickup order; claims interleave the lanes of a
--               priority and age lower ones), then parked jobs and jobs held under a key limit, by job id;
--   scheduled, retryable: by job id (deferred_jobs' primary key);
--   running:    by job id, from the open claims (the claim ring: a few seconds of claims);
--   waiting:    by job id, from the lease ring (jobs waiting for a callback);
--   completed, failed, cancelled: newest first by (finalized_at, job_id): the ring's history rows,
--               then the archive's (a completion batch is one row: its jobs are unnested);
--   dead_lettered: newest first by (failed_at, job_id).
-- A kind filter is applied on the rows walked, so a rare kind in a large state walks further.
-- A row with a NULL job_id ends a short page that is not the last: it holds only the page key to
-- go on from (the available walk reads a bounded number of shards per call; see below).
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION __S__.list_jobs(p_queue text, p_state text, p_kind text, p_after text, p_limit int)
RETURNS TABLE (job_id bigint, state text, queue text, kind text, args jsonb, attempt int, at timestamptz,
               detail text, page_key text)
-- VOLATILE: its waiting branch takes the lease ring's lock, and its statements a snapshot after it
LANGUAGE plpgsql VOLATILE SET jit = off AS $$
DECLARE
    v_left int := greatest(p_limit, 0);
    v_n int;
    v_lane record;
    v_phase text := coalesce(left(p_after, 1), 'L');
    v_after_lane int := -1;
    v_after_priority smallint := 0;
    v_after_pos bigint := -1;
    v_after_id bigint := 0;
    v_before_at timestamptz := 'infinity';
    v_before_id bigint := 9223372036854775807;
    v_lanes_read int := 0;
BEGIN
    IF p_state NOT IN ('pending', 'available', 'scheduled', 'retryable', 'running', 'waiting', 'completed', 'failed',
                       'cancelled', 'dead_lettered') THEN
        RAISE EXCEPTION 'unknown job state %', p_state USING ERRCODE = '22023';
    END IF;
    -- page keys: L<lane>:<pos> (a ready row), P<job> (parked), H<job> (held), J<job> (by job id),
    -- T<microseconds since epoch>:<job> (newest first by time); each state takes only its own
    -- (the CASE in parentheses: PL/pgSQL ends an IF condition at its first THEN otherwise)
    IF p_after IS NOT NULL AND p_after !~ (CASE
           WHEN p_state = 'available' THEN '^(L[0-9]{1,10}:[0-9]{1,19}|[PH][0-9]{1,19})$'
           WHEN p_state IN ('pending', 'scheduled', 'retryable', 'running', 'waiting') THEN '^J[0-9]{1,19}$'
           ELSE '^T-?[0-9]{1,19}:[0-9]{1,19}$' END) THEN
        RAISE EXCEPTION 'malformed page key %', p_after USING ERRCODE = '22023';
    END IF;
    BEGIN
        IF p_after LIKE 'L%' THEN
            v_after_lane := split_part(substr(p_after, 2), ':', 1)::int;
            v_after_pos := split_part(substr(p_after, 2), ':', 2)::bigint;
            SELECT l.priority INTO v_after_priority FROM __S__.queue_lanes l WHERE l.lane_id = v_after_lane;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'malformed page key % (no such lane)', p_after USING ERRCODE = '22023';
            END IF;
        ELSIF p_after LIKE 'T%' THEN
            v_before_at := 'epoch'::timestamptz
                           + (split_part(substr(p_after, 2), ':', 1) || ' microseconds')::interval;
            v_before_id := split_part(substr(p_after, 2), ':', 2)::bigint;
        ELSIF p_after IS NOT NULL THEN
            v_after_id := substr(p_after, 2)::bigint;
        END IF;
    EXCEPTION WHEN invalid_text_representation OR numeric_value_out_of_range OR invalid_datetime_format
                   OR interval_field_overflow OR datetime_field_overflow THEN
        RAISE EXCEPTION 'malformed page key %', p_after USING ERRCODE = '22023';
    END;

    IF p_state = 'available' THEN
        IF v_phase = 'L' THEN
            -- Only shards with a segment in the ring can hold available jobs (lane_available). The
            -- sequences of each shard read stay locked to the end of the call, so a call reads at
            -- most 256 shards' and then returns a row without a job whose page key says where to go
            -- on: over a thousand queues' shards, one call would take more locks than the server's
            -- lock table holds.
            FOR v_lane IN
                SELECT l.lane_id, l.segment_seq, l.cursor_seq FROM __S__.queue_lanes l
                WHERE (p_queue IS NULL OR l.queue = p_queue)
                  AND (l.priority, l.lane_id) >= (v_after_priority, v_after_lane)
                  AND EXISTS (SELECT 1 FROM __S__.ready_segments g WHERE g.lane_id = l.lane_id)
                ORDER BY l.priority, l.lane_id
            LOOP
                EXIT WHEN v_left = 0;
                v_lanes_read := v_lanes_read + 1;
                IF v_lanes_read > 256 THEN
                    RETURN QUERY SELECT NULL::bigint, 'available'::text, NULL::text, NULL::text, NULL::jsonb,
                                        NULL::int, NULL::timestamptz, 'more shards to read'::text,
                                        'L' || v_lane.lane_id || ':0';
                    RETURN;
                END IF;
                CONTINUE WHEN NOT __S__.shard_may_have_work(pg_sequence_last_value(v_lane.segment_seq),
                                                            pg_sequence_last_value(v_lane.cursor_seq));
                RETURN QUERY
                    SELECT e.job_id, 'available'::text, e.queue, e.kind, e.args, e.attempt, e.run_at, NULL::text,
                           'L' || e.lane_id || ':' || e.lane_pos
                    FROM __S__.ready_entries e
                    WHERE e.lane_id = v_lane.lane_id
                      AND e.lane_pos > greatest(__S__.lane_cursor(v_lane.lane_id),
                                                CASE WHEN v_lane.lane_id = v_after_lane THEN v_after_pos ELSE -1 END)
                      AND (p_kind IS NULL OR e.kind = p_kind)
                      AND NOT EXISTS (SELECT 1 FROM __S__.ready_tombstones t
                                      WHERE t.ready_slot = e.ready_slot AND t.job_id = e.job_id
                                        AND t.run_lease = e.run_lease)
                    ORDER BY e.lane_pos LIMIT v_left;
                GET DIAGNOSTICS v_n = ROW_COUNT;
                v_left := v_left - v_n;
            END LOOP;
            v_after_id := 0;
        END IF;
        IF v_phase IN ('L', 'P') AND v_left > 0 THEN
            RETURN QUERY
                SELECT x.job_id, 'available'::text, x.queue, x.kind, x.args, x.attempt, x.run_at, 'parked'::text,
                       'P' || x.job_id
                FROM __S__.parked_entries x
                WHERE NOT x.cancelled AND x.job_id > v_after_id
                  AND (p_queue IS NULL OR x.queue = p_queue) AND (p_kind IS NULL OR x.kind = p_kind)
                ORDER BY x.job_id LIMIT v_left;
            GET DIAGNOSTICS v_n = ROW_COUNT;
            v_left := v_left - v_n;
            v_after_id := 0;
        END IF;
        IF v_left > 0 THEN
            RETURN QUERY
                SELECT d.job_id, 'available'::text, d.queue, d.kind, d.args, d.attempt, d.created_at,
                       'held: key at its limit'::text, 'H' || d.job_id
                FROM __S__.deferred_jobs d
                WHERE d.held_key IS NOT NULL AND d.job_id > v_after_id
                  AND (p_queue IS NULL OR d.queue = p_queue) AND (p_kind IS NULL OR d.kind = p_kind)
                ORDER BY d.job_id LIMIT v_left;
        END IF;
    ELSIF p_state = 'pending' THEN
        -- workflow steps waiting for their dependencies (workflows.sql)
        RETURN QUERY
            SELECT s.job_id, 'pending'::text, s.queue, s.kind, s.args, 0, s.created_at,
                   ('step ' || s.step || ' of workflow ' || s.workflow_id)::text, 'J' || s.job_id
            FROM __S__.workflow_steps s
            WHERE s.job_id > v_after_id
              AND (p_queue IS NULL OR s.queue = p_queue) AND (p_kind IS NULL OR s.kind = p_kind)
              AND NOT EXISTS (SELECT 1 FROM __S__.workflow_released r
                              WHERE r.workflow_id = s.workflow_id AND r.step = s.step)
              AND NOT EXISTS (SELECT 1 FROM __S__.workflow_results r
                              WHERE r.workflow_id = s.workflow_id AND r.step = s.step)
            ORDER BY s.job_id LIMIT v_left;
    ELSIF p_state IN ('scheduled', 'retryable') THEN
        RETURN QUERY
            SELECT d.job_id, p_state, d.queue, d.kind, d.args, d.attempt, d.run_at, d.last_error, 'J' || d.job_id
            FROM __S__.deferred_jobs d
            WHERE d.held_key IS NULL AND d.job_id > v_after_id
              AND (CASE WHEN p_state = 'scheduled' THEN d.attempt = 0 ELSE d.attempt > 0 END)
              AND (p_queue IS NULL OR d.queue = p_queue) AND (p_kind IS NULL OR d.kind = p_kind)
            ORDER BY d.job_id LIMIT v_left;
    ELSIF p_state = 'running' THEN
        RETURN QUERY
            SELECT r.job_id, 'running'::text, e.queue, e.kind, e.args, e.attempt + 1, r.claimed_at, NULL::text,
                   'J' || r.job_id
            FROM (
                SELECT b.job_ids[i] AS job_id, b.run_leases[i] AS run_lease, b.ready_slots[i] AS ready_slot,
                       b.claimed_at
                FROM __S__.lease_claim_batches b, generate_subscripts(b.job_ids, 1) i
                WHERE (p_queue IS NULL OR b.queue = p_queue) AND b.job_ids[i] > v_after_id
                  AND b.receipt_ranges @> (b.batch_id * 4096 + i - 1)
                  AND NOT EXISTS (SELECT 1 FROM __S__.lease_claim_closure_batches c
                                  WHERE c.claim_slot = b.claim_slot
                                    AND c.receipt_ranges @> (b.batch_id * 4096 + i - 1))
                UNION ALL
                SELECT l.job_id, l.run_lease, l.ready_slot, l.claimed_at FROM __S__.lease_claims l
                WHERE (p_queue IS NULL OR l.queue = p_queue) AND l.job_id > v_after_id
                  AND NOT EXISTS (SELECT 1 FROM __S__.lease_claim_closures c
                                  WHERE c.claim_slot = l.claim_slot AND c.receipt_id = l.receipt_id)
            ) r
            JOIN __S__.ready_entries e
              ON e.ready_slot = r.ready_slot AND e.job_id = r.job_id AND e.run_lease = r.run_lease - 1
            WHERE (p_kind IS NULL OR e.kind = p_kind)
            ORDER BY r.job_id LIMIT v_left;
    ELSIF p_state = 'waiting' THEN
        PERFORM __S__.lease_ring_shared();
        RETURN QUERY
            SELECT l.job_id, 'waiting'::text, l.queue, l.kind, l.args, l.attempt, l.timeout_at,
                   'waiting for a callback'::text, 'J' || l.job_id
            FROM __S__.leases l
            WHERE l.state = 'waiting' AND l.job_id > v_after_id
              AND (p_queue IS NULL OR l.queue = p_queue) AND (p_kind IS NULL OR l.kind = p_kind)
            ORDER BY l.job_id LIMIT v_left;
    ELSIF p_state = 'dead_lettered' THEN
        RETURN QUERY
            SELECT x.job_id, 'dead_lettered'::text, x.queue, x.kind, x.args, x.attempt, x.failed_at, x.error,
                   'T' || (extract(epoch FROM x.failed_at) * 1000000)::bigint || ':' || x.job_id
            FROM __S__.dlq_entries x
            WHERE (x.failed_at, x.job_id) < (v_before_at, v_before_id)
              AND (p_queue IS NULL OR x.queue = p_queue) AND (p_kind IS NULL OR x.kind = p_kind)
            ORDER BY x.failed_at DESC, x.job_id DESC LIMIT v_left;
    ELSE
        -- terminal history: the ring's rows and the archive's, merged newest first. Each source
        -- gives at most p_limit rows past the key, so the merge is exact.
        RETURN QUERY
            SELECT h.job_id, h.state, h.queue, h.kind, h.args, h.attempt, h.at, h.error,
                   'T' || (extract(epoch FROM h.at) * 1000000)::bigint || ':' || h.job_id
            FROM (
                (SELECT d.job_id, d.state, d.queue, d.kind, d.args, d.attempt, d.finalized_at AS at, d.error
                 FROM __S__.done_entries d
                 WHERE d.state = p_state AND (p_queue IS NULL OR d.queue = p_queue)
                   AND (p_kind IS NULL OR d.kind = p_kind)
                   AND (d.finalized_at, d.job_id) < (v_before_at, v_before_id)
                 ORDER BY d.finalized_at DESC, d.job_id DESC LIMIT v_left)
                UNION ALL
                (SELECT c.job_id, 'completed', b.queue, e.kind, e.args, e.attempt + 1, b.finalized_at, NULL
                 FROM __S__.receipt_completion_batches b
                 CROSS JOIN LATERAL unnest(b.job_ids, b.run_leases) AS c(job_id, run_lease)
                 JOIN LATERAL (SELECT r.kind, r.args, r.attempt FROM __S__.ready_entries r
                               WHERE r.ready_slot = b.ready_slot AND r.job_id = c.job_id
                                 AND r.run_lease = c.run_lease - 1 LIMIT 1) e ON true
                 WHERE p_state = 'completed' AND (p_queue IS NULL OR b.queue = p_queue)
                   AND b.finalized_at <= v_before_at AND (p_kind IS NULL OR e.kind = p_kind)
                   AND (b.finalized_at, c.job_id) < (v_before_at, v_before_id)
                 ORDER BY b.finalized_at DESC, c.job_id DESC LIMIT v_left)
                UNION ALL
                (SELECT a.job_id, a.state, a.queue, a.kind, a.args, a.attempt, a.finalized_at, a.error
                 FROM __S__.archived_jobs a
                 WHERE a.state = p_state AND (p_queue IS NULL OR a.queue = p_queue)
                   AND (p_kind IS NULL OR a.kind = p_kind)
                   AND NOT __S__.archived_slot_in_ring(a.ready_slot, a.generation)
                   AND (a.finalized_at, a.job_id) < (v_before_at, v_before_id)
                 ORDER BY a.finalized_at DESC, a.job_id DESC LIMIT v_left)
                UNION ALL
                (SELECT a.job_ids[i], 'completed', a.queue, a.kinds[i], a.args[i], a.attempts[i],
                        coalesce(a.finalized_ats[i], a.finalized_at) AS at, NULL
                 -- Every job of an archive row finalized in the second of the row's finalized_at,
                 -- its newest (archive_slot). So the rows to read are those of the key's second,
                 -- and those from the second of the v_left-th newest row older than it with a job
                 -- of the kind: each of those gives at least one row, every job of a row left out
                 -- is older than all of theirs, and the merge is exact.
                 FROM __S__.archived_completion_batches a
                 CROSS JOIN LATERAL generate_subscripts(a.job_ids, 1) i
                 WHERE p_state = 'completed' AND (p_queue IS NULL OR a.queue = p_queue)
                   AND (p_kind IS NULL OR p_kind = ANY (a.kinds))
                   AND a.finalized_at < date_trunc('second', v_before_at) + interval '1 second'
                   AND a.finalized_at >= least(
                         date_trunc('second', v_before_at),
                         (SELECT date_trunc('second', min(t.finalized_at))
                          FROM (SELECT w.finalized_at FROM __S__.archived_completion_batches w
                                WHERE (p_queue IS NULL OR w.queue = p_queue)
                                  AND (p_kind IS NULL OR p_kind = ANY (w.kinds))
                                  AND w.finalized_at < date_trunc('second', v_before_at)
                                  AND NOT __S__.archived_slot_in_ring(w.ready_slot, w.generation)
                                ORDER BY w.finalized_at DESC LIMIT v_left) t))
                   AND NOT __S__.archived_slot_in_ring(a.ready_slot, a.generation)
                   AND (p_kind IS NULL OR a.kinds[i] = p_kind)
                   AND (coalesce(a.finalized_ats[i], a.finalized_at), a.job_ids[i]) < (v_before_at, v_before_id)
                 ORDER BY 7 DESC, 1 DESC LIMIT v_left)
            ) h
            ORDER BY h.at DESC, h.job_id DESC LIMIT v_left;
    END IF;
END
$$;

-- A job's arguments, from wherever the job is now (its newest row), or NULL when unknown or aged
-- out: the job page shows them next to job_state and job_history.
CREATE OR REPLACE FUNCTION __S__.job_args(p_job_id bigint) RETURNS jsonb
-- jit off: one job's rows, found by index in every partition; the plan's cost over all of them
-- can pass jit_above_cost, and compiling it took seconds for a lookup of milliseconds
LANGUAGE sql STABLE SET jit = off AS $$
    SELECT a.args FROM (
        SELECT x.args, x.run_lease FROM __S__.dlq_entries x WHERE x.job_id = p_job_id
        UNION ALL
        SELECT w.args, w.run_lease FROM __S__.leases w WHERE w.job_id = p_job_id
        UNION ALL
        SELECT d.args, d.run_lease FROM __S__.deferred_jobs d WHERE d.job_id = p_job_id
        UNION ALL
        SELECT p.args, p.run_lease FROM __S__.parked_entries p WHERE p.job_id = p_job_id
        UNION ALL
        SELECT e.args, e.run_lease FROM __S__.ready_entries e WHERE e.job_id = p_job_id
        UNION ALL
        SELECT d.args, d.run_lease FROM __S__.done_entries d WHERE d.job_id = p_job_id
        UNION ALL
        SELECT h.args, h.run_lease FROM __S__.archived_job(p_job_id) h
    ) a ORDER BY a.run_lease DESC LIMIT 1
$$;

-- The queues with limits (control.sql set_queue_limits) and what they use of them now: attempts
-- open against max_running, claims in the rate window against the rate, jobs held for keys at
-- their limit, and the p_top_keys busiest keys of a per-key limit (open attempts, then claims in
-- the key's rate window). Open attempts are counted from the queue's running mark (migration 0010),
-- as a limited claim counts them: the claims since the oldest open one, not the whole ring.
CREATE OR REPLACE FUNCTION __S__.queue_limits_in_use(p_top_keys int)
RETURNS TABLE (queue text, max_running int, running bigint, rate_limit int, rate_period interval,
               rate_used bigint, key_path text[], key_max_running int, key_rate_limit int,
               key_rate_period interval, held bigint, top_keys jsonb)
LANGUAGE sql STABLE SET jit = off AS $$
    SELECT q.queue, q.max_running, r.running, q.rate_limit, q.rate_period,
           (SELECT coalesce(sum(c.claimed), 0)::bigint FROM __S__.rate_limit_claims c
            WHERE c.queue = q.queue AND c.key IS NULL AND c.claimed_at > __S__.engine_now() - q.rate_period),
           q.key_path, q.key_max_running, q.key_rate_limit, q.key_rate_period,
           (SELECT count(*) FROM __S__.deferred_jobs d WHERE d.queue = q.queue AND d.held_key IS NOT NULL),
           CASE WHEN q.key_path IS NOT NULL THEN coalesce((
               SELECT jsonb_agg(jsonb_build_object('key', k.key, 'running', k.running, 'claims', k.claims)
                                ORDER BY k.running DESC, k.claims DESC, k.key)
               FROM (
                   SELECT coalesce(o.key, w.key) AS key, coalesce(o.running, 0) AS running,
                          coalesce(w.claims, 0) AS claims
                   FROM (SELECT b.key, b.running
                         FROM __S__.count_running_by_key(q.queue, r.mark, q.key_path) b
                         WHERE b.key IS NOT NULL) o
                   FULL JOIN (SELECT c.key, sum(c.claimed)::bigint AS claims
                              FROM __S__.rate_limit_claims c
                              WHERE c.queue = q.queue AND c.key IS NOT NULL AND q.key_rate_period IS NOT NULL
                                AND c.claimed_at > __S__.engine_now() - q.key_rate_period
                              GROUP BY c.key) w ON w.key = o.key
                   ORDER BY 2 DESC, 3 DESC, 1
                   LIMIT p_top_keys
               ) k), '[]') ELSE '[]'::jsonb END
    FROM __S__.queues q
    CROSS JOIN LATERAL (SELECT coalesce(pg_sequence_last_value(q.running_mark_seq), 0) AS mark) m
    CROSS JOIN LATERAL (SELECT m.mark, f.running FROM __S__.count_running_from(q.queue, m.mark) f) r
    WHERE q.max_running IS NOT NULL OR q.rate_limit IS NOT NULL OR q.key_path IS NOT NULL
    ORDER BY q.queue
$$;
