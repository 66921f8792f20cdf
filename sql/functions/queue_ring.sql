-- Queue plane: lanes, lane cursors and enqueue into the queue ring (ready_slot).
--
-- Every function of the engine is defined exactly once, in the file of its plane, and installed with
-- CREATE OR REPLACE by src/schema.rs whenever the combined hash of these files changes. A function
-- that is removed is dropped by name in dropped.sql. __S__ is the validated schema name.

-- ---------------------------------------------------------------------------------------------
-- Lanes and shards. A lane is (queue, priority, shard); every shard is a queue_lanes row with its
-- own segment and cursor sequences, and everything downstream (claim walk, ledger, counts, cancel,
-- prune proof) works per lane_id, that is per shard.
-- ---------------------------------------------------------------------------------------------

-- Shards every (queue, priority) gets with its first use, created outside producers' transactions.
-- They are what lets claimers in several processes work one queue at once, so there should be at
-- least as many as worker processes; an idle shard costs a sequence read per claim.
CREATE OR REPLACE FUNCTION __S__.lane_base_shards() RETURNS int
LANGUAGE sql IMMUTABLE AS $$ SELECT 8 $$;

-- At most this many shards per (queue, priority). Beyond it, a producer that finds every shard
-- held by another open transaction waits for one (the only case where an enqueue waits).
CREATE OR REPLACE FUNCTION __S__.lane_shard_cap() RETURNS int
LANGUAGE sql IMMUTABLE AS $$ SELECT 256 $$;

-- One new shard: a lane row and its two sequences. p_shard NULL numbers it by its lane_id, which is
-- unique and larger than every base shard number of its lane, so concurrent creators never wait on
-- one another's uncommitted row.
-- SECURITY DEFINER: a lane's sequences are created as the schema's owner, so producers and workers
-- need no CREATE on the schema (docs/operations.md, "Roles"). Its search_path is fixed, as a definer
-- function's must be, and PUBLIC may not call it: only the roles granted EXECUTE.
CREATE OR REPLACE FUNCTION __S__.create_lane_shard(p_queue text, p_priority smallint, p_shard int)
RETURNS __S__.queue_lanes
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_id int := nextval('__S__.lane_ids');
    v_lane __S__.queue_lanes;
BEGIN
    EXECUTE format('CREATE SEQUENCE %I.%I MINVALUE 1', '__S__', 'lane_' || v_id || '_segment');
    EXECUTE format('CREATE SEQUENCE %I.%I MINVALUE 0 START 0', '__S__', 'lane_' || v_id || '_cursor');
    INSERT INTO __S__.queue_lanes (lane_id, queue, priority, shard, segment_seq, cursor_seq)
    VALUES (v_id, p_queue, p_priority, coalesce(p_shard, v_id),
            format('%I.%I', '__S__', 'lane_' || v_id || '_segment')::regclass,
            format('%I.%I', '__S__', 'lane_' || v_id || '_cursor')::regclass)
    RETURNING * INTO v_lane;
    RETURN v_lane;
END
$$;
REVOKE EXECUTE ON FUNCTION __S__.create_lane_shard(text, smallint, int) FROM PUBLIC;

-- The lane's base shards, created on first use (and completed for lanes created before shards
-- existed). Returns shard 0.
CREATE OR REPLACE FUNCTION __S__.ensure_lane(p_queue text, p_priority smallint) RETURNS __S__.queue_lanes
LANGUAGE plpgsql AS $$
DECLARE
    v_lane __S__.queue_lanes;
    v_shard int;
BEGIN
    IF (SELECT count(*) FROM __S__.queue_lanes l
        WHERE l.queue = p_queue AND l.priority = p_priority AND l.shard < __S__.lane_base_shards())
       = __S__.lane_base_shards() THEN
        SELECT * INTO v_lane FROM __S__.queue_lanes l
        WHERE l.queue = p_queue AND l.priority = p_priority AND l.shard = 0;
        RETURN v_lane;
    END IF;
    -- first use of the lane: serialize creators, then create its shards
    PERFORM pg_advisory_xact_lock(__S__.lock_ns('lane-create'), 0);
    INSERT INTO __S__.queues (queue) VALUES (p_queue) ON CONFLICT DO NOTHING;
    FOR v_shard IN 0 .. __S__.lane_base_shards() - 1 LOOP
        IF NOT EXISTS (SELECT 1 FROM __S__.queue_lanes l
                       WHERE l.queue = p_queue AND l.priority = p_priority AND l.shard = v_shard) THEN
            PERFORM __S__.create_lane_shard(p_queue, p_priority, v_shard);
        END IF;
    END LOOP;
    SELECT * INTO v_lane FROM __S__.queue_lanes l WHERE l.queue = p_queue AND l.priority = p_priority AND l.shard = 0;
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

