-- The archive (migration 0004): terminal history, appended by prune just before it truncates a
-- queue slot, kept in rings of time buckets and reclaimed by truncating a whole bucket; and
-- archive search, which indexes it by argument content while the archive_search setting is on.
--
-- Every function of the engine is defined exactly once, in the file of its plane, and installed with
-- CREATE OR REPLACE by src/schema.rs whenever the combined hash of these files changes. A function
-- that is removed is dropped by name in dropped.sql. __S__ is the validated schema name.

-- The number of buckets of each archive table (its LIST partitions, created by migration 0004).
CREATE OR REPLACE FUNCTION __S__.archive_buckets() RETURNS int
LANGUAGE sql IMMUTABLE AS $$ SELECT 32 $$;

-- The bucket of a row finalized at p_at, for a keep of p_keep: buckets are keep / 30 long (at least
-- a minute), so with 32 buckets a bucket's rows are all older than the keep one period before the
-- bucket is written again. A keep that changes moves rows to other buckets; retention only ever
-- truncates a bucket whose newest row is older than the keep, so a change keeps some rows longer,
-- never shorter.
CREATE OR REPLACE FUNCTION __S__.archive_bucket(p_at timestamptz, p_keep interval) RETURNS int
LANGUAGE sql STABLE AS $$
    SELECT (floor(extract(epoch FROM p_at)
                  / greatest(extract(epoch FROM p_keep) / (__S__.archive_buckets() - 2), 60))::bigint
            % __S__.archive_buckets())::int
$$;

-- Archive search (migrations 0026, 0027): one archived_job_args row per job of the slot's terminal history
-- that archive_slot copies, from the same rows, under the same keeps and into the same time buckets
-- (completions in 0..31, failed, cancelled and row-completed jobs in 32..63), while the
-- archive_search setting is on. p_completions, p_terminal: which of the two archive_slot copies
-- this time. p_skip_indexed: the slot was copied before (a mark exists), so jobs already indexed
-- are skipped by (job, run lease), looked up in the one partition their row would be in.
CREATE OR REPLACE FUNCTION __S__.archive_slot_search(p_slot int, p_keep_completed interval,
                                                     p_keep_failed interval, p_completions boolean,
                                                     p_terminal boolean, p_skip_indexed boolean)
RETURNS void
LANGUAGE plpgsql SET plan_cache_mode = force_custom_plan AS $$
BEGIN
    INSERT INTO __S__.archived_job_args (archive_bucket, job_id, run_lease, attempt, finalized_at, doc)
    SELECT x.bucket, x.job_id, x.run_lease, x.attempt, x.finalized_at,
           jsonb_build_object('args', x.args, 'queue', x.queue, 'kind', x.kind, 'state', x.state)
    FROM (
        SELECT __S__.archive_bucket(b.finalized_at, p_keep_completed) AS bucket, u.job_id, u.run_lease,
               b.queue, coalesce(e.kind, '') AS kind, 'completed' AS state, coalesce(e.attempt + 1, 0) AS attempt,
               b.finalized_at, coalesce(e.args, 'null'::jsonb) AS args
        FROM __S__.receipt_completion_batches b
        CROSS JOIN LATERAL unnest(b.job_ids, b.run_leases) AS u(job_id, run_lease)
        LEFT JOIN LATERAL (
            SELECT r.kind, r.args, r.attempt FROM __S__.ready_entries r
            WHERE r.ready_slot = p_slot AND r.job_id = u.job_id AND r.run_lease = u.run_lease - 1
            LIMIT 1
        ) e ON true
        WHERE p_completions AND p_keep_completed > interval '0' AND b.ready_slot = p_slot
          AND b.finalized_at > now() - p_keep_completed
        UNION ALL
        SELECT __S__.archive_buckets() + __S__.archive_bucket(d.finalized_at, p_keep_failed), d.job_id,
               d.run_lease, d.queue, d.kind, d.state, d.attempt, d.finalized_at, d.args
        FROM __S__.done_entries d
        WHERE p_terminal AND p_keep_failed > interval '0' AND d.ready_slot = p_slot
          AND d.finalized_at > now() - p_keep_failed
    ) x
    WHERE NOT p_skip_indexed
       OR NOT EXISTS (SELECT 1 FROM __S__.archived_job_args a
                      WHERE a.archive_bucket = x.bucket AND a.job_id = x.job_id AND a.run_lease = x.run_lease);
