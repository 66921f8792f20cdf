-- Rotation of the queue ring and the claim ring: which slot is written now, and moving it on.
--
-- Plan-time partition pruning: rotate_* and prune_* address one slot by parameter and force custom
-- plans, so a call locks only the children it names. The hot-path functions (enqueue, claim,
-- complete, close) keep cached generic plans: they read the lanes across every slot anyway, so a
-- custom plan would lock the same children and cost ~5 ms of planning per call. Their child locks
-- are short; prune's lock_timeout bounds how long it can queue.
--
-- Every function of the engine is defined exactly once, in the file of its plane, and installed with
-- CREATE OR REPLACE by src/schema.rs whenever the combined hash of these files changes. A function
-- that is removed is dropped by name in dropped.sql. __S__ is the validated schema name.

-- ---------------------------------------------------------------------------------------------
-- Rotation: move the write slot to the oldest free slot. A slot pinned by live data stays sealed
-- and does not stop rotation (ARCHITECTURE §5); with no free slot, the current slot keeps growing.
--
-- The ring's state is its ledger (migration 0005): rotation appends 'sealed' to the current slot's
-- ledger child and 'opened' to the next slot's, then points the <ring>_ring_current sequence (what
-- producers and claimers read) at the new slot. Every call first repairs that sequence from the
-- ledger, because a rotation that set it and then aborted or crashed before its commit left it
-- naming a slot the ledger still calls free.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION __S__.rotate_queue_ring(p_min_age interval) RETURNS boolean
LANGUAGE plpgsql SET plan_cache_mode = force_custom_plan AS $$
DECLARE
    v_cur record;
    v_next int;
    -- a slot's age, like every time the engine decides by, is on the engine's clock (clock.sql)
    v_now timestamptz := __S__.engine_now();
BEGIN
    PERFORM 1 FROM __S__.queue_ring_state FOR UPDATE;
    SELECT * INTO v_cur FROM __S__.queue_ring_slots WHERE state = 'current';
    IF pg_sequence_last_value('__S__.queue_ring_current') IS DISTINCT FROM v_cur.slot THEN
        PERFORM setval('__S__.queue_ring_current', v_cur.slot, true);
    END IF;
    IF v_cur.state_since > v_now - p_min_age THEN
        RETURN false;
    END IF;
    -- an unused current slot gains nothing from rotation
    IF NOT EXISTS (SELECT 1 FROM __S__.ready_segments WHERE ready_slot = v_cur.slot)
       AND NOT EXISTS (SELECT 1 FROM __S__.done_entries WHERE ready_slot = v_cur.slot)
       AND NOT EXISTS (SELECT 1 FROM __S__.receipt_completion_batches WHERE ready_slot = v_cur.slot)
       AND NOT EXISTS (SELECT 1 FROM __S__.ready_claim_attempt_batches WHERE ready_slot = v_cur.slot) THEN
        RETURN false;
    END IF;
    SELECT slot INTO v_next FROM __S__.queue_ring_slots WHERE state = 'free'
    ORDER BY generation, slot LIMIT 1;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO __S__.queue_ring_ledger (ready_slot, generation, event, at) VALUES
        (v_cur.slot, v_cur.generation, 'sealed', v_now),
        (v_next, (SELECT max(generation) + 1 FROM __S__.queue_ring_ledger), 'opened', v_now);
    PERFORM setval('__S__.queue_ring_current', v_next, true);
    RETURN true;
END
$$;

CREATE OR REPLACE FUNCTION __S__.rotate_claim_ring(p_min_age interval) RETURNS boolean
LANGUAGE plpgsql SET plan_cache_mode = force_custom_plan AS $$
DECLARE
    v_cur record;
    v_next int;
    -- a slot's age, like every time the engine decides by, is on the engine's clock (clock.sql)
    v_now timestamptz := __S__.engine_now();