-- Could the shard hold positions past its cursor, judged from its two sequences alone (two cheap
-- reads, no index probe)? A claim that walks a segment to its end moves the cursor to the last
-- ordinal of the segment (1048575), so a drained shard is "no" here. The cursor sequence lags the
-- ledger by at most the last claim, so "yes" can be stale for one claim; "no" is always right,
-- because the true cursor is at or past the sequence.
CREATE OR REPLACE FUNCTION __S__.shard_may_have_work(p_last_segment bigint, p_cursor bigint) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_last_segment IS NOT NULL
       AND (p_last_segment > coalesce(p_cursor, 0) >> 20
            OR (p_last_segment = coalesce(p_cursor, 0) >> 20 AND coalesce(p_cursor, 0) & 1048575 <> 1048575))
$$;

-- A shard's estimated backlog from its two sequences: segments allocated past the cursor sequence's,
-- less one. A backlog of one segment counts as none: the cursor sequence lags the claims by one (it
-- is moved at the next claim's visit), so a shard whose last segment was just claimed reads as one
-- segment behind. Counted as a backlog, it sent the next enqueue to another shard, and at a steady
-- rate producers alternated between two shards: every claim then visited both, one only to catch
-- its cursor up.
CREATE OR REPLACE FUNCTION __S__.shard_backlog(p_last_segment bigint, p_cursor bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT greatest(coalesce(p_last_segment, 0) - (coalesce(p_cursor, 0) >> 20) - 1, 0)
$$;

-- ---------------------------------------------------------------------------------------------
-- Enqueue. Reserves one segment (a contiguous block of shard positions) in the caller's transaction
-- and records it in the current queue slot. The caller then writes the rows (COPY or INSERT).
--
-- Shard ownership: a transaction writes a (queue, priority) only through a shard whose producer
-- lock (an exclusive transaction-level advisory lock on the shard) it holds, taken with a try-lock
-- that never waits, and it keeps that shard for the rest of the transaction. So one shard is written
-- by one open transaction at a time, and because PostgreSQL makes a commit visible before it
-- releases the committing transaction's locks, the next writer of the shard allocates its segment
-- numbers only after every earlier writer's rows are visible (or rolled back for good). Hence, in
-- any snapshot, a shard's visible segments are a prefix of its allocated ones apart from permanent
-- gaps (rolled back, or skipped by a sequence after a crash): a claimer may step over any gap it
-- sees, and an open transaction holds back only its own shard. No pg_locks read is ever needed.
--
-- Choice of shard: the lowest-numbered free shard without a backlog (estimated from its two
-- sequences, less the one segment the cursor sequence lags), so an idle queue's producers keep
-- writing one shard (FIFO) in every backend; when every shard has a backlog or is held, the free one
-- with the least backlog (a backlog spreads over the shards, which claimers in several processes
-- work at once). Shards are read in order and the reading stops at the first fit: an idle queue's
-- enqueue reads two sequences, not two of every shard (a sequence read opens and locks a relation;
-- reading all eight shards was a third of a small enqueue's own statements).
-- All busy: create a shard, inside this transaction (its creator holds it; it is visible to claimers
-- with the creator's commit, like its jobs). At the cap: wait for a shard.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION __S__.enqueue_segment(p_queue text, p_priority smallint, p_count int,
                                      OUT ready_slot int, OUT lane_id int, OUT base_pos bigint)
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    -- the shards in shard order: lane ids and both sequences
    v_lanes int[];
    v_seqs regclass[];
    v_cursor_seqs regclass[];
    v_backlog bigint;
    -- the shard with the least backlog of those read, and that backlog
    v_least int;
    v_least_backlog bigint;
    v_last bigint;
    v_guc text;
    v_held int;
    v_lane int;
    v_seq regclass;
    v_i int;
    v_n int;
    v_seg bigint;
    v_first_lane int;
    -- a function's result that is not used: an assignment is evaluated as a simple expression,
    -- where PERFORM runs a statement through the executor
    v_ignored text;
BEGIN
    IF p_count < 1 OR p_count > 1048575 THEN
        RAISE EXCEPTION 'ringwork: a segment holds 1..1048575 jobs, got %', p_count USING ERRCODE = '22023';
    END IF;
    SELECT array_agg(l.lane_id ORDER BY l.shard), array_agg(l.segment_seq ORDER BY l.shard),
           array_agg(l.cursor_seq ORDER BY l.shard), min(l.lane_id)
    INTO v_lanes, v_seqs, v_cursor_seqs, v_first_lane
    FROM __S__.queue_lanes l WHERE l.queue = p_queue AND l.priority = p_priority;
    IF v_lanes IS NULL THEN
        PERFORM __S__.ensure_lane(p_queue, p_priority);
        SELECT array_agg(l.lane_id ORDER BY l.shard), array_agg(l.segment_seq ORDER BY l.shard),
               array_agg(l.cursor_seq ORDER BY l.shard), min(l.lane_id)
        INTO v_lanes, v_seqs, v_cursor_seqs, v_first_lane
        FROM __S__.queue_lanes l WHERE l.queue = p_queue AND l.priority = p_priority;
    END IF;
    v_n := cardinality(v_lanes);
    -- the shard this transaction already writes for this (queue, priority), keyed by its lowest lane id
    v_guc := 'rw___S__.shard_' || v_first_lane;
    v_held := nullif(current_setting(v_guc, true), '')::int;
    IF v_held IS NOT NULL AND pg_try_advisory_xact_lock(__S__.lock_ns('shard'), v_held) THEN
        v_lane := v_held;
        v_seq := v_seqs[array_position(v_lanes, v_held)];
    END IF;
    IF v_lane IS NULL THEN
        FOR v_i IN 1 .. v_n LOOP
            -- a shard never written has no cursor to read (a sequence read opens and locks a relation)
            v_last := pg_sequence_last_value(v_seqs[v_i]);
            v_backlog := CASE WHEN v_last > 0
                              THEN __S__.shard_backlog(v_last, pg_sequence_last_value(v_cursor_seqs[v_i]))
                              ELSE 0 END;
            IF v_backlog = 0 THEN
                IF pg_try_advisory_xact_lock(__S__.lock_ns('shard'), v_lanes[v_i]) THEN
                    v_lane := v_lanes[v_i];
                    v_seq := v_seqs[v_i];
                    EXIT;
                END IF;
            ELSIF v_least IS NULL OR v_backlog < v_least_backlog THEN
                v_least := v_i;
                v_least_backlog := v_backlog;
            END IF;
        END LOOP;
    END IF;
    -- Every shard has a backlog or is held: the free one with the least backlog. Usually that is the
    -- least of all, which the reading found; else the shards are read again, in backlog order.
    IF v_lane IS NULL AND v_least IS NOT NULL
       AND pg_try_advisory_xact_lock(__S__.lock_ns('shard'), v_lanes[v_least]) THEN
        v_lane := v_lanes[v_least];
        v_seq := v_seqs[v_least];
    END IF;
    IF v_lane IS NULL AND v_least IS NOT NULL THEN
        FOR v_i IN SELECT i FROM generate_series(1, v_n) i WHERE i <> v_least
                   ORDER BY __S__.shard_backlog(pg_sequence_last_value(v_seqs[i]),
                                                pg_sequence_last_value(v_cursor_seqs[i])), i LOOP
            IF pg_try_advisory_xact_lock(__S__.lock_ns('shard'), v_lanes[v_i]) THEN
                v_lane := v_lanes[v_i];
                v_seq := v_seqs[v_i];
                EXIT;
            END IF;
        END LOOP;
    END IF;
    IF v_lane IS NULL AND v_n < __S__.lane_shard_cap() THEN
        SELECT l.lane_id, l.segment_seq INTO v_lane, v_seq
        FROM __S__.create_lane_shard(p_queue, p_priority, NULL) l;
        PERFORM pg_advisory_xact_lock(__S__.lock_ns('shard'), v_lane);
    END IF;
    IF v_lane IS NULL THEN
        v_lane := v_lanes[1];
        v_seq := v_seqs[1];
        PERFORM pg_advisory_xact_lock(__S__.lock_ns('shard'), v_lane);
    END IF;
    IF v_held IS DISTINCT FROM v_lane THEN
        v_ignored := set_config(v_guc, v_lane::text, true);
    END IF;
    v_seg := nextval(v_seq);
    ready_slot := __S__.current_queue_slot();
    INSERT INTO __S__.ready_segments (ready_slot, lane_id, segment_no, job_count)
    VALUES (ready_slot, v_lane, v_seg, p_count);
    v_ignored := pg_notify('ringwork___S__', p_queue);
    lane_id := v_lane;
    base_pos := v_seg << 20;
END
$$;

-- A W3C traceparent (version 00, non-zero trace and span ids), or NULL (no trace). The Rust client
-- checks the same rule (job.rs) before anything is sent.
CREATE OR REPLACE FUNCTION __S__.valid_traceparent(p_traceparent text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_traceparent IS NULL
        OR (p_traceparent ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
            AND substr(p_traceparent, 4, 32) <> repeat('0', 32)
            AND substr(p_traceparent, 37, 16) <> repeat('0', 16))
$$;

-- What a job row stores of a valid traceparent: its 25 bytes (trace id, span id, flags), not its 55
-- characters (migration 0017). The version is always 00 and is not stored. NULL stays NULL.
CREATE OR REPLACE FUNCTION __S__.traceparent_bytes(p_traceparent text) RETURNS bytea
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT decode(substr(p_traceparent, 4, 32) || substr(p_traceparent, 37, 16) || substr(p_traceparent, 54, 2),
                  'hex')
$$;

-- The W3C text of stored traceparent bytes (claim returns it). NULL for anything but 25 bytes: a
-- process of the build before migration 0017 that writes with COPY stores the text's own bytes
-- until it is replaced, and its job then runs without a parent rather than under a made-up one.
CREATE OR REPLACE FUNCTION __S__.traceparent_text(p_bytes bytea) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN octet_length(p_bytes) = 25 THEN
               '00-' || encode(substr(p_bytes, 1, 16), 'hex') || '-' || encode(substr(p_bytes, 17, 8), 'hex')
               || '-' || encode(substr(p_bytes, 25, 1), 'hex')
           END
$$;

CREATE OR REPLACE FUNCTION __S__.enqueue_jobs(p_queue text, p_priority smallint, p_kinds text[], p_args jsonb[],
                                   p_max_attempts int[], p_timeouts_ms int[], p_traceparents text[])
RETURNS SETOF bigint
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_seg record;
    v_n int := cardinality(p_kinds);
BEGIN
    SELECT * INTO v_seg FROM __S__.enqueue_segment(p_queue, p_priority, v_n);
    RETURN QUERY
    INSERT INTO __S__.ready_entries (ready_slot, lane_id, lane_pos, job_id, queue, kind, args, priority,
                                     attempt, run_lease, max_attempts, timeout_ms, traceparent)
    SELECT v_seg.ready_slot, v_seg.lane_id, v_seg.base_pos + i - 1, nextval('__S__.job_ids'), p_queue,
           p_kinds[i], p_args[i], p_priority, 0, 0, p_max_attempts[i], p_timeouts_ms[i],
           __S__.traceparent_bytes(p_traceparents[i])
    FROM generate_series(1, v_n) i
    RETURNING job_id;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- Exact counts. Available jobs of a lane are the committed segment positions above the lane's claim
-- cursor, less tombstoned rows above it: a sum over ready_segments (one row per enqueue call, not
-- per job) and tombstones, never a scan of ready_entries. Running is the in-flight anti-join over
-- the active claim slots; scheduled/retryable and dlq count their backlog tables through an index;
-- completed/failed/cancelled are durable totals: the terminal rows the queue ring still holds plus
-- terminal_totals for the slots already pruned (queue_counts in read.sql, archive.sql).
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION __S__.lane_available(p_lane_id int) RETURNS bigint
LANGUAGE plpgsql STABLE SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_pos bigint;
    v_total bigint;
    v_spent bigint;
BEGIN
    -- a drained shard (most of them, most of the time) answers from its sequences alone
    IF NOT (SELECT __S__.shard_may_have_work(pg_sequence_last_value(l.segment_seq), pg_sequence_last_value(l.cursor_seq))
            FROM __S__.queue_lanes l WHERE l.lane_id = p_lane_id) THEN
        RETURN 0;
    END IF;
    v_pos := __S__.lane_cursor(p_lane_id);
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

-- ---------------------------------------------------------------------------------------------
-- The stable SQL API for producers in other languages (docs/lifecycle.md, "Enqueue from SQL"):
-- one job, validated like the Rust client validates it, in the caller's transaction (it exists only
-- if that commits), available at once or scheduled for p_run_at. Names and arguments are a promise:
-- a later schema keeps them working (p_traceparent was added at the end, with a default, so every
-- earlier call still binds). p_traceparent: the W3C traceparent of the producer's span, so the
-- job's execution spans are its children.
-- ---------------------------------------------------------------------------------------------

-- The schema's limits on what a job carries: its arguments' JSON text in bytes (default 1 MiB) and
-- a recorded error or cancel reason in characters (default 16,384; longer text is cut with a
-- marker, since a failing job must never be refused its failure); and archive_search, NULL (off)
-- by default. Set with set_setting.
-- PL/pgSQL for the reason clock_offset is (clock.sql): a SQL body with a subquery is planned at
-- every call; close_batch and every insert read it.
CREATE OR REPLACE FUNCTION __S__.setting(p_name text) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN coalesce((SELECT s.value FROM __S__.settings s WHERE s.name = p_name),
                    CASE p_name WHEN 'max_args_bytes' THEN 1048576 WHEN 'max_error_chars' THEN 16384 END);
END
$$;

-- A recorded error or reason no longer than the schema's max_error_chars.
-- Only IMMUTABLE operations (no format()), so the planner inlines it into close_batch's statement.
CREATE OR REPLACE FUNCTION __S__.bounded_text(p_text text, p_max bigint) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN p_text IS NULL OR length(p_text) <= p_max THEN p_text
                ELSE left(p_text, p_max::int) || ' [... ' || (length(p_text) - p_max)::text || ' more characters]' END
$$;

-- Arguments every consumer can decode: jsonb holds numbers of any size and any nesting, but a worker
-- decodes them with serde_json (numbers as 64-bit floats, at most 127 nested arrays or objects), and
-- a row it cannot decode would fail at its claim. Refused here, with the Rust client's rules
-- (job.rs, validate_args), so a producer in any language learns it at once (SQLSTATE 22023).
CREATE OR REPLACE FUNCTION __S__.validate_args(p_args jsonb) RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF p_args IS NULL THEN
        RAISE EXCEPTION 'ringwork: job arguments must not be NULL (use ''{}'')' USING ERRCODE = '22023';
    END IF;
    IF octet_length(p_args::text) > __S__.setting('max_args_bytes') THEN
        RAISE EXCEPTION 'ringwork: job arguments are % bytes of JSON, over the schema''s max_args_bytes (%)',
            octet_length(p_args::text), __S__.setting('max_args_bytes') USING ERRCODE = '22023';
    END IF;
    IF jsonb_path_exists(p_args, 'strict $.** ? (@.type() == "number"
                                   && (@ > 1.7976931348623157e308 || @ < -1.7976931348623157e308))') THEN
        RAISE EXCEPTION 'ringwork: job arguments hold a number beyond the range of a 64-bit float (about 1.8e308)'
            USING ERRCODE = '22023';
    END IF;
    IF jsonb_path_exists(p_args, 'strict $.**{127 to last} ? (@.type() == "array" || @.type() == "object")') THEN
        RAISE EXCEPTION 'ringwork: job arguments nest arrays and objects deeper than 127 levels'
            USING ERRCODE = '22023';
    END IF;
END
$$;

-- When a job may run: a finite time no later than 9999-12-31 (what every client can represent).
CREATE OR REPLACE FUNCTION __S__.validate_run_at(p_run_at timestamptz) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_run_at IS NOT NULL AND (NOT isfinite(p_run_at) OR p_run_at >= '10000-01-01 00:00:00+00') THEN
        RAISE EXCEPTION 'ringwork: run_at must be a finite time before year 10000, got %', p_run_at
            USING ERRCODE = '22023';
    END IF;
END
$$;

-- A name an operator reads must look like what it is: no control characters and no invisible
-- format characters (Unicode category Cf: bidirectional controls, zero-width spaces, U+FEFF, tags),
-- the same ranges as FORMAT_CHARACTERS in job.rs.
CREATE OR REPLACE FUNCTION __S__.valid_name(p_name text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT p_name IS NOT NULL AND octet_length(p_name) BETWEEN 1 AND 128 AND p_name !~ '[[:cntrl:]]'
       AND p_name !~ '[\U000000AD\U00000600-\U00000605\U0000061C\U000006DD\U0000070F\U00000890-\U00000891\U000008E2\U0000180E\U0000200B-\U0000200F\U0000202A-\U0000202E\U00002060-\U00002064\U00002066-\U0000206F\U0000FEFF\U0000FFF9-\U0000FFFB\U000110BD\U000110CD\U00013430-\U0001343F\U0001BCA0-\U0001BCA3\U0001D173-\U0001D17A\U000E0001\U000E0020-\U000E007F]'
$$;

-- What enqueue and enqueue_unique refuse, with the Rust client's rules (SQLSTATE 22023).
CREATE OR REPLACE FUNCTION __S__.validate_enqueue(p_queue text, p_kind text, p_args jsonb, p_priority int,
                                                  p_max_attempts int, p_traceparent text) RETURNS void
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF NOT __S__.valid_name(p_queue) THEN
        RAISE EXCEPTION 'ringwork: invalid queue name %: must be 1..128 bytes without control or invisible format characters',
            quote_nullable(p_queue) USING ERRCODE = '22023';
    END IF;
    IF NOT __S__.valid_name(p_kind) THEN
        RAISE EXCEPTION 'ringwork: invalid job kind %: must be 1..128 bytes without control or invisible format characters',
            quote_nullable(p_kind) USING ERRCODE = '22023';
    END IF;
    PERFORM __S__.validate_args(p_args);
    IF p_priority IS NULL OR p_priority NOT BETWEEN 1 AND 4 THEN
        RAISE EXCEPTION 'ringwork: priority must be 1..4, got %', p_priority USING ERRCODE = '22023';
    END IF;
    IF p_max_attempts IS NULL OR p_max_attempts NOT BETWEEN 1 AND 1000000 THEN
        RAISE EXCEPTION 'ringwork: max_attempts must be 1..1000000, got %', p_max_attempts
            USING ERRCODE = '22023';
    END IF;
    IF NOT __S__.valid_traceparent(p_traceparent) THEN
        RAISE EXCEPTION 'ringwork: invalid traceparent %: expected 00-<32 hex>-<16 hex>-<2 hex> (W3C trace context)',
            quote_nullable(p_traceparent) USING ERRCODE = '22023';
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION __S__.enqueue(p_queue text, p_kind text, p_args jsonb DEFAULT '{}',
                                         p_priority int DEFAULT 2, p_max_attempts int DEFAULT 25,
                                         p_run_at timestamptz DEFAULT NULL, p_traceparent text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint;
BEGIN
    PERFORM __S__.validate_enqueue(p_queue, p_kind, p_args, p_priority, p_max_attempts, p_traceparent);
    PERFORM __S__.validate_run_at(p_run_at);
    IF p_run_at IS NOT NULL AND p_run_at > __S__.engine_now() THEN
        SELECT j INTO v_id FROM __S__.schedule_jobs(p_queue, p_priority::smallint, ARRAY[p_kind], ARRAY[p_args],
                                                    ARRAY[p_max_attempts], ARRAY[p_run_at], ARRAY[NULL::int],
                                                    ARRAY[p_traceparent]) j;
    ELSE
        SELECT j INTO v_id FROM __S__.enqueue_jobs(p_queue, p_priority::smallint, ARRAY[p_kind], ARRAY[p_args],
                                                   ARRAY[p_max_attempts], ARRAY[NULL::int], ARRAY[p_traceparent]) j;
    END IF;
    RETURN v_id;
END
$$;

-- JSON text exactly as the Rust client writes a job's args for its unique key (serde_json, compact,
-- object keys in byte order): PostgreSQL's own jsonb text orders keys by length first. Strings,
-- integers, booleans, null, arrays and objects match; a decimal matches when written as serde_json
-- writes it (1.5, 100.0; not 1.50 or 1e2).
CREATE OR REPLACE FUNCTION __S__.canonical_json(p jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN CASE jsonb_typeof(p)
        WHEN 'object' THEN
            '{' || coalesce((SELECT string_agg(to_json(e.key)::text || ':' || __S__.canonical_json(e.value), ','
                                               ORDER BY e.key COLLATE "C")
                             FROM jsonb_each(p) e), '') || '}'
        WHEN 'array' THEN
            '[' || coalesce((SELECT string_agg(__S__.canonical_json(a.value), ',' ORDER BY a.ord)
                             FROM jsonb_array_elements(p) WITH ORDINALITY a(value, ord)), '') || ']'
        ELSE p::text
    END;
END
$$;

-- A unique job from SQL: the same key the Rust client builds for `Unique` (kind and canonical args,
-- and with p_by_queue the queue, with p_period the period bucket of now()), so a SQL producer and a
-- Rust producer deduplicate against each other. While the key's holder is in one of p_states
-- (default: available, scheduled, retryable, running) nothing is inserted: job_id is the holder's
-- and inserted is false. The bucket uses the server's clock, the Rust client its own.
CREATE OR REPLACE FUNCTION __S__.enqueue_unique(p_queue text, p_kind text, p_args jsonb DEFAULT '{}',
                                                p_by_queue boolean DEFAULT false, p_period interval DEFAULT NULL,
                                                p_states text[] DEFAULT ARRAY['available', 'scheduled',
                                                                              'retryable', 'running'],
                                                p_priority int DEFAULT 2, p_max_attempts int DEFAULT 25,
                                                p_run_at timestamptz DEFAULT NULL,
                                                p_traceparent text DEFAULT NULL,
                                                OUT job_id bigint, OUT inserted boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_secs bigint;
    v_key text;
BEGIN
    PERFORM __S__.validate_enqueue(p_queue, p_kind, p_args, p_priority, p_max_attempts, p_traceparent);
    PERFORM __S__.validate_run_at(p_run_at);
    IF p_states IS NULL OR cardinality(p_states) = 0 OR NOT p_states <@ ARRAY['available', 'scheduled', 'retryable',
            'running', 'completed', 'failed', 'cancelled', 'dead_lettered'] THEN
        RAISE EXCEPTION 'ringwork: unique states must be job states (available, scheduled, retryable, running, completed, failed, cancelled, dead_lettered), got %',
            quote_nullable(p_states::text) USING ERRCODE = '22023';
    END IF;
    v_secs := floor(extract(epoch FROM p_period))::bigint;
    IF p_period IS NOT NULL AND v_secs < 1 THEN
        RAISE EXCEPTION 'ringwork: unique period must be at least one second, got %', p_period
            USING ERRCODE = '22023';
    END IF;
    v_key := 'v1' || chr(31) || p_kind || chr(31) || __S__.canonical_json(p_args) || chr(31)
             || CASE WHEN p_by_queue THEN p_queue ELSE '' END || chr(31)
             || coalesce((greatest(floor(extract(epoch FROM now())), 0)::bigint / v_secs)::text, '');
    SELECT u.o_job_id, u.o_inserted INTO job_id, inserted
    FROM __S__.insert_unique(v_key, p_states, p_queue, p_priority::smallint, p_kind, p_args, p_max_attempts,
                             p_run_at, NULL, p_traceparent) u;
END
$$;