END
$$;

-- Append to the archive what a queue slot's generation holds of terminal history and the archive
-- does not have yet, and mark how far that goes (queue_slot_archive_marks, migration 0016).
-- Completions become rows of up to 256 jobs: a queue's jobs finalized in one second (and one time
-- bucket), in job order, with their kinds, args, attempts and creation times from their ready rows
-- (a completion batch lives in its jobs' ready slot, so those rows are here) and each job's
-- finalization time (migration 0028). Below saturation a completion batch holds a few jobs, and a
-- row per batch cost about 195 bytes of WAL per job against 10 to 20 for rows of hundreds; the one
-- second keeps a row's jobs together in time, which the history listing relies on (list_jobs). A
-- keep of zero archives nothing of that kind; rows already older than their keep are not archived.
--
-- Without a mark of this generation everything is copied. With one whose counts equal the slot's
-- rows now, nothing is (rows are only ever added to a slot until its TRUNCATE). Otherwise only
-- the rows whose copy is missing, found by (job, run lease): a completion or a terminal row of an
-- attempt is written once, and a completion batch is copied whole by one statement, so its first
-- job tells whether it was. The slot's rows are counted before the copy: rows that commit during
-- it (archive_queue_slot_ahead holds ACCESS SHARE only) are then copied by the next call rather
-- than counted as copied. Returns 'copied' or 'up_to_date'.
--
-- The copy sorts the slot's completions once, after joining their ready rows (a plain join, which
-- the planner can hash: an attempt has one ready row in a slot's generation, as each ready row
-- carries a new run lease), and
-- the aggregates read that order: an aggregate's own ORDER BY sorts its input again, once for each
-- of the seven arrays, and a probe a job for its ready row was a third of the copy's cost. The join
-- stays above the subquery with the window, which the planner cannot flatten: written beside the
-- completions' LATERAL unnest, it was planned inside it, a scan of the slot's ready rows for each
-- completion batch (tried in archive_slot_search: twice the instructions a job).
--
-- p_ready_segments: the slot's ready segments counted before a proof that passed (archive ahead),
-- recorded in the mark so that prune can trust that proof while the count holds (migration 0018);
-- NULL when the caller has no such proof.
CREATE OR REPLACE FUNCTION __S__.archive_slot(p_slot int, p_generation bigint, p_keep_completed interval,
                                   p_keep_failed interval, p_ready_segments bigint)
RETURNS text
LANGUAGE plpgsql SET plan_cache_mode = force_custom_plan AS $$
DECLARE
    v_batches int;
    v_terminal int;
    v_marked_batches int;
    v_marked_terminal int;
