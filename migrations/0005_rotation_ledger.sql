-- Rotation ledger (issue 11): rotation, prune and rescue-cursor moves append; nothing rewrites a row.
--
-- FROZEN once released, like every migration: a schema change is a new file.
--
-- Before this migration the ring's control rows (queue_ring_slots, claim_ring_slots) were updated
-- by every rotation (two rows), every prune (one) and every rescue-cursor move. Page pruning
-- reclaims such HOT versions only once no snapshot can see them, so a transaction that pins the
-- MVCC horizon (a long report, an idle-in-transaction session, a replica's feedback) made them
-- pile up: about 2 dead tuples per rotation plus one per cursor move, without bound.
--
-- Now every control fact is an appended row that lives *inside the slot it describes*, in a child
-- partition that the slot's prune truncates with the rest of the slot:
--   <ring>_ring_ledger  (slot, generation, event): 'opened' when the slot becomes current,
--                       'sealed' when the next slot does, 'freed' right after the prune's TRUNCATE
--                       (the freed row keeps the generation, so "oldest free slot first" still
--                       holds). A slot's state is its latest event; a child holds at most three rows.
--   claim_rescue_cursors: one row per move of a claim slot's rescue cursors; the latest row is the
--                       cursor. Truncated with the slot, which is the cursor reset prune needs.
-- Both are ring-class tables: INSERT only, reclaimed by TRUNCATE, 0 dead tuples under any horizon.
--
-- The hot paths (enqueue, claim) must not read the ledger: its children are truncated by prune, and
-- a generic plan would lock every one of them. They read the current slot from a sequence instead
-- (<ring>_ring_current), which rotation sets inside its transaction, after the ledger append. A
-- sequence is not transactional: if the rotation then aborts (or the server crashes before its
-- commit), the sequence names a slot the ledger still calls free. Producers and claimers writing
-- there lose nothing (a free slot is never truncated; it is swept by rescue and becomes current
-- later), and every rotate call first puts the sequence back on the ledger's current slot.
--
-- queue_ring_slots and claim_ring_slots, the seed's names, become views over the ledger with the
-- columns they had, so operators' queries keep working.
CREATE TABLE __S__.queue_ring_ledger (
    ready_slot int NOT NULL,
    generation bigint NOT NULL,
    event      text NOT NULL CHECK (event IN ('opened', 'sealed', 'freed')),
    at         timestamptz NOT NULL DEFAULT now()
) PARTITION BY LIST (ready_slot);
CREATE TABLE __S__.claim_ring_ledger (
    claim_slot int NOT NULL,
    generation bigint NOT NULL,
    event      text NOT NULL CHECK (event IN ('opened', 'sealed', 'freed')),
    at         timestamptz NOT NULL DEFAULT now()
) PARTITION BY LIST (claim_slot);
CREATE SEQUENCE __S__.claim_rescue_cursor_moves;
CREATE TABLE __S__.claim_rescue_cursors (
    claim_slot int NOT NULL,
    move_id    bigint NOT NULL DEFAULT nextval('__S__.claim_rescue_cursor_moves'),
    moved_at   timestamptz NOT NULL DEFAULT now(),
    -- the same cursors, with the same meaning, as the claim_ring_slots columns of migration 0001
    stale_cursor_claimed_at  timestamptz,
    stale_cursor_job_id      bigint,
    stale_cursor_run_lease   bigint,
    deadline_cursor_at       timestamptz,
    deadline_cursor_job_id   bigint,
    deadline_cursor_run_lease bigint,
    batch_deadline_cursor_at timestamptz,
    batch_deadline_cursor_batch_id bigint,
    stale_cursor_batch_id    bigint,
    stale_revisit_at         timestamptz,
    stale_revisit_batch_id   bigint,
    stale_row_cursor_at      timestamptz,
    stale_row_revisit_at     timestamptz
) PARTITION BY LIST (claim_slot);
CREATE INDEX ON __S__.claim_rescue_cursors (claim_slot, move_id);

CREATE SEQUENCE __S__.queue_ring_current MINVALUE 0 START 0;
CREATE SEQUENCE __S__.claim_ring_current MINVALUE 0 START 0;

DO $$
DECLARE
    s int;
BEGIN
    FOR s IN 0 .. (SELECT slot_count FROM __S__.queue_ring_state) - 1 LOOP
        EXECUTE format('CREATE TABLE %I.%I PARTITION OF %I.%I FOR VALUES IN (%s)',
                       '__S__', 'queue_ring_ledger_' || s, '__S__', 'queue_ring_ledger', s);
    END LOOP;
    FOR s IN 0 .. (SELECT slot_count FROM __S__.claim_ring_state) - 1 LOOP
        EXECUTE format('CREATE TABLE %I.%I PARTITION OF %I.%I FOR VALUES IN (%s)',
                       '__S__', 'claim_ring_ledger_' || s, '__S__', 'claim_ring_ledger', s);
        EXECUTE format('CREATE TABLE %I.%I PARTITION OF %I.%I FOR VALUES IN (%s)',
                       '__S__', 'claim_rescue_cursors_' || s, '__S__', 'claim_rescue_cursors', s);
    END LOOP;
END
$$;

-- The ring as it stands, as events: a sealed slot's opening time is not known any more; its seal
-- time stands in for it.
INSERT INTO __S__.queue_ring_ledger (ready_slot, generation, event, at)
SELECT slot, generation, CASE WHEN state = 'free' THEN 'freed' ELSE 'opened' END, state_since
FROM __S__.queue_ring_slots
UNION ALL
SELECT slot, generation, 'sealed', state_since FROM __S__.queue_ring_slots WHERE state = 'sealed';
INSERT INTO __S__.claim_ring_ledger (claim_slot, generation, event, at)
SELECT slot, generation, CASE WHEN state = 'free' THEN 'freed' ELSE 'opened' END, state_since
FROM __S__.claim_ring_slots
UNION ALL
SELECT slot, generation, 'sealed', state_since FROM __S__.claim_ring_slots WHERE state = 'sealed';
INSERT INTO __S__.claim_rescue_cursors (claim_slot, stale_cursor_claimed_at, stale_cursor_job_id,
    stale_cursor_run_lease, deadline_cursor_at, deadline_cursor_job_id, deadline_cursor_run_lease,
    batch_deadline_cursor_at, batch_deadline_cursor_batch_id, stale_cursor_batch_id, stale_revisit_at,
    stale_revisit_batch_id, stale_row_cursor_at, stale_row_revisit_at)
SELECT slot, stale_cursor_claimed_at, stale_cursor_job_id, stale_cursor_run_lease, deadline_cursor_at,
       deadline_cursor_job_id, deadline_cursor_run_lease, batch_deadline_cursor_at,
       batch_deadline_cursor_batch_id, stale_cursor_batch_id, stale_revisit_at, stale_revisit_batch_id,
       stale_row_cursor_at, stale_row_revisit_at
FROM __S__.claim_ring_slots
WHERE state <> 'free'
  AND num_nonnulls(stale_cursor_claimed_at, deadline_cursor_at, batch_deadline_cursor_at, stale_revisit_at,
                   stale_row_cursor_at, stale_row_revisit_at) > 0;
SELECT setval('__S__.queue_ring_current', (SELECT slot FROM __S__.queue_ring_slots WHERE state = 'current'), true);
SELECT setval('__S__.claim_ring_current', (SELECT slot FROM __S__.claim_ring_slots WHERE state = 'current'), true);

DROP TABLE __S__.queue_ring_slots;
DROP TABLE __S__.claim_ring_slots;

-- A slot's state is its latest event (a later generation wins; within one, freed > sealed > opened),
-- and state_since is that event's time. Every slot of the ring is listed: one without any event
-- reads as free with generation 0. That is never the engine's own state (prune appends 'freed' in
-- the transaction of its TRUNCATE), but TRUNCATE is not MVCC-safe, so a snapshot taken before a
-- prune commits (a REPEATABLE READ report, pg_dump, and a database restored from that dump) can
-- see the slot's child empty without the 'freed' row.
--
-- Written as joins against one DISTINCT ON pass over each ledger, not as a LATERAL subquery per
-- slot: the planner takes generate_series for 1,000 rows, and 1,000 lateral scans of a partitioned
-- parent cost enough to cross jit_above_cost, so every read of the view paid ~30 ms of JIT.
CREATE VIEW __S__.queue_ring_slots AS
    SELECT g.slot, coalesce(e.generation, 0) AS generation, coalesce(e.state, 'free') AS state,
           e.state_since
    FROM generate_series(0, (SELECT r.slot_count - 1 FROM __S__.queue_ring_state r)) g(slot)
    LEFT JOIN (
        SELECT DISTINCT ON (l.ready_slot) l.ready_slot, l.generation,
               CASE l.event WHEN 'opened' THEN 'current' WHEN 'sealed' THEN 'sealed' ELSE 'free' END AS state,
               l.at AS state_since
        FROM __S__.queue_ring_ledger l
        ORDER BY l.ready_slot, l.generation DESC,
                 CASE l.event WHEN 'opened' THEN 1 WHEN 'sealed' THEN 2 ELSE 3 END DESC) e
        ON e.ready_slot = g.slot;
