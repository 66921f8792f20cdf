-- Prune of the queue ring and the claim ring: proofs that a sealed slot holds nothing live, the
-- two-phase truncate, and what an operator reads about slots and the backends in prune's way.
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
-- Prune proofs. Each returns NULL when the slot is provably dead, else the reason it is not.
-- ---------------------------------------------------------------------------------------------
-- Claim slot: every claim has exactly one closure (closures are unique per receipt by constraint,
-- so equal counts mean every claim is closed).
CREATE OR REPLACE FUNCTION __S__.claim_slot_blocker(p_slot int) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN
        coalesce((SELECT sum(claimed_count) FROM __S__.lease_claim_batches WHERE claim_slot = p_slot), 0)
        + (SELECT count(*) FROM __S__.lease_claims WHERE claim_slot = p_slot)
        > coalesce((SELECT sum(closed_count) FROM __S__.lease_claim_closure_batches WHERE claim_slot = p_slot), 0)
        + (SELECT count(*) FROM __S__.lease_claim_closures WHERE claim_slot = p_slot)
    THEN 'open_claims' END
$$;

-- The queue-ring proof must also count row-local claims still open on the slot.
-- Claim slots whose proof already shows every claim closed cannot hold an open claim on any ready
-- slot, so only the (few) blocked claim slots are expanded; the blocked set is computed once per
-- call, not once per claim member (as a SQL function's WHERE clause would do).
--
-- A blocked claim slot's open compact members are the receipts of its claim batches less those
-- of its closure batches: two aggregates over the slot, then one batch lookup (by batch_id) per
-- open receipt, and only claims in flight are open. The code before expanded every member that
-- named this ready slot and probed the closure batches for each: a GiST probe per member, seconds
-- a call once a claim slot held millions of claims (the claim ring cannot rotate while pg_dump
-- holds it), for every sealed queue slot at every tick.
CREATE OR REPLACE FUNCTION __S__.open_claims_on_ready_slot(p_ready_slot int) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_blocked int[];
    v_slot int;
    v_open int8multirange;
    v_compact bigint := 0;
    v_row bigint;
BEGIN
    -- every slot, free ones too (a late claim can land in a freed slot); not through the
    -- claim_ring_slots view, whose ledger children a claim prune may be waiting to truncate
    SELECT coalesce(array_agg(cs.slot), '{}') INTO v_blocked
    FROM generate_series(0, (SELECT r.slot_count - 1 FROM __S__.claim_ring_state r)) cs(slot)
    WHERE __S__.claim_slot_blocker(cs.slot) IS NOT NULL;
    FOREACH v_slot IN ARRAY v_blocked LOOP
        SELECT (SELECT range_agg(b.receipt_ranges) FROM __S__.lease_claim_batches b WHERE b.claim_slot = v_slot)
               - coalesce((SELECT range_agg(c.receipt_ranges) FROM __S__.lease_claim_closure_batches c
                           WHERE c.claim_slot = v_slot), '{}')
        INTO v_open;
        -- receipt = batch_id * 4096 + ordinal, and the batch's arrays are positional (ordinal + 1)
        SELECT v_compact + count(*) INTO v_compact
        FROM unnest(v_open) AS r
        CROSS JOIN LATERAL generate_series(lower(r), upper(r) - 1) AS o(receipt)
        JOIN __S__.lease_claim_batches b ON b.claim_slot = v_slot AND b.batch_id = o.receipt / 4096
        WHERE b.ready_slots[o.receipt % 4096 + 1] = p_ready_slot;
    END LOOP;
    SELECT count(*) INTO v_row FROM __S__.lease_claims l
    WHERE l.ready_slot = p_ready_slot
      AND NOT EXISTS (SELECT 1 FROM __S__.lease_claim_closures c
                      WHERE c.claim_slot = l.claim_slot AND c.receipt_id = l.receipt_id);
    RETURN v_compact + v_row;
END
$$;

-- Queue slot: no ready row at or ahead of its lane cursor (unclaimed work) and no open claim on it.
CREATE OR REPLACE FUNCTION __S__.queue_slot_blocker(p_slot int) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN EXISTS (SELECT 1 FROM __S__.slot_pending_lanes(p_slot)) THEN 'pending_ready'
        WHEN __S__.open_claims_on_ready_slot(p_slot) > 0 THEN 'open_claims'
    END
$$;

-- A slot whose only blocker is unclaimed rows can be parked (sql/functions/parking.sql) when every
-- lane with such rows is cold and no claim on the slot is open: NULL then, else the reason.
CREATE OR REPLACE FUNCTION __S__.park_blocker(p_slot int, p_park_idle interval) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN EXISTS (SELECT 1 FROM __S__.slot_pending_lanes(p_slot) p
                     WHERE NOT __S__.lane_is_cold(p.lane_id, p_park_idle)) THEN 'pending_ready'
        WHEN __S__.open_claims_on_ready_slot(p_slot) > 0 THEN 'open_claims'
    END
$$;

-- Prune order (ADR-023 "Rotation and prune"): ring state FOR UPDATE (which also stands for the
-- slot row lock since migration 0005: the slot's ledger changes only under it) ->
-- proof -> ACCESS EXCLUSIVE on the slot's children with a short lock timeout (skip when busy) ->
-- re-check not-current and re-prove under the locks -> TRUNCATE all children in one statement.
-- Before the truncate, the slot's terminal history goes to the archive (sql/functions/archive.sql):
-- completion batches younger than p_keep_completed, failed and cancelled jobs younger than
-- p_keep_failed. Nothing is carried forward into the ring. The copy is normally made just before,
-- by archive_queue_slot_ahead under ACCESS SHARE (migration 0016); under the locks prune then
-- counts the slot's rows against the mark and copies only what arrived after it.
--
-- Parking (sql/functions/parking.sql): a slot held back only by unclaimed rows of cold lanes
-- (paused, or not claimed for p_park_idle; NULL never parks) is not left to pin the ring. Under the
-- slot's locks and the lanes' row locks (NOWAIT: a claimer holding a lane is waiting for our lock)
-- their rows are copied to parked_entries, and the slot is truncated like any other.
CREATE OR REPLACE FUNCTION __S__.prune_queue_slot(p_slot int, p_lock_timeout text, p_keep_completed interval,
                                       p_keep_failed interval, p_park_idle interval) RETURNS text
LANGUAGE plpgsql SET plan_cache_mode = force_custom_plan AS $$
DECLARE
    v_state text;
    v_blocker text;
    v_generation bigint;
    v_lane record;
    v_children text;
    v_park boolean := false;
    v_segments bigint;
BEGIN
    -- the ring-state lock serialises rotation and prune of this ring, so the slot's ledger cannot
    -- change under us (it replaces the slot row lock of the tables before migration 0005)
    PERFORM 1 FROM __S__.queue_ring_state FOR UPDATE;
    SELECT state, generation INTO v_state, v_generation FROM __S__.queue_ring_slots WHERE slot = p_slot;
    IF v_state IS DISTINCT FROM 'sealed' THEN
        RETURN 'not_sealed';
    END IF;
    -- counted before the proof, so the proof saw every row of the segments counted (see below)
    SELECT count(*) INTO v_segments FROM __S__.ready_segments s WHERE s.ready_slot = p_slot;
    IF EXISTS (SELECT 1 FROM __S__.queue_slot_archive_marks m
               WHERE m.ready_slot = p_slot AND m.generation = v_generation AND m.ready_segments = v_segments) THEN
        -- proved when it was archived ahead, with as many segments as now: that proof still holds
        -- (the argument below), so a slot that readers keep busy costs a count a tick, not a proof
        v_blocker := NULL;
    ELSE
        v_blocker := __S__.queue_slot_blocker(p_slot);
    END IF;
    IF v_blocker = 'pending_ready' AND p_park_idle IS NOT NULL THEN
        v_blocker := __S__.park_blocker(p_slot, p_park_idle);
        IF v_blocker IS NOT NULL THEN
            RETURN v_blocker;
        END IF;
        v_park := true;
    ELSIF v_blocker IS NOT NULL THEN
        RETURN v_blocker;
    END IF;
    SELECT string_agg(format('%I.%I', '__S__', t || '_' || p_slot), ', ') INTO v_children
    -- the ledger and mark children first: only maintenance and operators' views read them, never
    -- the hot path, so while prune waits on a view reader it holds no lock a producer or claimer needs
    FROM unnest(ARRAY['queue_ring_ledger', 'queue_slot_archive_marks', 'ready_entries', 'ready_segments',
                      'ready_tombstones', 'ready_claim_attempt_batches', 'done_entries',
                      'receipt_completion_batches']) t;
    PERFORM set_config('lock_timeout', p_lock_timeout, true);
    BEGIN
        EXECUTE 'LOCK TABLE ' || v_children || ' IN ACCESS EXCLUSIVE MODE';
        -- the ledger rows in this slot are about to go: persist what they prove into the lane
        -- cursors first (NOWAIT: a claimer holding the lane is waiting on our lock, never wait on it)
        FOR v_lane IN SELECT DISTINCT a.lane_id FROM __S__.ready_claim_attempt_batches a WHERE a.ready_slot = p_slot LOOP
            IF NOT pg_try_advisory_xact_lock(__S__.lock_ns('lane'), v_lane.lane_id) THEN
                RAISE EXCEPTION 'lane % is held', v_lane.lane_id USING ERRCODE = 'lock_not_available';
            END IF;
            PERFORM setval(l.cursor_seq, __S__.lane_cursor(l.lane_id), true)
            FROM __S__.queue_lanes l
            WHERE l.lane_id = v_lane.lane_id
              AND __S__.lane_cursor(l.lane_id) > coalesce(pg_sequence_last_value(l.cursor_seq), 0);
        END LOOP;
        -- the lanes to park: no claim may move their cursors while their rows are copied
        IF v_park THEN
            FOR v_lane IN SELECT p.lane_id FROM __S__.slot_pending_lanes(p_slot) p ORDER BY p.lane_id LOOP
                IF NOT pg_try_advisory_xact_lock(__S__.lock_ns('lane'), v_lane.lane_id) THEN
                    RAISE EXCEPTION 'lane % is held', v_lane.lane_id USING ERRCODE = 'lock_not_available';
                END IF;
            END LOOP;
        END IF;
    EXCEPTION WHEN lock_not_available THEN
        RETURN 'busy';
    END;
    PERFORM set_config('lock_timeout', '0', true);
    SELECT state INTO v_state FROM __S__.queue_ring_slots WHERE slot = p_slot;
    IF v_state IS DISTINCT FROM 'sealed' THEN
        RETURN 'not_sealed';
    END IF;
    -- Re-prove under the locks only if the slot gained a segment since the proof. Every enqueue
    -- writes its segment row in its own transaction, with its rows; the proof saw every row of the
    -- segments counted above at or below its lane's cursor, and every claim on the slot closed.
    -- Without a new segment no row here can have become claimable since, so no claim on the slot
    -- can have opened (closes and rescue only close claims; rescue, unpark and promotion write into
    -- the current slot). The proof's open-claims half expands the batches of every claim slot still
    -- holding an open claim: 165 ms a call at 8x4 saturation, during which every claim and
    -- completion flush waited on these locks.
    IF v_park OR (SELECT count(*) FROM __S__.ready_segments s WHERE s.ready_slot = p_slot) <> v_segments THEN
        v_blocker := __S__.queue_slot_blocker(p_slot);
    ELSE
        v_blocker := NULL;
    END IF;
    IF v_blocker = 'pending_ready' AND v_park THEN
        -- re-prove under the locks (no claim can move a locked lane's cursor now)
        v_blocker := __S__.park_blocker(p_slot, p_park_idle);
        IF v_blocker IS NOT NULL THEN
            RETURN v_blocker;
        END IF;
        PERFORM __S__.park_lane_rows(p_slot, p.lane_id, p.queue, p.cursor_pos)
        FROM __S__.slot_pending_lanes(p_slot) p;
    ELSIF v_blocker IS NOT NULL THEN
        RETURN v_blocker;
    END IF;
    -- usually archived ahead (archive_queue_slot_ahead): then this only counts the slot's rows
    PERFORM __S__.archive_slot(p_slot, v_generation, p_keep_completed, p_keep_failed, NULL);
    PERFORM __S__.record_slot_totals(p_slot);
    EXECUTE 'TRUNCATE ' || v_children;
    INSERT INTO __S__.queue_ring_ledger (ready_slot, generation, event) VALUES (p_slot, v_generation, 'freed');
    RETURN 'pruned';
END
$$;

-- Prune of a claim slot: the same order as prune_queue_slot; it resets every rescue cursor of the slot.
CREATE OR REPLACE FUNCTION __S__.prune_claim_slot(p_slot int, p_lock_timeout text DEFAULT '25ms') RETURNS text
LANGUAGE plpgsql SET plan_cache_mode = force_custom_plan AS $$
DECLARE
    v_state text;
    v_generation bigint;
    v_blocker text;
    v_children text;
BEGIN
    PERFORM 1 FROM __S__.claim_ring_state FOR UPDATE;
    SELECT state, generation INTO v_state, v_generation FROM __S__.claim_ring_slots WHERE slot = p_slot;
    IF v_state IS DISTINCT FROM 'sealed' THEN
        RETURN 'not_sealed';
    END IF;
    v_blocker := __S__.claim_slot_blocker(p_slot);
    IF v_blocker IS NOT NULL THEN
        RETURN v_blocker;
    END IF;
    SELECT string_agg(format('%I.%I', '__S__', t || '_' || p_slot), ', ') INTO v_children
    -- ledger and cursor children first, as in prune_queue_slot
    FROM unnest(ARRAY['claim_ring_ledger', 'claim_rescue_cursors', 'lease_claims', 'lease_claim_batches',
                      'lease_claim_closures', 'lease_claim_closure_batches']) t;
    PERFORM set_config('lock_timeout', p_lock_timeout, true);
    BEGIN
        EXECUTE 'LOCK TABLE ' || v_children || ' IN ACCESS EXCLUSIVE MODE';
    EXCEPTION WHEN lock_not_available THEN
        RETURN 'busy';
    END;
    PERFORM set_config('lock_timeout', '0', true);
    SELECT state INTO v_state FROM __S__.claim_ring_slots WHERE slot = p_slot;
    IF v_state IS DISTINCT FROM 'sealed' THEN
        RETURN 'not_sealed';
    END IF;
    v_blocker := __S__.claim_slot_blocker(p_slot);
    IF v_blocker IS NOT NULL THEN
        RETURN v_blocker;
    END IF;
    -- the truncate takes the slot's rescue cursors with it: that is their reset
    EXECUTE 'TRUNCATE ' || v_children;
    INSERT INTO __S__.claim_ring_ledger (claim_slot, generation, event) VALUES (p_slot, v_generation, 'freed');
    RETURN 'pruned';
END
$$;

-- ---------------------------------------------------------------------------------------------
-- For operators (`ringwork ring`): every slot of both rings with its state, and for a sealed slot
-- the reason its prune proof fails now (NULL: provable, so the next tick prunes it unless a lock
-- holder makes it busy; see prune_blockers).
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION __S__.ring_slots()
RETURNS TABLE (ring text, slot int, generation bigint, state text, state_since timestamptz, blocker text)
LANGUAGE sql STABLE AS $$
    SELECT 'queue', s.slot, s.generation, s.state, s.state_since,
           CASE WHEN s.state = 'sealed' THEN __S__.queue_slot_blocker(s.slot) END
    FROM __S__.queue_ring_slots s
    UNION ALL
    SELECT 'claim', s.slot, s.generation, s.state, s.state_since,
           CASE WHEN s.state = 'sealed' THEN __S__.claim_slot_blocker(s.slot) END
    FROM __S__.claim_ring_slots s
    ORDER BY 1 DESC, 2
$$;

-- Every granted lock another backend holds on a numbered child of this schema (a ring slot's child
-- or an archive bucket), named by ring and slot: what prune_blockers and held_ring_slots read.
CREATE OR REPLACE FUNCTION __S__.ring_child_locks()
RETURNS TABLE (ring text, slot int, pid int, mode text)
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN c.relname ~ '^(ready_|done_entries_|receipt_completion_batches_|queue_ring_ledger_|queue_slot_archive_marks_)' THEN 'queue'
                WHEN c.relname ~ '^(lease_claim|claim_ring_ledger_|claim_rescue_cursors_)' THEN 'claim'
                WHEN c.relname ~ '^(leases_|lease_ring_ledger_)' THEN 'lease'
                ELSE 'archive' END,
           substring(c.relname FROM '_([0-9]+)$')::int, l.pid, l.mode
    FROM pg_locks l
    JOIN pg_class c ON c.oid = l.relation
    JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = '__S__'
    WHERE l.locktype = 'relation' AND l.granted AND l.pid <> pg_backend_pid()
      AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
      AND c.relkind = 'r' AND c.relname ~ '_[0-9]+$'
$$;

-- The backends holding a lock on a child of a sealed slot (any ring) or of an archive bucket: the
-- ones a prune or an archive expiry waits for and gives up on ('busy'). One row per relation group
-- and backend, with its application, state and how long its transaction has been open.
CREATE OR REPLACE FUNCTION __S__.prune_blockers()
RETURNS TABLE (ring text, slot int, pid int, application text, backend_state text, xact_age interval,
               lock_modes text, query text)
LANGUAGE sql STABLE AS $$
    SELECT h.ring, h.slot, h.pid, a.application_name, a.state, now() - a.xact_start,
           string_agg(DISTINCT h.mode, ', '), left(a.query, 200)
    FROM __S__.ring_child_locks() h
    JOIN pg_stat_activity a ON a.pid = h.pid
    WHERE h.ring IN ('archive', 'lease')
       OR (h.ring = 'queue' AND EXISTS (SELECT 1 FROM __S__.queue_ring_slots s WHERE s.slot = h.slot AND s.state = 'sealed'))
       OR (h.ring = 'claim' AND EXISTS (SELECT 1 FROM __S__.claim_ring_slots s WHERE s.slot = h.slot AND s.state = 'sealed'))
    GROUP BY h.ring, h.slot, h.pid, a.application_name, a.state, a.xact_start, a.query
    ORDER BY now() - a.xact_start DESC NULLS LAST, h.ring, h.slot
$$;

-- The queue and claim slots that a long holder keeps from prune: another backend holds a lock on
-- one of the slot's children and has sat idle in its transaction at least p_idle, or has had the
-- transaction open at least p_open, so it will not let go within a prune's lock timeout. The
-- maintenance tick skips these slots ('held') without running their proofs: under a reader that
-- holds every child (pg_dump, a long report) the proofs of a grown ring cost over 100 ms a slot,
-- and the leader's backend spent most of a core on proofs whose lock attempt was bound to fail.
-- The bounds are long on purpose: readers that come and go (a report every second or two) end
-- their transactions often, and a prune that tries every tick gets in between them; skipping them
-- as soon as they were 1 s old or idle cut the prunes that got through to about a third.
CREATE OR REPLACE FUNCTION __S__.held_ring_slots(p_idle interval, p_open interval)
RETURNS TABLE (ring text, slot int)
LANGUAGE sql STABLE AS $$
    SELECT DISTINCT h.ring, h.slot
    FROM __S__.ring_child_locks() h
    JOIN pg_stat_activity a ON a.pid = h.pid
    WHERE h.ring IN ('queue', 'claim')
      AND ((a.state LIKE 'idle in transaction%' AND a.state_change <= now() - p_idle)
           OR a.xact_start <= now() - p_open)
$$;