BEGIN
    SELECT count(*) INTO v_batches FROM __S__.receipt_completion_batches b WHERE b.ready_slot = p_slot;
    SELECT count(*) INTO v_terminal FROM __S__.done_entries d WHERE d.ready_slot = p_slot;
    SELECT max(m.completion_batches), max(m.terminal_rows) INTO v_marked_batches, v_marked_terminal
    FROM __S__.queue_slot_archive_marks m
    WHERE m.ready_slot = p_slot AND m.generation = p_generation;
    IF (v_marked_batches, v_marked_terminal) = (v_batches, v_terminal) THEN
        RETURN 'up_to_date';
    END IF;
    IF p_keep_completed > interval '0' AND v_batches IS DISTINCT FROM v_marked_batches THEN
        INSERT INTO __S__.archived_completion_batches (archive_bucket, finalized_at, queue, job_range, job_ids,
                                                       run_leases, kinds, args, attempts, created_ats,
                                                       finalized_ats, ready_slot, generation)
        SELECT g.bucket, max(g.finalized_at), g.queue, int8range(min(g.job_id), max(g.job_id), '[]'),
               array_agg(g.job_id),
               array_agg(g.run_lease),
               array_agg(coalesce(g.kind, '')),
               array_agg(coalesce(g.args, 'null'::jsonb)),
               array_agg(coalesce(g.attempt + 1, 0)),
               array_agg(g.created_at),
               array_agg(g.finalized_at),
               p_slot, p_generation
        FROM (SELECT w.*, e.kind, e.args, e.attempt, e.created_at FROM (
            SELECT __S__.archive_bucket(b.finalized_at, p_keep_completed) AS bucket, b.queue,
                   date_trunc('second', b.finalized_at) AS second, b.finalized_at, u.job_id, u.run_lease,
                   (row_number() OVER (PARTITION BY __S__.archive_bucket(b.finalized_at, p_keep_completed),
                                                    b.queue, date_trunc('second', b.finalized_at)
                                       ORDER BY u.job_id, u.run_lease) - 1) / 256 AS chunk
            FROM __S__.receipt_completion_batches b
            CROSS JOIN LATERAL unnest(b.job_ids, b.run_leases) AS u(job_id, run_lease)
            WHERE b.ready_slot = p_slot AND b.finalized_at > now() - p_keep_completed
              AND (v_marked_batches IS NULL
                   OR NOT EXISTS (SELECT 1 FROM __S__.archived_completion_batches a
                                  WHERE a.job_range @> b.job_ids[1]
                                    AND EXISTS (SELECT 1 FROM unnest(a.job_ids, a.run_leases) AS c(job_id, run_lease)
                                                WHERE c.job_id = b.job_ids[1] AND c.run_lease = b.run_leases[1])))
        ) w
        LEFT JOIN __S__.ready_entries e
               ON e.ready_slot = p_slot AND e.job_id = w.job_id AND e.run_lease = w.run_lease - 1
        ORDER BY w.bucket, w.queue, w.second, w.chunk, w.job_id, w.run_lease) g
        GROUP BY g.bucket, g.queue, g.second, g.chunk;
    END IF;
    IF p_keep_failed > interval '0' AND v_terminal IS DISTINCT FROM v_marked_terminal THEN
        INSERT INTO __S__.archived_jobs (archive_bucket, job_id, run_lease, queue, kind, args, priority, attempt,
                                         max_attempts, state, error, created_at, finalized_at, ready_slot,
                                         generation)
        SELECT __S__.archive_bucket(d.finalized_at, p_keep_failed), d.job_id, d.run_lease, d.queue, d.kind,
               d.args, d.priority, d.attempt, d.max_attempts, d.state, d.error, d.created_at, d.finalized_at,
               p_slot, p_generation
        FROM __S__.done_entries d
        WHERE d.ready_slot = p_slot AND d.finalized_at > now() - p_keep_failed
          AND (v_marked_terminal IS NULL
               OR NOT EXISTS (SELECT 1 FROM __S__.archived_jobs a
                              WHERE a.job_id = d.job_id AND a.run_lease = d.run_lease));
    END IF;
    IF __S__.setting('archive_search') IS NOT NULL THEN
        PERFORM __S__.archive_slot_search(p_slot, p_keep_completed, p_keep_failed,
                                          v_batches IS DISTINCT FROM v_marked_batches,
                                          v_terminal IS DISTINCT FROM v_marked_terminal,
                                          v_marked_batches IS NOT NULL OR v_marked_terminal IS NOT NULL);
    END IF;
    INSERT INTO __S__.queue_slot_archive_marks (ready_slot, generation, completion_batches, terminal_rows,
                                                ready_segments)
    VALUES (p_slot, p_generation, v_batches, v_terminal, p_ready_segments);
    RETURN 'copied';
END
$$;

-- Archive a sealed queue slot ahead of its prune (migration 0016), holding ACCESS SHARE on the
-- slot's children only: claims, completions and readers (pg_dump included) go on meanwhile, and
-- the prune that follows finds the copy done and holds its ACCESS EXCLUSIVE locks only to count,
-- record totals and truncate. Only a provable slot is archived ahead (a slot that still receives
-- completions would be copied again and again); prune copies whatever is left. One archiver per
-- slot at a time (a try-lock: two at once would both copy). The slot's state is read from its own
-- ledger child, not from the queue_ring_slots view, so that this transaction locks no other slot's
-- ledger while it copies. Returns 'copied', 'up_to_date', 'not_sealed', the proof's blocker
-- (queue_slot_blocker), or 'busy': another archiver has the slot, or a prune holds it longer than
-- p_lock_timeout.
CREATE OR REPLACE FUNCTION __S__.archive_queue_slot_ahead(p_slot int, p_lock_timeout text,
                                               p_keep_completed interval, p_keep_failed interval)
