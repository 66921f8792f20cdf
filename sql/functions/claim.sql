-- Claim plane (seed ADR-023): claim() and its helpers (the limits' room, the order of the shard
-- walk, the batch write), and the counts of open claims that limits and status read. Completion,
-- close and heartbeats of claimed attempts are in complete.sql.
--
-- Every function of the engine is defined exactly once, in the file of its plane, and installed with
-- CREATE OR REPLACE by src/schema.rs whenever the combined hash of these files changes. A function
-- that is removed is dropped by name in dropped.sql. __S__ is the validated schema name.

-- How many integers a multirange of int8 holds (its ranges are canonical: [lower, upper)).
-- PL/pgSQL, not SQL: a SQL body with a FROM is never inlined, so each statement that called it
-- planned it again (every claim's batch insert: about 0.09 ms of a claim's 1.6).
CREATE OR REPLACE FUNCTION __S__.multirange_size(p_ranges int8multirange) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN coalesce((SELECT sum(upper(r) - lower(r)) FROM unnest(p_ranges) r), 0)::bigint;
END
$$;

-- The open attempts of one queue among its claims from batch p_mark on, and the batch id of the
-- oldest one still open. Per claim batch of the queue: its receipts, less those covered by the
-- closure batches that overlap it (found through their GiST exclusion index; closures never overlap
-- each other, so the sizes of the intersections add up). One probe per claim batch, not one per
-- job: 100,000 completed claims were 0.9 s with a probe per job.
--
-- A concurrency-limited queue's claim (holding the queue's limit lock) counts from the queue's
-- running mark (migration 0010) and moves the mark to the oldest open claim. Claims before the
-- mark are all closed, so the walk covers the claims made since the oldest running attempt began,
-- not the whole ring. (A claim that began before the queue was limited took no lock and may commit
-- below a mark; for as long as it runs, it is not counted. Setting a limit is rare; documented.)
--
-- The counting functions a limited claim calls are PL/pgSQL, not SQL: a SQL function the planner
-- cannot inline is planned again at every call, and planning these statements over every claim
-- ring partition took 0.3 to 0.6 ms per call, more than running them (under saturation, a limited
-- claim took over half again as long as a plain one). PL/pgSQL keeps its plans for the session.
CREATE OR REPLACE FUNCTION __S__.count_running_from(p_queue text, p_mark bigint)
RETURNS TABLE (running bigint, oldest_open bigint)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY
    WITH open_claims AS (
        SELECT b.batch_id, __S__.multirange_size(b.receipt_ranges) - x.closed AS open_n
        FROM __S__.lease_claim_batches b
        CROSS JOIN LATERAL (
            SELECT coalesce(sum(__S__.multirange_size(c.receipt_ranges * b.receipt_ranges)), 0) AS closed
            FROM __S__.lease_claim_closure_batches c
            WHERE c.claim_slot = b.claim_slot AND c.receipt_ranges && b.receipt_ranges
        ) x
        WHERE b.batch_id >= p_mark AND b.queue = p_queue
        UNION ALL
        SELECT l.receipt_id / 4096, 1
        FROM __S__.lease_claims l
        WHERE l.receipt_id >= p_mark * 4096 AND l.queue = p_queue
          AND NOT EXISTS (SELECT 1 FROM __S__.lease_claim_closures c
                          WHERE c.claim_slot = l.claim_slot AND c.receipt_id = l.receipt_id)
    )
    SELECT coalesce(sum(o.open_n), 0)::bigint, min(o.batch_id) FILTER (WHERE o.open_n > 0)
    FROM open_claims o;
END
$$;

