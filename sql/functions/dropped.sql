-- Functions that an earlier install may have created and this one no longer defines, dropped by
-- name and signature before the plane files are installed. Runs on every function reload, so each
-- statement must be IF EXISTS.
--
-- lane shards (migration 0002): claims no longer read pg_locks to step over an in-flight segment
DROP FUNCTION IF EXISTS __S__.lane_gap_resolved(int, bigint);
-- parking (migration 0003): prune_queue_slot gained p_park_idle
DROP FUNCTION IF EXISTS __S__.prune_queue_slot(int, text, interval);
-- archive (migration 0004): prune_queue_slot gained p_keep_completed, and no argument has a default
DROP FUNCTION IF EXISTS __S__.prune_queue_slot(int, text, interval, interval);
-- trace context (migration 0007): enqueue paths gained a traceparent argument, claim returns it
DROP FUNCTION IF EXISTS __S__.enqueue_jobs(text, smallint, text[], jsonb[], int[], int[]);
DROP FUNCTION IF EXISTS __S__.schedule_jobs(text, smallint, text[], jsonb[], int[], timestamptz[], int[]);
DROP FUNCTION IF EXISTS __S__.insert_unique(text, text[], text, smallint, text, jsonb, int, timestamptz, int);
DROP FUNCTION IF EXISTS __S__.enqueue(text, text, jsonb, int, int, timestamptz);
-- a changed result row cannot be replaced in place; drop claim only while it lacks its newest
-- column (traceparent, migration 0007; then more: whether a short claim left work behind)
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_proc p
               WHERE p.oid = to_regprocedure('__S__.claim(text, int, interval, interval)')
                 AND NOT ('more' = ANY (p.proargnames))) THEN
        DROP FUNCTION __S__.claim(text, int, interval, interval);
    END IF;
END
$$;
-- the six-argument claim (shard wait, empty row) first came with defaults for every argument after
-- the second, which made the four-argument claim's calls ambiguous; defaults cannot be removed in
-- place
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_proc p
               WHERE p.oid = to_regprocedure('__S__.claim(text, int, interval, interval, interval, boolean)')
                 AND p.pronargdefaults > 0) THEN
        DROP FUNCTION __S__.claim(text, int, interval, interval, interval, boolean);
    END IF;
END
$$;
-- key limits (migration 0012): set_queue_limits gained the key path and its limit
DROP FUNCTION IF EXISTS __S__.set_queue_limits(text, int, int, interval);
-- key rate limits (migration 0013): set_queue_limits gained the key's rate
DROP FUNCTION IF EXISTS __S__.set_queue_limits(text, int, int, interval, text[], int);
-- release_held's arguments were renamed (p_counts, p_max became p_room, p_default_room) when key
-- rates came; a renamed argument cannot be replaced in place
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_proc p
               WHERE p.oid = to_regprocedure('__S__.release_held(text, jsonb, int)')
                 AND 'p_counts' = ANY (p.proargnames)) THEN
        DROP FUNCTION __S__.release_held(text, jsonb, int);
    END IF;
END
$$;
-- open_claim (one attempt) gave way to open_attempts (a batch, one probe per claim batch)
DROP FUNCTION IF EXISTS __S__.open_claim(int, bigint, bigint, bigint);
-- lease ring (migration 0015): queue_counts gained the waiting column, and with migration 0025 the
-- pending one (queue_counts_page and queue_counts_of too); drop them while they lack it
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_proc p
               WHERE p.oid = to_regprocedure('__S__.queue_counts(text)')
                 AND NOT ('pending' = ANY (p.proargnames))) THEN
        DROP FUNCTION __S__.queue_counts(text);
    END IF;
    IF EXISTS (SELECT 1 FROM pg_proc p
               WHERE p.oid = to_regprocedure('__S__.queue_counts_page(text, text, int)')
                 AND NOT ('pending' = ANY (p.proargnames))) THEN
        DROP FUNCTION __S__.queue_counts_page(text, text, int);
    END IF;
    IF EXISTS (SELECT 1 FROM pg_proc p
               WHERE p.oid = to_regprocedure('__S__.queue_counts_of(text[])')
                 AND NOT ('pending' = ANY (p.proargnames))) THEN
        DROP FUNCTION __S__.queue_counts_of(text[]);
    END IF;
END
$$;
-- archive ahead (migration 0016): archive_slot gained p_generation and returns what it did
DROP FUNCTION IF EXISTS __S__.archive_slot(int, interval, interval);
-- the tick's held skip: held_ring_slots(min_age) became (idle, open)
DROP FUNCTION IF EXISTS __S__.held_ring_slots(interval);
-- proven segments (migration 0018): archive_slot gained p_ready_segments
DROP FUNCTION IF EXISTS __S__.archive_slot(int, bigint, interval, interval);
-- promote_due(int) returned its OUT parameters for one commit of main before they moved to
-- promote_due_next (a changed result cannot be replaced in place)
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_proc p
               WHERE p.oid = to_regprocedure('__S__.promote_due(int)')
                 AND 'next_due_in' = ANY (coalesce(p.proargnames, '{}'))) THEN
        DROP FUNCTION __S__.promote_due(int);
    END IF;
END
$$;
-- schedule definitions (migration 0024): periodic_schedules gained the definition and the engine's time
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_proc p
               WHERE p.oid = to_regprocedure('__S__.periodic_schedules()')
                 AND NOT ('engine_now' = ANY (p.proargnames))) THEN
        DROP FUNCTION __S__.periodic_schedules();
    END IF;
END
$$;
-- open_attempts gained the bounds of its claim slots, so its probes prune the claim ring up front
DROP FUNCTION IF EXISTS __S__.open_attempts(int[], bigint[], bigint[], bigint[]);
-- claim_lane_order takes the claim's candidate shards instead of reading the queue's lanes itself
DROP FUNCTION IF EXISTS __S__.claim_lane_order(text, timestamptz, interval);
-- claim_room reads the engine clock itself, after the queue's limit lock
DROP FUNCTION IF EXISTS __S__.claim_room(text, int, interval, int, int, interval, regclass, text[], int, int, interval);
-- record_claim_batch gave way to the claim's own batch insert and record_claim_rates
DROP FUNCTION IF EXISTS __S__.record_claim_batch(text, int, bigint, timestamptz, timestamptz, boolean, int, jsonb,
                                                 bigint[], bigint[], int[], int[], int[], int[], int8multirange);
-- sequences: appends are set-based in enqueue_in_sequence_many
DROP FUNCTION IF EXISTS __S__.sequence_append(text, jsonb, text);
-- workflow_steps_plain gained p_named (sequence jobs are checked without a step name)
DROP FUNCTION IF EXISTS __S__.workflow_steps_plain(jsonb);
-- a key's tail is found for all the call's keys at once in enqueue_in_sequence_many
DROP FUNCTION IF EXISTS __S__.sequence_tail(text);
DROP FUNCTION IF EXISTS __S__.sequence_tail(text, bigint);