RETURNS text
LANGUAGE plpgsql SET plan_cache_mode = force_custom_plan AS $$
DECLARE
    v_event text;
    v_generation bigint;
    v_blocker text;
    v_children text;
    v_segments bigint;
BEGIN
    IF NOT pg_try_advisory_xact_lock(__S__.lock_ns('archive_ahead'), p_slot) THEN
        RETURN 'busy';
    END IF;
    SELECT string_agg(format('%I.%I', '__S__', t || '_' || p_slot), ', ') INTO v_children
    FROM unnest(ARRAY['queue_ring_ledger', 'queue_slot_archive_marks', 'ready_entries', 'ready_segments',
                      'done_entries', 'receipt_completion_batches']) t;
    -- taken before the state is read: a prune that has not committed by then cannot truncate the
    -- slot under the copy, and one that has is seen in the ledger
    PERFORM set_config('lock_timeout', p_lock_timeout, true);
    BEGIN
        EXECUTE 'LOCK TABLE ' || v_children || ' IN ACCESS SHARE MODE';
    EXCEPTION WHEN lock_not_available THEN
        RETURN 'busy';
    END;
    PERFORM set_config('lock_timeout', '0', true);
    SELECT l.event, l.generation INTO v_event, v_generation
    FROM __S__.queue_ring_ledger l
    WHERE l.ready_slot = p_slot
    ORDER BY l.generation DESC, CASE l.event WHEN 'opened' THEN 1 WHEN 'sealed' THEN 2 ELSE 3 END DESC
    LIMIT 1;
    IF v_event IS DISTINCT FROM 'sealed' THEN
        RETURN 'not_sealed';
    END IF;
    -- archived ahead already: the slot was provable then, and a provable slot gains no claim and
    -- so no completion (a late producer's rows are claimed, completed and copied by the prune,
    -- under its locks). Without this, every tick that found the slot busy re-ran its proof here,
    -- 100 ms and more a slot once a reader had let the rings grow.
    IF EXISTS (SELECT 1 FROM __S__.queue_slot_archive_marks m
               WHERE m.ready_slot = p_slot AND m.generation = v_generation) THEN
        RETURN 'up_to_date';
    END IF;
    -- counted before the proof, so the proof saw every row of the segments counted; the mark
    -- keeps the count, and the prune trusts this proof while the slot still has that many
    SELECT count(*) INTO v_segments FROM __S__.ready_segments s WHERE s.ready_slot = p_slot;
    v_blocker := __S__.queue_slot_blocker(p_slot);
    IF v_blocker IS NOT NULL THEN
        RETURN v_blocker;
    END IF;
    RETURN __S__.archive_slot(p_slot, v_generation, p_keep_completed, p_keep_failed, v_segments);
END
$$;

-- Whether an archived row's slot generation is still in the queue ring (archived ahead of a prune
-- that has not happened yet): then the ring's rows are the job's record, and readers of the archive
-- skip the copy so that no job is listed twice. A slot's 'sealed' event goes with its TRUNCATE.
-- Rows archived before migration 0016 carry no slot and are never in the ring.
CREATE OR REPLACE FUNCTION __S__.archived_slot_in_ring(p_slot int, p_generation bigint) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT p_slot IS NOT NULL
       AND EXISTS (SELECT 1 FROM __S__.queue_ring_ledger l
                   WHERE l.ready_slot = p_slot AND l.generation = p_generation AND l.event = 'sealed')
$$;

-- Retention of one archive table ('completions', 'jobs', or archive search's rows of either,
-- 'completions_search' and 'jobs_search'): truncate every bucket other than the
-- current one whose newest row is older than p_keep, re-checked under its ACCESS EXCLUSIVE lock,
-- which is waited for at most p_lock_timeout (a busy bucket is tried again next tick). Returns the
-- number of buckets truncated.
CREATE OR REPLACE FUNCTION __S__.archive_expire(p_table text, p_keep interval, p_lock_timeout text)
RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    v_parent text := CASE p_table WHEN 'completions' THEN 'archived_completion_batches'
                                  WHEN 'jobs' THEN 'archived_jobs'
                                  WHEN 'completions_search' THEN 'archived_job_args'
                                  WHEN 'jobs_search' THEN 'archived_job_args' END;
    -- archive search's jobs rows are in the partitions after its completions' (migrations 0026, 0027)
    v_first int := CASE p_table WHEN 'jobs_search' THEN __S__.archive_buckets() ELSE 0 END;
    v_current int := __S__.archive_bucket(now(), p_keep);
    v_child text;
    v_newest timestamptz;
    v_n int := 0;