-- The open attempts of one queue from claim batch p_mark on, per value of the concurrency key at
-- p_path in their args (migration 0012), for a claim of a queue with a per-key limit. Per claim
-- batch, one probe of the closure batches that overlap it gives its still-open receipts (its
-- receipts less their union); only those are unnested and matched to their ready rows for the
-- args, so the cost is a probe per batch of the running mark's window plus one lookup per running
-- attempt (a probe per item cut saturated throughput to about a third). Jobs without the key: NULL.
CREATE OR REPLACE FUNCTION __S__.count_running_by_key(p_queue text, p_mark bigint, p_path text[])
RETURNS TABLE (key text, running bigint)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY
    WITH open_batches AS (
        SELECT b.batch_id, b.job_ids, b.run_leases, b.ready_slots,
               b.receipt_ranges - coalesce((SELECT range_agg(c.receipt_ranges)
                                            FROM __S__.lease_claim_closure_batches c
                                            WHERE c.claim_slot = b.claim_slot
                                              AND c.receipt_ranges && b.receipt_ranges),
                                           '{}'::int8multirange) AS open
        FROM __S__.lease_claim_batches b
        WHERE b.batch_id >= p_mark AND b.queue = p_queue
    ), open_items AS (
        SELECT o.ready_slots[x.i] AS ready_slot, o.job_ids[x.i] AS job_id, o.run_leases[x.i] AS run_lease
        FROM open_batches o
        CROSS JOIN LATERAL unnest(o.open) r
        CROSS JOIN LATERAL generate_series(lower(r), upper(r) - 1) receipt
        CROSS JOIN LATERAL (SELECT (receipt - o.batch_id * 4096 + 1)::int AS i) x
        WHERE NOT isempty(o.open)
        UNION ALL
        SELECT l.ready_slot, l.job_id, l.run_lease
        FROM __S__.lease_claims l
        WHERE l.receipt_id >= p_mark * 4096 AND l.queue = p_queue
          AND NOT EXISTS (SELECT 1 FROM __S__.lease_claim_closures c
                          WHERE c.claim_slot = l.claim_slot AND c.receipt_id = l.receipt_id)
    )
    -- one index probe per running attempt, never a join the planner could turn into a scan of the
    -- ring (the claim's plans are generic: it cannot see how few attempts run)
    SELECT (SELECT e.args #>> p_path FROM __S__.ready_entries e
            WHERE e.ready_slot = o.ready_slot AND e.job_id = o.job_id AND e.run_lease = o.run_lease - 1
            LIMIT 1) AS key,
           count(*)
    FROM open_items o
    GROUP BY 1;
END
$$;

-- Every job of the queue claimed from batch p_mark on, closed or not: an upper bound of
-- count_running_from without its closure probes, which settles most claims of a queue whose
-- concurrency limit is well above what runs.
CREATE OR REPLACE FUNCTION __S__.claimed_since(p_queue text, p_mark bigint) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN coalesce((SELECT sum(b.claimed_count) FROM __S__.lease_claim_batches b
                     WHERE b.batch_id >= p_mark AND b.queue = p_queue), 0)
         + (SELECT count(*) FROM __S__.lease_claims l WHERE l.receipt_id >= p_mark * 4096 AND l.queue = p_queue);
END
$$;

-- In-flight attempts (compact members + row-local claims minus closures) over the claim ring.
-- All queues: claim and closure counts (closures are unique per receipt, so counts subtract
-- exactly). One queue: a closure batch can span queues, so count that queue's open items, from
-- the first claim batch on.
CREATE OR REPLACE FUNCTION __S__.count_in_flight(p_queue text DEFAULT NULL) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN p_queue IS NULL THEN
        coalesce((SELECT sum(b.claimed_count) FROM __S__.lease_claim_batches b), 0)
        + (SELECT count(*) FROM __S__.lease_claims l)
        - coalesce((SELECT sum(c.closed_count) FROM __S__.lease_claim_closure_batches c), 0)
        - (SELECT count(*) FROM __S__.lease_claim_closures c)
    ELSE
        (SELECT r.running FROM __S__.count_running_from(p_queue, 0) r)
    END
$$;

-- Does the queue have a visible, unclaimed position in some shard? Asked by a dispatcher whose claim
-- came back empty: yes means the work sits in shards other claimers hold (retry in a few ms). A
-- paused queue answers no: its dispatchers wait for a NOTIFY (resume sends one) or the poll. A
-- parked lane answers yes: the next claim brings it back.
-- Drained shards answer from their sequences alone. A shard whose sequences say it may have work is
-- held by a claimer (yes: it takes what it can and says whether it left more), or is looked at
-- under its lock like a claim would: its cursor from the ledger, the cursor sequence caught up to
-- it (monotone, as the claim's lazy catch-up), then one index probe past it. The sequence lags the
-- ledger by the last claim, so without the catch-up a shard just drained read as work; with it the
-- first check after a claim brings the sequence up to date, and the others answer from it (8x4 at
-- 400 jobs/s: 0.55 -> 0.35 ms a check). A check that finds the shard held still says yes. The
-- runtime asks only after an empty claim that says it left work behind (claim's p_empty_row):
-- shards it skipped as held (several candidates, or a lone one held past p_shard_wait) or a limit.
-- PL/pgSQL, not SQL: the SQL function was not inlined, so its body was planned at every call
-- (1.3 ms to plan, 0.4 ms to run; at 8x4 saturation the dispatchers' 110 calls a second cost the
-- server 0.15 of a core in planning alone). PL/pgSQL keeps the plan for the session, and the
-- generic plan from the first call (a custom plan would be as costly to make as the SQL one);
-- jit off, as for every generic plan over all the ring's partitions (storage.md section 13).
CREATE OR REPLACE FUNCTION __S__.queue_has_backlog(p_queue text) RETURNS boolean
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET jit = off AS $$
DECLARE
    v_lane record;
    v_cursor bigint;
BEGIN
    IF EXISTS (SELECT 1 FROM __S__.queues q WHERE q.queue = p_queue AND q.paused) THEN
        RETURN false;
    END IF;
    IF EXISTS (SELECT 1 FROM __S__.parked_lanes p WHERE p.queue = p_queue)
       -- jobs held by a key limit (migration 0012) come back through claims: keep claiming
       OR EXISTS (SELECT 1 FROM __S__.deferred_jobs d WHERE d.queue = p_queue AND d.held_key IS NOT NULL) THEN
        RETURN true;
    END IF;
    FOR v_lane IN
        SELECT l.lane_id, l.cursor_seq, l.cursor_pos
        FROM (SELECT w.lane_id, w.cursor_seq, w.last_segment,
                     coalesce(pg_sequence_last_value(w.cursor_seq), 0) AS cursor_pos
              FROM (SELECT l.lane_id, l.cursor_seq, pg_sequence_last_value(l.segment_seq) AS last_segment
                    FROM __S__.queue_lanes l WHERE l.queue = p_queue OFFSET 0) w
              -- a shard never written has no cursor to read
              WHERE w.last_segment IS NOT NULL OFFSET 0) l
        WHERE __S__.shard_may_have_work(l.last_segment, l.cursor_pos)
    LOOP
        IF NOT pg_try_advisory_xact_lock(__S__.lock_ns('lane'), v_lane.lane_id) THEN
            RETURN true;
        END IF;
        -- a new expression: its snapshot, taken after the lock, sees every claim of the shard
        v_cursor := __S__.lane_cursor(v_lane.lane_id);
        IF v_cursor > v_lane.cursor_pos THEN
            PERFORM setval(v_lane.cursor_seq, v_cursor, true);
        END IF;
        -- the lane's first row past its cursor, in index order as claim finds it. Not an EXISTS:
        -- once ANALYZE has seen the lane, the generic plan of an EXISTS over "lane_pos > $2"
        -- (a third of the rows, by the planner's default guess) is a sequential scan that
        -- stops at the first match, and the rows past the cursor are the newest, at the end of
        -- the heap: behind a reader, with a 2 GB current slot, each check read it all (2 s)
        IF (SELECT e.lane_pos FROM __S__.ready_entries e
            WHERE e.lane_id = v_lane.lane_id AND e.lane_pos > v_cursor
            ORDER BY e.lane_pos LIMIT 1) IS NOT NULL THEN
            RETURN true;
        END IF;
    END LOOP;
    RETURN false;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- claim() and its helpers. The helpers run inside a claim, under its settings (generic plans, jit
-- off, asynchronous commit); nothing else calls them.
-- ---------------------------------------------------------------------------------------------

-- The room a claim of a limited queue has: at most p_max, less what the queue's concurrency and rate
-- limits leave (room); with a per-key limit, each key's room (key_room; a key not in it has
-- key_default_room), after the jobs held for keys that have room again went back to the ring.
-- A limited queue's claimers count and claim one at a time: the queue's limit lock is held to the
-- claim's commit, and each count is a statement that starts after the lock, so it sees every claim
-- committed before it. The counts come from what claims write anyway (claim batches, closures): no
-- counter row is updated per job. Unlimited queues never call this.
CREATE OR REPLACE FUNCTION __S__.claim_room(p_queue text, p_max int, p_max_running int,
                                            p_rate_limit int, p_rate_period interval, p_mark_seq regclass,
                                            p_key_path text[], p_key_max int, p_key_rate int,
                                            p_key_rate_period interval,
                                            OUT room int, OUT batch bigint, OUT decided_at timestamptz,
                                            OUT key_room jsonb, OUT key_default_room int)
LANGUAGE plpgsql AS $$
DECLARE
    v_running bigint;
    v_oldest_open bigint;
BEGIN
    room := p_max;
    key_room := '{}';
    PERFORM pg_advisory_xact_lock(__S__.lock_ns('queue_limit'), hashtext(p_queue));
    -- stamp the claim with when it was decided, not when its transaction began (before the lock
    -- wait): the rate window below counts claims by that time. The engine clock is read here too,
    -- after the lock: a test clock moved during the wait would otherwise stamp this claim in the
    -- window before the move, where a later claim no longer counts it (over-admitting the window).
    decided_at := clock_timestamp() + __S__.clock_offset();
    -- the batch id is taken under the lock: a later limited claim of the queue, counting from the
    -- running mark, must see every claim with a lower id committed
    batch := nextval('__S__.claim_batch_ids');
    IF p_max_running IS NOT NULL AND p_mark_seq IS NULL THEN
        -- limited before migration 0010's mark existed: count the whole ring
        room := least(room, p_max_running - __S__.count_in_flight(p_queue)::int);
    ELSIF p_max_running IS NOT NULL AND p_key_max IS NULL
          AND __S__.claimed_since(p_queue, coalesce(pg_sequence_last_value(p_mark_seq), 0)) + room
              <= p_max_running THEN
        -- every job claimed since the mark, closed or not, plus this claim fits: no exact count (no
        -- closure probes), and the mark stays; it moves when the bound nears the limit
        NULL;
    ELSIF p_max_running IS NOT NULL OR p_key_max IS NOT NULL THEN
        SELECT r.running, r.oldest_open INTO v_running, v_oldest_open
        FROM __S__.count_running_from(p_queue, coalesce(pg_sequence_last_value(p_mark_seq), 0)) r;
        -- non-transactional, and safe so: every claim below the new mark is closed for good
        PERFORM setval(p_mark_seq, coalesce(v_oldest_open, batch), true);
        IF p_max_running IS NOT NULL THEN
            room := least(room, p_max_running - v_running::int);
        END IF;
    END IF;
    IF p_key_path IS NOT NULL AND room >= 1 THEN
        -- the room of each key: its running limit less what runs, its rate less the window's claims
        -- (migrations 0012, 0013); a key in neither map has the whole of both
        key_default_room := least(coalesce(p_key_max, 2147483647), coalesce(p_key_rate, 2147483647));
        IF p_key_max IS NOT NULL THEN
            SELECT coalesce(jsonb_object_agg(r.key, p_key_max - r.running), '{}') INTO key_room
            FROM __S__.count_running_by_key(p_queue, coalesce(v_oldest_open, batch), p_key_path) r
            WHERE r.key IS NOT NULL;
        END IF;
        IF p_key_rate IS NOT NULL THEN
            DELETE FROM __S__.rate_limit_claims r
            WHERE r.queue = p_queue AND r.key IS NOT NULL AND r.claimed_at <= decided_at - p_key_rate_period;
            SELECT key_room || coalesce(jsonb_object_agg(w.key,
                       least(coalesce((key_room ->> w.key)::int, key_default_room), p_key_rate - w.n)), '{}')
            INTO key_room
            FROM (SELECT r.key, sum(r.claimed)::int AS n FROM __S__.rate_limit_claims r
                  WHERE r.queue = p_queue AND r.key IS NOT NULL GROUP BY r.key) w;
        END IF;
        -- then the held jobs of keys with room back to the ring (oldest first, at their creation
        -- time, so the walk reaches them before younger work)
        PERFORM __S__.release_held(p_queue, key_room, key_default_room);
    END IF;
    IF p_rate_limit IS NOT NULL THEN
        -- the window's claims, from the queue's own ledger (migration 0009: the claim ring does not
        -- keep closed claims for a whole period)
        DELETE FROM __S__.rate_limit_claims r
        WHERE r.queue = p_queue AND r.key IS NULL AND r.claimed_at <= decided_at - p_rate_period;
        room := least(room, p_rate_limit - (SELECT coalesce(sum(r.claimed), 0)::int
                                            FROM __S__.rate_limit_claims r
                                            WHERE r.queue = p_queue AND r.key IS NULL));
    END IF;
END
$$;

-- The order in which a claim walks the queue's shards: by effective priority, then priority, then the
-- run_at of their oldest waiting job. With aging, a lane's priority improves by one level per p_aging
-- its oldest waiting job has been runnable (run_at: enqueue, or promotion of a scheduled/retried
-- job), so low priorities never starve. next_head is the head of the next shard of the same
-- (effective) priority: a walk stops at a segment boundary when the next segment's jobs are younger
-- than it, and the claim continues from the oldest head again (a merge across shards at segment
-- granularity). The shards are the candidates the claim found from their sequences, with the cursors
-- it read once: pg_sequence_last_value is volatile, and used directly in the head probe it could
-- not bound the index scan (the probe would walk every already-claimed row of the shard). A SQL
-- function the planner inlines into the claim, so its plan is cached with the claim's (a SQL
-- function that is not inlined is planned at every call).
CREATE OR REPLACE FUNCTION __S__.claim_lane_order(p_lane_ids int[], p_cursor_seqs regclass[], p_priorities smallint[],
                                                  p_cursors bigint[], p_now timestamptz, p_aging interval)
RETURNS TABLE (lane_id int, cursor_seq regclass, next_head timestamptz)
LANGUAGE sql STABLE AS $$
    WITH heads AS (
        SELECT l.lane_id, l.cursor_seq, l.priority, head.run_at AS head_at,
               l.priority - coalesce(floor(extract(epoch FROM p_now - head.run_at)
                                           / nullif(extract(epoch FROM p_aging), 0)), 0) AS effective
        FROM unnest(p_lane_ids, p_cursor_seqs, p_priorities, p_cursors) AS l(lane_id, cursor_seq, priority, cursor_pos)
        CROSS JOIN LATERAL (
            SELECT e.run_at FROM __S__.ready_entries e
            WHERE e.lane_id = l.lane_id AND e.lane_pos > l.cursor_pos
            ORDER BY e.lane_pos LIMIT 1
        ) head
    )
    SELECT h.lane_id, h.cursor_seq,
           lead(h.head_at) OVER (PARTITION BY h.effective, h.priority ORDER BY h.head_at, h.lane_id) AS next_head
    FROM heads h
    ORDER BY h.effective, h.priority, h.head_at, h.lane_id
$$;

-- What a claim of a rate-limited queue writes once, after its walk: the claimed count in the queue's
-- rate window, and one row per key claimed for the keys' rate windows (migration 0013).
CREATE OR REPLACE FUNCTION __S__.record_claim_rates(p_queue text, p_claimed_at timestamptz, p_rate_limited boolean,
                                                    p_claimed int, p_key_claimed jsonb)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_rate_limited AND p_claimed > 0 THEN
        INSERT INTO __S__.rate_limit_claims (queue, claimed_at, claimed) VALUES (p_queue, p_claimed_at, p_claimed);
    END IF;
    IF p_key_claimed <> '{}' THEN
        INSERT INTO __S__.rate_limit_claims (queue, claimed_at, claimed, key)
        SELECT p_queue, p_claimed_at, c.value::int, c.key FROM jsonb_each_text(p_key_claimed) c;
    END IF;
END
$$;

-- Claim up to p_max jobs of the queue: the room its limits leave (claim_room), then a walk of its
-- shards in claim_lane_order, each locked without waiting (but for a lone candidate, which the claim
-- may wait for, at most p_shard_wait), from its cursor, leaving a ledger row per shard
-- (ready_claim_attempt_batches: the cursor is never updated in place); the evidence is written once
-- (the claim batch row, and record_claim_rates), and the claimed jobs are returned together at the
-- end, each with `more` (whether the claim may have left claimable jobs behind; with p_empty_row, a
-- claim that took nothing returns it in one row of NULLs). p_deadline is the batch's lease; a job
-- with a timeout of its own gets a row-local claim (lease_claims) instead.
CREATE OR REPLACE FUNCTION __S__.claim(p_queue text, p_max int, p_deadline interval, p_aging interval,
                            p_shard_wait interval, p_empty_row boolean)
RETURNS TABLE (job_id bigint, run_lease bigint, claim_slot int, receipt_id bigint, kind text, args jsonb,
               attempt int, max_attempts int, priority smallint, created_at timestamptz,
               deadline_at timestamptz, traceparent text, more boolean)
-- jit off: a claim's statements are short, and a generic plan's estimate (a key limit's walk of
-- open claims estimates thousands of rows) can pass jit_above_cost: compiling would take over a
-- second per claim on a server with the default jit = on, for a walk that runs in milliseconds
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET jit = off AS $$
DECLARE
    v_claim_slot int;
    v_batch bigint;
    -- the engine's clock (clock.sql): the claim's time and deadline, and its rate windows
    v_now timestamptz := now() + __S__.clock_offset();
    v_batch_deadline timestamptz := v_now + p_deadline;
    v_own_deadline timestamptz;
    v_lane record;
    -- the shards the pass may walk (their ids, cursor sequences, priorities and cursors) and the
    -- query that orders them
    v_shard_ids int[];
    v_shard_seqs regclass[];
    v_shard_priorities smallint[];
    v_shard_cursors bigint[];
    v_shards refcursor;
    v_cursor bigint;
    v_seq_cursor bigint;
    -- the queue slots that hold the lane's visible segments from its cursor sequence's on, when
    -- there are at most three (v_slot_a..c, repeated to fill); NULL: walk every slot
    v_slots int[];
    v_slot_a int;
    v_slot_b int;
    v_slot_c int;
    v_walk refcursor;
    v_current_slot int;
    v_seg_min bigint;
    v_seg_max bigint;
    v_seg_count bigint;
    v_last_segment bigint;
    v_new_cursor bigint;
    v_last_slot int;
    -- the walked row, in scalar variables: a record variable would look each field up by name
    -- again after every FETCH (its row type is new each time)
    v_r_slot int;
    v_r_pos bigint;
    v_r_job bigint;
    v_r_kind text;
    v_r_args jsonb;
    v_r_attempt int;
    v_r_lease bigint;
    v_r_max_attempts int;
    v_r_priority smallint;
    v_r_created timestamptz;
    v_r_timeout_ms int;
    v_r_queue text;
    v_r_run_at timestamptz;
    v_r_traceparent bytea;
    v_r_traceparent_text text;
    v_r_spent boolean;
    v_n int := 0;
    v_job_ids bigint[];
    v_leases bigint[];
    v_ready_slots int[];
    v_lane_ids int[];
    v_attempts int[];
    v_max_attempts int[];
    -- the receipts of row-local claims; every other receipt of the batch is a compact member's
    v_row_local_receipts int8multirange := '{}';
    -- how many of the claimed jobs are row-local claims (the rest are compact members of the batch)
    v_row_local int := 0;
    -- whether the slots a walk covers hold any tombstone: without one, the walk does not probe them
    v_tombstones boolean;
    v_pass int := 0;
    v_cut boolean;
    v_stopped boolean;
    v_walked int;
    v_limit int;
    -- jobs claimed before this shard's walk (its rows' lane ids are appended after it)
    v_n_before int;
    v_seg_slot int;
    v_paused boolean;
    v_any_parked boolean;
    v_parked boolean;
    v_max_running int;
    v_rate_limit int;
    v_rate_period interval;
    v_mark_seq regclass;
    v_key_path text[];
    v_key_max int;
    v_key_rate int;
    v_key_rate_period interval;
    v_key_default_room int;
    v_key_room jsonb := '{}';
    v_key_claimed jsonb := '{}';
    v_key text;
    -- the rows to return, positional like the evidence arrays (returned at the end, when more is known);
    -- NULL until a job is appended (|| appends to a NULL array)
    v_kinds text[];
    v_args jsonb[];
    v_priorities smallint[];
    v_created timestamptz[];
    v_deadlines timestamptz[];
    v_traceparents text[];
    -- whether the claim may have left claimable work behind: a shard it skipped as locked by
    -- another claimer, a walk cut short by its row limit or a segment cut it did not follow, or a
    -- limit (held jobs, a room the limits cut). A short claim without it saw every visible job.
    v_more boolean := false;
    -- a function's result that is not used: an assignment is evaluated as a simple expression,
    -- where PERFORM runs a statement through the executor
    v_ignored text;
    -- the walk in one statement (v_walked_in_one): its rows as arrays, in lane order
    v_walked_in_one boolean;
    v_w_n int;
    v_w_timeouts boolean;
    v_w_cut int;
    v_w_pos bigint[];
    v_w_run_at timestamptz[];
    v_w_jobs bigint[];
    v_w_leases bigint[];
    v_w_slots int[];
    v_w_attempts int[];
    v_w_max_attempts int[];
    v_w_kinds text[];
    v_w_args jsonb[];
    v_w_priorities smallint[];
    v_w_created timestamptz[];
    v_w_traceparents text[];
BEGIN
    IF p_max < 1 OR p_max > 4096 THEN
        RAISE EXCEPTION 'ringwork: claim size must be 1..4096, got %', p_max USING ERRCODE = '22023';
    END IF;
    -- A claim's commit need not wait for its WAL flush: the shard lock is held until commit, so the
    -- flush wait would serialise every claimer of the shard behind the disk. A claim lost in a
    -- server crash only makes its jobs claimable again (at-least-once: they may run twice); it
    -- cannot lose a job, because WAL is flushed in order: any later durable record (a completion,
    -- or the next claimer's cursor setval past these rows) makes this commit durable first.
    v_ignored := set_config('synchronous_commit', 'off', true);
    v_claim_slot := __S__.current_claim_slot();

    -- A claim is the queue being worked: bring its parked lanes back first (sql/functions/parking.sql).
    -- One statement for both questions: a claim's fixed cost is counted in statements.
    SELECT q.paused, EXISTS (SELECT 1 FROM __S__.parked_lanes p WHERE p.queue = p_queue),
           q.max_running, q.rate_limit, q.rate_period, q.running_mark_seq, q.key_path, q.key_max_running,
           q.key_rate_limit, q.key_rate_period
    INTO v_paused, v_any_parked, v_max_running, v_rate_limit, v_rate_period, v_mark_seq, v_key_path, v_key_max,
         v_key_rate, v_key_rate_period
    FROM __S__.queues q WHERE q.queue = p_queue;
    IF v_paused THEN
        RETURN;
    END IF;
    -- Fleet-wide limits (control.sql set_queue_limits).
    IF v_max_running IS NOT NULL OR v_rate_limit IS NOT NULL OR v_key_path IS NOT NULL THEN
        SELECT r.room, r.batch, r.decided_at, r.key_room, r.key_default_room
        INTO p_max, v_batch, v_now, v_key_room, v_key_default_room
        FROM __S__.claim_room(p_queue, p_max, v_max_running, v_rate_limit, v_rate_period,
                              v_mark_seq, v_key_path, v_key_max, v_key_rate, v_key_rate_period) r;
        IF p_max < 1 THEN
            RETURN;
        END IF;
        v_batch_deadline := v_now + p_deadline;
        v_more := true;
    END IF;
    v_batch := coalesce(v_batch, nextval('__S__.claim_batch_ids'));
    IF v_any_parked THEN
        PERFORM __S__.unpark_queue(p_queue);
    END IF;
    -- read once: a claim that sees a rotation only looks in more slots (below)
    v_current_slot := __S__.current_queue_slot();
    -- The walk: shards in claim_lane_order, at most four passes (a pass ends early where the merge
    -- across shards cuts a walk at a segment boundary).
    LOOP
        v_pass := v_pass + 1;
        v_cut := false;
        -- The candidates: shards whose sequences say they may hold work (no index probe; drained
        -- shards are skipped), each sequence read once (OFFSET 0 keeps the volatile reads in the
        -- subqueries). A shard never written has no cursor to read: a sequence read opens and locks
        -- a relation (a queue has 8 base shards at each priority its jobs use).
        SELECT array_agg(l.lane_id), array_agg(l.cursor_seq), array_agg(l.priority), array_agg(l.cursor_pos)
        INTO v_shard_ids, v_shard_seqs, v_shard_priorities, v_shard_cursors
        FROM (SELECT w.lane_id, w.cursor_seq, w.priority, w.last_segment,
                     coalesce(pg_sequence_last_value(w.cursor_seq), 0) AS cursor_pos
              FROM (SELECT l.lane_id, l.cursor_seq, l.priority,
                           pg_sequence_last_value(l.segment_seq) AS last_segment
                    FROM __S__.queue_lanes l WHERE l.queue = p_queue OFFSET 0) w
              WHERE w.last_segment IS NOT NULL OFFSET 0) l
        WHERE __S__.shard_may_have_work(l.last_segment, l.cursor_pos);
        EXIT WHEN v_shard_ids IS NULL;
        IF cardinality(v_shard_ids) = 1 THEN
            -- One candidate, the usual case below saturation: there is nothing to order, so the
            -- claim does not run the shard order, whose head probe opens every queue slot's
            -- partition and index (a shard with nothing visible is walked and found empty).
            OPEN v_shards FOR SELECT v_shard_ids[1] AS lane_id, v_shard_seqs[1] AS cursor_seq,
                                     NULL::timestamptz AS next_head;
        ELSE
            OPEN v_shards FOR SELECT o.lane_id, o.cursor_seq, o.next_head
                              FROM __S__.claim_lane_order(v_shard_ids, v_shard_seqs, v_shard_priorities,
                                                          v_shard_cursors, v_now, p_aging) o;
        END IF;
        LOOP
            FETCH v_shards INTO v_lane;
            EXIT WHEN NOT FOUND OR v_n >= p_max;
            -- Never wait for a shard while there are others: another claimer holds it for a few
            -- milliseconds, and the other shards (or, with every shard busy, the dispatcher's short
            -- backoff) serve this one. Holding shards while skipping others is deadlock-free
            -- because a claim waits only while it holds no lock (below), and then boundedly.
            -- An advisory lock, not the lane row's lock: a row lock wrote a WAL record and dirtied
            -- the row's page at every claim (about 11 bytes of WAL a job at 400 jobs/s), and took a
            -- statement of its own.
            IF NOT pg_try_advisory_xact_lock(__S__.lock_ns('lane'), v_lane.lane_id) THEN
                -- The lone shard with work, in the first pass of an unlimited queue with no lane
                -- parked (the claim holds no lock yet): nothing
                -- else can serve this claim, and its holder is a claimer that commits within
                -- milliseconds. Waiting for it (at most p_shard_wait) and then walking it gives the
                -- answer in one statement, what the holder left or nothing; skipping it made every
                -- process that a NOTIFY woke and that lost the shard ask queue_has_backlog (yes:
                -- held), sleep, claim again and ask again: four statements where one does. A
                -- holder other than a claim (a cancel or a prune in a long transaction) costs the
                -- claim p_shard_wait, then it skips the shard as before.
                IF v_pass > 1 OR cardinality(v_shard_ids) > 1 OR p_shard_wait IS NULL
                   -- a limited queue's claimers take turns under its limit lock, which this claim
                   -- holds (the shard's holder is no claimer: waiting would stall them all), and
                   -- unparking took lane locks; under a snapshot older than the wait, the walk
                   -- would not see the holder's claim
                   OR v_max_running IS NOT NULL OR v_rate_limit IS NOT NULL OR v_key_path IS NOT NULL
                   OR v_any_parked OR current_setting('transaction_isolation') <> 'read committed' THEN
                    v_more := true;
                    CONTINUE;
                ELSIF NOT __S__.lock_lane_within(v_lane.lane_id, p_shard_wait) THEN
                    v_more := true;
                    CONTINUE;
                END IF;
            END IF;
            -- Where the walk must look: the slots of the lane's visible segments from the cursor
            -- sequence's segment on. The sequence is at or behind the cursor (it lags the ledger by
            -- the last claim), so these segments hold every row past the cursor and the ledger row
            -- of the last claim; a segment that commits later has a higher number than all of them
            -- (one writer per shard at a time), so a walk that does not see it cannot step over it.
            -- Named in an IN list of variables, the slots prune the ledger, walk and tombstone
            -- statements to their partitions when the executor starts (an array parameter does not
            -- prune): an unpruned statement opens and probes all sixteen slots' partitions and
            -- indexes, which was a fifth of a small claim's and completion's cost together.
            -- Usually they are all in the current slot, which one pruned probe shows: the segments
            -- there from the sequence's on are numbered without a hole up to the shard's last
            -- allocated one. Numbers are unique in a shard, so no other slot holds one of them, and
            -- none above was allocated before the probe. Otherwise (a rotation since, a segment
            -- rolled back or not yet committed), one statement over every slot finds them.
            -- The same statement asks whether the lane was parked after this claim looked: it starts
            -- after our lock, so its snapshot sees a park that committed before it (the park held the
            -- lane until its commit). The rows must be back before the walk, or it would step over
            -- them as a gap; unparking does not move the cursor, and brings the segments back into
            -- the current slot, so the probe is asked again.
            v_seq_cursor := coalesce(pg_sequence_last_value(v_lane.cursor_seq), 0);
            LOOP
                SELECT min(g.segment_no), max(g.segment_no), count(*),
                       (SELECT pg_sequence_last_value(l.segment_seq) FROM __S__.queue_lanes l
                        WHERE l.lane_id = v_lane.lane_id),
                       EXISTS (SELECT 1 FROM __S__.parked_lanes p WHERE p.lane_id = v_lane.lane_id)
                INTO v_seg_min, v_seg_max, v_seg_count, v_last_segment, v_parked
                FROM __S__.ready_segments g
                WHERE g.ready_slot = v_current_slot AND g.lane_id = v_lane.lane_id
                  AND g.segment_no >= v_seq_cursor >> 20;
                EXIT WHEN NOT v_parked;
                PERFORM __S__.unpark_lane(v_lane.lane_id);
            END LOOP;
            IF v_seg_min = v_seq_cursor >> 20 AND v_seg_count = v_seg_max - v_seg_min + 1
               AND v_seg_max >= v_last_segment THEN
                v_slots := ARRAY[v_current_slot];
            ELSE
                SELECT array_agg(DISTINCT g.ready_slot) INTO v_slots FROM __S__.ready_segments g
                WHERE g.lane_id = v_lane.lane_id AND g.segment_no >= v_seq_cursor >> 20;
            END IF;
            IF v_slots IS NULL THEN
                -- no visible segment past the sequence's: nothing to walk, and no ledger row past it
                CONTINUE;
            ELSIF cardinality(v_slots) <= 3 THEN
                v_slot_a := v_slots[1];
                v_slot_b := coalesce(v_slots[2], v_slot_a);
                v_slot_c := coalesce(v_slots[3], v_slot_a);
                -- and whether those slots hold a tombstone at all (cancelled jobs are rare). Every
                -- tombstone of this lane is written under the lane's lock, which this claim holds,
                -- so none can appear before the walk ends.
                SELECT greatest(v_seq_cursor, coalesce(max(upper(a.lane_range)) - 1, 0)),
                       EXISTS (SELECT 1 FROM __S__.ready_tombstones t
                               WHERE t.ready_slot IN (v_slot_a, v_slot_b, v_slot_c))
                INTO v_cursor, v_tombstones
                FROM __S__.ready_claim_attempt_batches a
                WHERE a.ready_slot IN (v_slot_a, v_slot_b, v_slot_c) AND a.lane_id = v_lane.lane_id;
            ELSE
                -- a backlog over more slots: the lane's cursor and walk over every slot
                v_slots := NULL;
                v_cursor := __S__.lane_cursor(v_lane.lane_id);
            END IF;
            IF v_cursor > v_seq_cursor THEN
                v_ignored := setval(v_lane.cursor_seq, v_cursor, true);
            END IF;
            v_new_cursor := v_cursor;
            v_last_slot := NULL;
            v_walked := 0;
            v_stopped := false;
            v_limit := (p_max - v_n) + 64;
            v_n_before := v_n;

            -- The walk in one statement where no row needs a step of its own: no tombstone in the
            -- slots (no spent row to pass over), no key limit (no room to count per row) and no job
            -- with a timeout of its own (no row-local claim). The rows come back as arrays, in
            -- lane order, up to one past the room: that one says the walk stopped at its room.
            -- The row-by-row walk below takes a statement per field of each row: for a cycle of 128
            -- jobs enqueued, claimed and completed, the server ran 13 % more instructions with it.
            -- A walk with room for fewer than eight rows stays row by row: for a few rows the
            -- aggregates' set-up costs more than the rows' statements.
            v_walked_in_one := false;
            IF v_slots IS NOT NULL AND NOT v_tombstones AND v_key_path IS NULL AND p_max - v_n >= 8 THEN
                SELECT count(*)::int, bool_or(w.timeout_ms IS NOT NULL),
                       array_agg(w.lane_pos), array_agg(w.run_at), array_agg(w.job_id), array_agg(w.run_lease + 1),
                       array_agg(w.ready_slot), array_agg(w.attempt + 1), array_agg(w.max_attempts),
                       array_agg(w.kind), array_agg(w.args), array_agg(w.priority), array_agg(w.created_at),
                       array_agg(w.traceparent_text)
                INTO v_w_n, v_w_timeouts, v_w_pos, v_w_run_at, v_w_jobs, v_w_leases, v_w_slots, v_w_attempts,
                     v_w_max_attempts, v_w_kinds, v_w_args, v_w_priorities, v_w_created, v_w_traceparents
                -- aggregated in the order the subquery returns its rows (one index scan, no join)
                FROM (SELECT e.lane_pos, e.run_at, e.job_id, e.run_lease, e.ready_slot, e.attempt,
                             e.max_attempts, e.kind, e.args, e.priority, e.created_at, e.timeout_ms,
                             __S__.traceparent_text(e.traceparent) AS traceparent_text
                      FROM __S__.ready_entries e
                      WHERE e.ready_slot IN (v_slot_a, v_slot_b, v_slot_c)
                        AND e.lane_id = v_lane.lane_id AND e.lane_pos > v_cursor
                      ORDER BY e.lane_pos
                      LIMIT p_max - v_n + 1) w;
                IF NOT coalesce(v_w_timeouts, false) THEN
                    v_walked_in_one := true;
                    -- the merge across shards: the first row of a new segment younger than the next
                    -- shard's head ends the walk before it, as in the row-by-row walk
                    IF v_lane.next_head IS NOT NULL AND v_w_n > 0 THEN
                        SELECT min(u.i)::int INTO v_w_cut
                        FROM unnest(v_w_pos, v_w_run_at) WITH ORDINALITY u(pos, run_at, i)
                        WHERE (u.pos >> 20) <> (coalesce(v_w_pos[u.i - 1], v_cursor) >> 20)
                          AND u.run_at > v_lane.next_head;
                    ELSE
                        v_w_cut := NULL;
                    END IF;
                    IF v_w_cut IS NOT NULL THEN
                        v_cut := true;
                        v_stopped := true;
                        v_walked := v_w_cut - 1;
                    ELSIF v_w_n > p_max - v_n THEN
                        v_stopped := true;
                        v_walked := p_max - v_n;
                    ELSE
                        v_walked := v_w_n;
                    END IF;
                    IF v_walked > 0 THEN
                        v_new_cursor := v_w_pos[v_walked];
                        v_last_slot := v_w_slots[v_walked];
                        v_job_ids := v_job_ids || v_w_jobs[1:v_walked];
                        v_leases := v_leases || v_w_leases[1:v_walked];
                        v_ready_slots := v_ready_slots || v_w_slots[1:v_walked];
                        v_attempts := v_attempts || v_w_attempts[1:v_walked];
                        v_max_attempts := v_max_attempts || v_w_max_attempts[1:v_walked];
                        v_kinds := v_kinds || v_w_kinds[1:v_walked];
                        v_args := v_args || v_w_args[1:v_walked];
                        v_priorities := v_priorities || v_w_priorities[1:v_walked];
                        v_created := v_created || v_w_created[1:v_walked];
                        v_traceparents := v_traceparents || v_w_traceparents[1:v_walked];
                        v_deadlines := v_deadlines || array_fill(v_batch_deadline, ARRAY[v_walked]);
                        v_n := v_n + v_walked;
                    END IF;
                END IF;
            END IF;
            IF NOT v_walked_in_one THEN
                -- No gap check: a shard is written by one open transaction at a time (enqueue_segment),
                -- so a segment missing below a visible one was rolled back or lost for good.
                -- The three statements differ only in the slots they name and whether they probe for
                -- tombstones (the probe was 5 % of an enqueue and claim of five jobs).
                IF v_slots IS NOT NULL AND NOT v_tombstones THEN
                    OPEN v_walk FOR
                        SELECT e.ready_slot, e.lane_pos, e.job_id, e.kind, e.args, e.attempt, e.run_lease,
                               e.max_attempts, e.priority, e.created_at, e.timeout_ms, e.queue, e.run_at, e.traceparent,
                               __S__.traceparent_text(e.traceparent) AS traceparent_text,
                               false AS spent
                        FROM __S__.ready_entries e
                        WHERE e.ready_slot IN (v_slot_a, v_slot_b, v_slot_c)
                          AND e.lane_id = v_lane.lane_id AND e.lane_pos > v_cursor
                        ORDER BY e.lane_pos
                        LIMIT v_limit;
                ELSIF v_slots IS NOT NULL THEN
                    OPEN v_walk FOR
                        SELECT e.ready_slot, e.lane_pos, e.job_id, e.kind, e.args, e.attempt, e.run_lease,
                               e.max_attempts, e.priority, e.created_at, e.timeout_ms, e.queue, e.run_at, e.traceparent,
                               __S__.traceparent_text(e.traceparent) AS traceparent_text,
                               EXISTS (SELECT 1 FROM __S__.ready_tombstones t
                                       WHERE t.ready_slot = e.ready_slot AND t.ready_slot IN (v_slot_a, v_slot_b, v_slot_c)
                                         AND t.job_id = e.job_id AND t.run_lease = e.run_lease) AS spent
                        FROM __S__.ready_entries e
                        WHERE e.ready_slot IN (v_slot_a, v_slot_b, v_slot_c)
                          AND e.lane_id = v_lane.lane_id AND e.lane_pos > v_cursor
                        ORDER BY e.lane_pos
                        LIMIT v_limit;
                ELSE
                    OPEN v_walk FOR
                        SELECT e.ready_slot, e.lane_pos, e.job_id, e.kind, e.args, e.attempt, e.run_lease,
                               e.max_attempts, e.priority, e.created_at, e.timeout_ms, e.queue, e.run_at, e.traceparent,
                               -- the text form, as before the row stored bytes (migration 0017): a process
                               -- of the previous build reads claims as text until it is replaced
                               __S__.traceparent_text(e.traceparent) AS traceparent_text,
                               EXISTS (SELECT 1 FROM __S__.ready_tombstones t
                                       WHERE t.ready_slot = e.ready_slot AND t.job_id = e.job_id
                                         AND t.run_lease = e.run_lease) AS spent
                        FROM __S__.ready_entries e
                        WHERE e.lane_id = v_lane.lane_id AND e.lane_pos > v_cursor
                        ORDER BY e.lane_pos
                        LIMIT v_limit;
                END IF;
                LOOP
                    FETCH v_walk INTO v_r_slot, v_r_pos, v_r_job, v_r_kind, v_r_args, v_r_attempt, v_r_lease, v_r_max_attempts,
                                      v_r_priority, v_r_created, v_r_timeout_ms, v_r_queue, v_r_run_at, v_r_traceparent,
                                      v_r_traceparent_text, v_r_spent;
                    EXIT WHEN NOT FOUND;
                    v_walked := v_walked + 1;
                    -- a new segment (the first row too, unless it continues the cursor's segment)
                    -- (the cursor's segment is the last walked row's, or the one the walk started in)
                    IF (v_r_pos >> 20) <> (v_new_cursor >> 20)
                       AND v_r_run_at > v_lane.next_head THEN
                        v_cut := true;
                        v_stopped := true;
                        EXIT;
                    END IF;
                    IF NOT v_r_spent AND v_n >= p_max THEN
                        v_stopped := true;
                        EXIT;
                    END IF;
                    v_new_cursor := v_r_pos;
                    v_last_slot := v_r_slot;
                    CONTINUE WHEN v_r_spent;
                    IF v_key_path IS NOT NULL THEN
                        v_key := v_r_args #>> v_key_path;
                        IF v_key IS NOT NULL AND coalesce((v_key_room ->> v_key)::int, v_key_default_room) <= 0 THEN
                            -- its key is at its limit: held out of the ring (the cursor passes over it)
                            -- until a claim finds room for the key (migration 0012, release_held)
                            INSERT INTO __S__.deferred_jobs (job_id, queue, kind, args, priority, attempt, run_lease,
                                                             max_attempts, run_at, created_at, timeout_ms, traceparent,
                                                             held_key)
                            VALUES (v_r_job, v_r_queue, v_r_kind, v_r_args, v_r_priority, v_r_attempt,
                                    v_r_lease + 1, v_r_max_attempts, '9999-01-01 00:00:00+00', v_r_created,
                                    v_r_timeout_ms, v_r_traceparent, v_key);
                            CONTINUE;
                        ELSIF v_key IS NOT NULL THEN
                            v_key_room := jsonb_set(v_key_room, ARRAY[v_key],
                                                    to_jsonb(coalesce((v_key_room ->> v_key)::int, v_key_default_room) - 1));
                            IF v_key_rate IS NOT NULL THEN
                                v_key_claimed := jsonb_set(v_key_claimed, ARRAY[v_key],
                                                           to_jsonb(coalesce((v_key_claimed ->> v_key)::int, 0) + 1));
                            END IF;
                        END IF;
                    END IF;

                    -- a statement a row counts: the own deadline is computed only for a job with a timeout
                    IF v_r_timeout_ms IS NOT NULL
                       AND v_now + make_interval(secs => v_r_timeout_ms / 1000.0) IS DISTINCT FROM v_batch_deadline THEN
                        v_own_deadline := v_now + make_interval(secs => v_r_timeout_ms / 1000.0);
                        v_row_local := v_row_local + 1;
                        v_deadlines := v_deadlines || v_own_deadline;
                        v_row_local_receipts := v_row_local_receipts
                            + int8multirange(int8range(v_batch * 4096 + v_n, v_batch * 4096 + v_n + 1));
                        INSERT INTO __S__.lease_claims (claim_slot, receipt_id, job_id, run_lease, queue, ready_slot,
                                                        lane_id, attempt, max_attempts, claimed_at, deadline_at)
                        VALUES (v_claim_slot, v_batch * 4096 + v_n, v_r_job, v_r_lease + 1, v_r_queue,
                                v_r_slot, v_lane.lane_id, v_r_attempt + 1, v_r_max_attempts, v_now,
                                v_own_deadline);
                    ELSE
                        v_deadlines := v_deadlines || v_batch_deadline;
                    END IF;
                    -- the arrays stay positional (receipt ordinal = array index - 1) over both shapes;
                    -- the batch's receipt ranges, not the arrays, say which ordinals are compact members
                    v_kinds := v_kinds || v_r_kind;
                    v_args := v_args || v_r_args;
                    v_priorities := v_priorities || v_r_priority;
                    v_created := v_created || v_r_created;
                    v_traceparents := v_traceparents || v_r_traceparent_text;
                    v_job_ids := v_job_ids || v_r_job;
                    v_leases := v_leases || (v_r_lease + 1);
                    v_ready_slots := v_ready_slots || v_r_slot;
                    v_attempts := v_attempts || (v_r_attempt + 1);
                    v_max_attempts := v_max_attempts || v_r_max_attempts;
                    v_n := v_n + 1;
                END LOOP;
                CLOSE v_walk;
            END IF;
            IF v_n > v_n_before THEN
                v_lane_ids := v_lane_ids || array_fill(v_lane.lane_id, ARRAY[v_n - v_n_before]);
            END IF;
            -- stopped by its row limit (spent rows between unclaimed ones): the shard has more
            IF NOT v_stopped AND v_walked >= v_limit THEN
                v_more := true;
            END IF;

            -- Walked every visible row of the shard: the last one ended its segment, so move the
            -- cursor to the segment's end; the shard then reads as drained from its sequences alone
            -- and later claims, producers and counts skip it without a probe. A segment's rows are
            -- written by the one transaction that reserved it, so they are visible all together:
            -- a walk that ran out of rows ran out at a segment's last row. Only a walk that found no
            -- row asks ready_segments whether the cursor already stands on one (and for the slot of
            -- its ledger row): that statement opens every queue slot's partition, which a claim
            -- that walked rows no longer does.
            IF NOT v_stopped AND v_walked < v_limit AND (v_new_cursor & 1048575) <> 1048575 THEN
                IF v_walked > 0 THEN
                    v_new_cursor := v_new_cursor | 1048575;
                ELSE
                    SELECT g.ready_slot INTO v_seg_slot FROM __S__.ready_segments g
                    WHERE g.lane_id = v_lane.lane_id AND g.segment_no = v_new_cursor >> 20
                      AND g.job_count = (v_new_cursor & 1048575) + 1;
                    IF FOUND THEN
                        v_new_cursor := v_new_cursor | 1048575;
                        v_last_slot := v_seg_slot;
                    END IF;
                END IF;
            END IF;

            IF v_new_cursor > v_cursor THEN
                INSERT INTO __S__.ready_claim_attempt_batches (ready_slot, lane_id, lane_range, claim_slot, claim_batch_id,
                                                               attempted_at)
                VALUES (v_last_slot, v_lane.lane_id, int8range(v_cursor + 1, v_new_cursor + 1), v_claim_slot, v_batch,
                        v_now);
            END IF;
        END LOOP;
        CLOSE v_shards;
        EXIT WHEN v_n >= p_max OR NOT v_cut OR v_pass >= 4;
    END LOOP;
    -- the last pass was cut at a segment boundary and no further pass followed
    IF v_cut THEN
        v_more := true;
    END IF;

    IF v_n > 0 THEN
        IF v_rate_limit IS NOT NULL OR v_key_claimed <> '{}' THEN
            PERFORM __S__.record_claim_rates(p_queue, v_now, v_rate_limit IS NOT NULL, v_n, v_key_claimed);
        END IF;
        -- the claim batch that holds the compact members' evidence (its receipt ranges: the batch's
        -- receipts less the row-local ones; the arrays are positional, receipt ordinal = array
        -- index - 1, and include the row-local claims' entries)
        IF v_row_local < v_n THEN
            INSERT INTO __S__.lease_claim_batches (claim_slot, batch_id, queue, job_ids, run_leases, ready_slots,
                                                   lane_ids, attempts, max_attempts, receipt_ranges,
                                                   claimed_count, claimed_at, deadline_at)
            VALUES (v_claim_slot, v_batch, p_queue, v_job_ids, v_leases, v_ready_slots, v_lane_ids, v_attempts,
                    v_max_attempts,
                    int8multirange(int8range(v_batch * 4096, v_batch * 4096 + v_n)) - v_row_local_receipts,
                    v_n - v_row_local, v_now, v_batch_deadline);
        END IF;
        -- The arrays side by side, unnested in the select list: there they run in step without a
        -- tuplestore each, which a FROM unnest of ten arrays fills and reads for every row.
        RETURN QUERY
        SELECT unnest(v_job_ids), unnest(v_leases), v_claim_slot, v_batch * 4096 + generate_series(0, v_n - 1),
               unnest(v_kinds), unnest(v_args), unnest(v_attempts), unnest(v_max_attempts), unnest(v_priorities),
               unnest(v_created), unnest(v_deadlines), unnest(v_traceparents), v_more;
    ELSIF p_empty_row THEN
        -- took nothing: one row of NULLs but `more`, so that the caller knows without asking
        -- queue_has_backlog whether to wait for a NOTIFY (false: the claim saw every visible job)
        more := v_more;
        RETURN NEXT;
    END IF;
END
$$;

-- The claim of the SQL API and of processes of earlier builds: no shard wait, no empty row. A
-- function of its own rather than defaults on the one above: a process of an earlier build that
-- reinstalls its functions replaces this one, and the two never make a call ambiguous. Its settings
-- are the claim's, so that every claim runs with them whichever form is called.
CREATE OR REPLACE FUNCTION __S__.claim(p_queue text, p_max int, p_deadline interval DEFAULT NULL,
                                       p_aging interval DEFAULT NULL)
RETURNS TABLE (job_id bigint, run_lease bigint, claim_slot int, receipt_id bigint, kind text, args jsonb,
               attempt int, max_attempts int, priority smallint, created_at timestamptz,
               deadline_at timestamptz, traceparent text, more boolean)
LANGUAGE sql SET plan_cache_mode = force_generic_plan SET jit = off AS $$
    SELECT * FROM __S__.claim(p_queue, p_max, p_deadline, p_aging, NULL, false)
$$;