BEGIN
    PERFORM 1 FROM __S__.claim_ring_state FOR UPDATE;
    SELECT * INTO v_cur FROM __S__.claim_ring_slots WHERE state = 'current';
    IF pg_sequence_last_value('__S__.claim_ring_current') IS DISTINCT FROM v_cur.slot THEN
        PERFORM setval('__S__.claim_ring_current', v_cur.slot, true);
    END IF;
    IF v_cur.state_since > v_now - p_min_age THEN
        RETURN false;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM __S__.lease_claim_batches WHERE claim_slot = v_cur.slot)
       AND NOT EXISTS (SELECT 1 FROM __S__.lease_claims WHERE claim_slot = v_cur.slot) THEN
        RETURN false;
    END IF;
    SELECT slot INTO v_next FROM __S__.claim_ring_slots WHERE state = 'free'
    ORDER BY generation, slot LIMIT 1;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO __S__.claim_ring_ledger (claim_slot, generation, event, at) VALUES
        (v_cur.slot, v_cur.generation, 'sealed', v_now),
        (v_next, (SELECT max(generation) + 1 FROM __S__.claim_ring_ledger), 'opened', v_now);
    PERFORM setval('__S__.claim_ring_current', v_next, true);
    RETURN true;
END
$$;

-- How long until a rotate_* call could move a ring (the queue ring, the claim ring, the lease ring of
-- callbacks.sql): zero when one could now (or a ring's sequence needs the repair above), NULL when
-- every ring's current slot is unused (a rotation is then due only once something is written).
-- Read-only, on the engine's clock, with the same conditions as the rotations themselves, so the
-- maintenance leader looks once instead of trying three rotations at every pace (runner.rs).
CREATE OR REPLACE FUNCTION __S__.rotation_due(p_min_age interval) RETURNS interval
LANGUAGE plpgsql SET plan_cache_mode = force_custom_plan AS $$
DECLARE
    v_queue record;
    v_claim record;
    v_due interval;
    v_now timestamptz := __S__.engine_now();
BEGIN
    SELECT * INTO v_queue FROM __S__.queue_ring_slots WHERE state = 'current';
    SELECT * INTO v_claim FROM __S__.claim_ring_slots WHERE state = 'current';
    IF pg_sequence_last_value('__S__.queue_ring_current') IS DISTINCT FROM v_queue.slot
       OR pg_sequence_last_value('__S__.claim_ring_current') IS DISTINCT FROM v_claim.slot THEN
        RETURN interval '0';
    END IF;
    IF EXISTS (SELECT 1 FROM __S__.ready_segments WHERE ready_slot = v_queue.slot)
       OR EXISTS (SELECT 1 FROM __S__.done_entries WHERE ready_slot = v_queue.slot)
       OR EXISTS (SELECT 1 FROM __S__.receipt_completion_batches WHERE ready_slot = v_queue.slot)
       OR EXISTS (SELECT 1 FROM __S__.ready_claim_attempt_batches WHERE ready_slot = v_queue.slot) THEN
        v_due := v_queue.state_since + p_min_age - v_now;
    END IF;
    IF EXISTS (SELECT 1 FROM __S__.lease_claim_batches WHERE claim_slot = v_claim.slot)
       OR EXISTS (SELECT 1 FROM __S__.lease_claims WHERE claim_slot = v_claim.slot) THEN
        v_due := least(v_due, v_claim.state_since + p_min_age - v_now);
    END IF;
    v_due := least(v_due, __S__.lease_rotation_due(p_min_age, v_now));
    -- greatest() ignores a NULL: nothing written stays NULL
    RETURN CASE WHEN v_due IS NOT NULL THEN greatest(v_due, interval '0') END;
END
$$;

-- The current slot, for the hot paths: a sequence read, no table and no lock on a ring child. A
-- sequence that was never set (a database restored from a dump taken before its first setval) falls
-- back to the ledger; PL/pgSQL plans that statement only when it runs, so the hot path never locks
-- the ledger's children.
CREATE OR REPLACE FUNCTION __S__.current_queue_slot() RETURNS int
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_slot int := pg_sequence_last_value('__S__.queue_ring_current');
BEGIN
    IF v_slot IS NULL THEN
        SELECT s.slot INTO v_slot FROM __S__.queue_ring_slots s WHERE s.state = 'current';
    END IF;
    RETURN v_slot;
END
$$;
CREATE OR REPLACE FUNCTION __S__.current_claim_slot() RETURNS int
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_slot int := pg_sequence_last_value('__S__.claim_ring_current');
BEGIN
    IF v_slot IS NULL THEN
        SELECT s.slot INTO v_slot FROM __S__.claim_ring_slots s WHERE s.state = 'current';
    END IF;
    RETURN v_slot;
END
$$;