BEGIN
    IF v_parent IS NULL THEN
        RAISE EXCEPTION 'ringwork: no archive table %', p_table USING ERRCODE = '22023';
    END IF;
    FOR v_bucket IN 0 .. __S__.archive_buckets() - 1 LOOP
        CONTINUE WHEN v_bucket = v_current;
        v_child := format('%I.%I', '__S__', v_parent || '_' || (v_first + v_bucket));
        EXECUTE 'SELECT max(finalized_at) FROM ' || v_child INTO v_newest;
        CONTINUE WHEN v_newest IS NULL OR v_newest >= now() - p_keep;
        CONTINUE WHEN NOT __S__.lock_exclusive_within(v_child, p_lock_timeout);
        EXECUTE 'SELECT max(finalized_at) FROM ' || v_child INTO v_newest;
        IF v_newest < now() - p_keep THEN
            EXECUTE 'TRUNCATE ' || v_child;
            v_n := v_n + 1;
        END IF;
    END LOOP;
    RETURN v_n;
END
$$;

-- Archive search (migrations 0026, 0027): the archived jobs whose arguments contain p_args (jsonb
-- containment) and, when given, of a queue, kind and state, looked up together in the GIN index
-- of `doc`; then those finalized in [p_since, p_until), newest first after the page key
-- (p_before_at, p_before_id), at most p_limit. The index yields its matches in no order, so a page
-- newest first reads them all: a search reads at most p_cap + 1 of them, and `matched` says how
-- many it read (p_cap + 1: too wide to order; more keys, a queue, a kind or a state narrow it, a
-- time range does not). A lookup with nothing to look up (no value anywhere in it: every job
-- matches) reads the table, p_cap + 1 rows at most, rather than the whole index. Rows whose slot
-- is still in the ring are included: archived ahead, their jobs are final. Sequential scans off
-- otherwise: a partition never analyzed has no statistics, and the index is what answers.
CREATE OR REPLACE FUNCTION __S__.search_archive(p_args jsonb, p_queue text, p_kind text, p_state text,
                                                p_since timestamptz, p_until timestamptz,
                                                p_before_at timestamptz, p_before_id bigint, p_limit int,
                                                p_cap int)
RETURNS TABLE (job_id bigint, state text, queue text, kind text, args jsonb, attempt int, at timestamptz,
               page_key text, matched int)
-- VOLATILE: a lookup with nothing to look up turns sequential scans back on for its statement
LANGUAGE plpgsql SET jit = off SET enable_seqscan = off AS $$
DECLARE
    -- the filters given, beside the arguments (not jsonb_strip_nulls: a null inside p_args is
    -- looked for)
    v_lookup jsonb := jsonb_build_object('args', p_args)
                      || CASE WHEN p_queue IS NULL THEN '{}' ELSE jsonb_build_object('queue', p_queue) END
                      || CASE WHEN p_kind IS NULL THEN '{}' ELSE jsonb_build_object('kind', p_kind) END
                      || CASE WHEN p_state IS NULL THEN '{}' ELSE jsonb_build_object('state', p_state) END;
BEGIN
    IF p_args IS NULL OR p_limit IS NULL OR p_cap IS NULL THEN
        RAISE EXCEPTION 'ringwork: search_archive needs arguments to look for, a limit and a cap'
            USING ERRCODE = '22023';
    END IF;
    IF NOT jsonb_path_exists(v_lookup, 'strict $.** ? (@.type() != "object" && @.type() != "array")') THEN
        PERFORM set_config('enable_seqscan', 'on', true);
    END IF;
    RETURN QUERY
        WITH candidates AS MATERIALIZED (
            SELECT a.job_id, a.doc, a.attempt, a.finalized_at
            FROM __S__.archived_job_args a
            WHERE a.doc @> v_lookup
            LIMIT p_cap + 1
        ), m AS (
            SELECT c.* FROM candidates c
            WHERE (p_since IS NULL OR c.finalized_at >= p_since) AND (p_until IS NULL OR c.finalized_at < p_until)
              AND (p_before_at IS NULL OR (c.finalized_at, c.job_id) < (p_before_at, p_before_id))
        )
        SELECT m.job_id, m.doc->>'state', m.doc->>'queue', m.doc->>'kind', m.doc->'args', m.attempt,
               m.finalized_at, 'T' || (extract(epoch FROM m.finalized_at) * 1000000)::bigint || ':' || m.job_id,
               (SELECT count(*) FROM candidates)::int
        FROM m
        ORDER BY m.finalized_at DESC, m.job_id DESC
        LIMIT p_limit;