CREATE VIEW __S__.claim_ring_slots AS
    SELECT g.slot, coalesce(e.generation, 0) AS generation, coalesce(e.state, 'free') AS state,
           e.state_since,
           c.stale_cursor_claimed_at, c.stale_cursor_job_id, c.stale_cursor_run_lease,
           c.deadline_cursor_at, c.deadline_cursor_job_id, c.deadline_cursor_run_lease,
           c.batch_deadline_cursor_at, c.batch_deadline_cursor_batch_id, c.stale_cursor_batch_id,
           c.stale_revisit_at, c.stale_revisit_batch_id, c.stale_row_cursor_at, c.stale_row_revisit_at
    FROM generate_series(0, (SELECT r.slot_count - 1 FROM __S__.claim_ring_state r)) g(slot)
    LEFT JOIN (
        SELECT DISTINCT ON (l.claim_slot) l.claim_slot, l.generation,
               CASE l.event WHEN 'opened' THEN 'current' WHEN 'sealed' THEN 'sealed' ELSE 'free' END AS state,
               l.at AS state_since
        FROM __S__.claim_ring_ledger l
        ORDER BY l.claim_slot, l.generation DESC,
                 CASE l.event WHEN 'opened' THEN 1 WHEN 'sealed' THEN 2 ELSE 3 END DESC) e
        ON e.claim_slot = g.slot
    LEFT JOIN (
        SELECT DISTINCT ON (r.claim_slot) r.*
        FROM __S__.claim_rescue_cursors r
        ORDER BY r.claim_slot, r.move_id DESC) c
        ON c.claim_slot = g.slot;