END
$$;

-- A job's archived terminal rows: completions (from the batch rows whose job range covers it) and
-- failed, cancelled or row-completed attempts; not those whose slot is still in the ring, which the
-- ring's readers give.
CREATE OR REPLACE FUNCTION __S__.archived_job(p_job_id bigint)
RETURNS TABLE (state text, queue text, kind text, args jsonb, attempt int, run_lease bigint, error text,
               created_at timestamptz, finalized_at timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT 'completed', a.queue, a.kinds[o.i], a.args[o.i], a.attempts[o.i], a.run_leases[o.i], NULL::text,
           a.created_ats[o.i], coalesce(a.finalized_ats[o.i], a.finalized_at)
    FROM __S__.archived_completion_batches a
    CROSS JOIN LATERAL (SELECT array_position(a.job_ids, p_job_id) AS i) o
    WHERE a.job_range @> p_job_id AND o.i IS NOT NULL
      AND NOT __S__.archived_slot_in_ring(a.ready_slot, a.generation)
    UNION ALL
    SELECT j.state, j.queue, j.kind, j.args, j.attempt, j.run_lease, j.error, j.created_at, j.finalized_at
    FROM __S__.archived_jobs j
    WHERE j.job_id = p_job_id AND NOT __S__.archived_slot_in_ring(j.ready_slot, j.generation)
$$;

-- ---------------------------------------------------------------------------------------------
-- Durable terminal totals (migration 0006). A queue's completed, failed and cancelled totals are
-- the sum of its terminal_totals rows plus what its ring slots still hold (queue_counts in
-- read.sql). Rows come from prune (record_slot_totals) and from folds (fold_terminal_totals).
-- ---------------------------------------------------------------------------------------------

-- The number of totals buckets (the LIST partitions of migration 0006).
CREATE OR REPLACE FUNCTION __S__.totals_buckets() RETURNS int
LANGUAGE sql IMMUTABLE AS $$ SELECT 8 $$;

-- The bucket written at p_at: five minutes each, round the ring in forty. A fold that cannot get its
-- lock leaves its bucket to a later tick; writing into a bucket that still holds rows when the ring
-- comes round is harmless, because a fold moves whatever a bucket holds.
CREATE OR REPLACE FUNCTION __S__.totals_bucket(p_at timestamptz) RETURNS int
LANGUAGE sql STABLE AS $$
    SELECT (floor(extract(epoch FROM p_at) / 300)::bigint % __S__.totals_buckets())::int
$$;

-- Append a queue slot's terminal counts, one row per queue. Called by prune_queue_slot under the
-- slot's ACCESS EXCLUSIVE locks, right before the TRUNCATE, so every terminal row of the slot is
-- counted exactly once: here, or (before the prune) by queue_counts' read of the ring.
CREATE OR REPLACE FUNCTION __S__.record_slot_totals(p_slot int) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO __S__.terminal_totals (totals_bucket, queue, completed, failed, cancelled)
    SELECT __S__.totals_bucket(now()), t.queue, sum(t.completed), sum(t.failed), sum(t.cancelled)
    FROM (
        SELECT b.queue, b.completed_count::bigint AS completed, 0::bigint AS failed, 0::bigint AS cancelled
        FROM __S__.receipt_completion_batches b WHERE b.ready_slot = p_slot
        UNION ALL
        SELECT d.queue, (d.state = 'completed')::int, (d.state = 'failed')::int, (d.state = 'cancelled')::int
        FROM __S__.done_entries d WHERE d.ready_slot = p_slot
    ) t
    GROUP BY t.queue
$$;

-- Fold every totals bucket but the current one into one row per queue in the current bucket, and
-- truncate it: insert and truncate commit together, under the bucket's ACCESS EXCLUSIVE lock
-- (waited for at most p_lock_timeout; a busy bucket is tried again next tick). The sums are read
-- after the lock is granted, so a fold after another finds the buckets empty. Returns the number
-- of buckets folded. One fold at a time (a try-lock: a second returns 0 at once, the first is doing
-- the work): two at once both read a bucket (ACCESS SHARE) and then both asked for its ACCESS
-- EXCLUSIVE lock, a lock upgrade that deadlocked (seen in tests/archive.rs under load).
CREATE OR REPLACE FUNCTION __S__.fold_terminal_totals(p_lock_timeout text) RETURNS int
LANGUAGE plpgsql AS $$
DECLARE
    v_current int := __S__.totals_bucket(now());
    v_child text;
    v_any boolean;
    v_n int := 0;
BEGIN
    IF NOT pg_try_advisory_xact_lock(__S__.lock_ns('totals_fold'), 0) THEN
        RETURN 0;
    END IF;
    FOR v_bucket IN 0 .. __S__.totals_buckets() - 1 LOOP
        CONTINUE WHEN v_bucket = v_current;
        v_child := format('%I.%I', '__S__', 'terminal_totals_' || v_bucket);
        EXECUTE 'SELECT EXISTS (SELECT 1 FROM ' || v_child || ')' INTO v_any;
        CONTINUE WHEN NOT v_any;
        CONTINUE WHEN NOT __S__.lock_exclusive_within(v_child, p_lock_timeout);
        EXECUTE 'INSERT INTO __S__.terminal_totals (totals_bucket, queue, completed, failed, cancelled) '
                'SELECT $1, queue, sum(completed), sum(failed), sum(cancelled) FROM ' || v_child
                || ' GROUP BY queue'
        USING v_current;
        EXECUTE 'TRUNCATE ' || v_child;
        v_n := v_n + 1;
    END LOOP;
    RETURN v_n;
END
$$;

-- The archive's buckets that hold history: the oldest and newest finalize time in each (by the
-- finalized_at index of each partition: two probes per table, never a scan), its completion
-- batches and job rows as the statistics estimate them, and its size. For the storage page: how
-- far back history goes, and what it costs on disk. Sequential scans off: without statistics (a
-- partition never analyzed) the planner may pick one for a min(), and a bucket can hold millions
-- of rows; the index answers either way.
CREATE OR REPLACE FUNCTION __S__.archive_bucket_spans()
RETURNS TABLE (bucket int, oldest timestamptz, newest timestamptz, batches_estimate bigint,
               rows_estimate bigint, total_bytes bigint)
LANGUAGE sql STABLE SET jit = off SET enable_seqscan = off AS $$
    SELECT b.bucket, s.oldest, s.newest,
           greatest((SELECT c.reltuples FROM pg_class c
                     WHERE c.oid = format('%I.%I', '__S__', 'archived_completion_batches_' || b.bucket)::regclass), 0)::bigint,
           greatest((SELECT c.reltuples FROM pg_class c
                     WHERE c.oid = format('%I.%I', '__S__', 'archived_jobs_' || b.bucket)::regclass), 0)::bigint,
           pg_total_relation_size(format('%I.%I', '__S__', 'archived_completion_batches_' || b.bucket)::regclass)
           + pg_total_relation_size(format('%I.%I', '__S__', 'archived_jobs_' || b.bucket)::regclass)
           -- archive search's rows of the same buckets (migrations 0026, 0027)
           + pg_total_relation_size(format('%I.%I', '__S__', 'archived_job_args_' || b.bucket)::regclass)
           + pg_total_relation_size(format('%I.%I', '__S__', 'archived_job_args_' || (b.bucket + __S__.archive_buckets()))::regclass)
    FROM generate_series(0, __S__.archive_buckets() - 1) b(bucket)
    CROSS JOIN LATERAL (
        SELECT least((SELECT min(a.finalized_at) FROM __S__.archived_completion_batches a WHERE a.archive_bucket = b.bucket),
                     (SELECT min(j.finalized_at) FROM __S__.archived_jobs j WHERE j.archive_bucket = b.bucket)) AS oldest,
               greatest((SELECT max(a.finalized_at) FROM __S__.archived_completion_batches a WHERE a.archive_bucket = b.bucket),
                        (SELECT max(j.finalized_at) FROM __S__.archived_jobs j WHERE j.archive_bucket = b.bucket)) AS newest
    ) s
    WHERE s.oldest IS NOT NULL
    ORDER BY s.oldest
$$;
