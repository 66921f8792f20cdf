-- ringwork baseline schema: tables, sequences, indexes and views. No functions: every function
-- lives once in sql/functions/<plane>.sql and is reloaded when their combined hash changes.
--
-- FROZEN. This file is checksummed (src/schema.rs records its SHA-256 in schema_migrations and
-- `migrate` refuses a database whose recorded checksum differs). A schema change is a new,
-- forward-only migration file; never edit this one.
--
-- Placeholders substituted by src/schema.rs before execution (never user input):
--   __S__            the validated schema identifier
--   __QUEUE_SLOTS__  number of queue-ring slots (default 16)
--   __CLAIM_SLOTS__  number of claim-ring slots (default 8)
--
-- Churn classes (ARCHITECTURE §7) are declared in src/schema.rs::TABLE_CLASSES and held by a test.

-- ---------------------------------------------------------------------------------------------
-- Control plane. Rotation rewrites one slot row per rotation (never per job, never the same row
-- twice in a row); the *_ring_state rows are lock targets only and are never updated.
--
-- The slot tables are built so that those rewrites are HOT updates that page pruning reclaims on
-- its own, without vacuum: no index covers a column that changes (no index on `state`, not even a
-- partial one: "one current slot" is kept by the ring-state row lock every rotation takes), and
-- fillfactor 10 makes a page prune as soon as a few versions pile up. With a partial unique index
-- on `state`, every rotation left two dead tuples for autovacuum (336 after a 300-s soak on a
-- server with autovacuum off).
-- ---------------------------------------------------------------------------------------------
CREATE TABLE __S__.queue_ring_state (
    ring_id    smallint PRIMARY KEY CHECK (ring_id = 1),
    slot_count int NOT NULL
);
CREATE TABLE __S__.queue_ring_slots (
    slot        int PRIMARY KEY,
    generation  bigint NOT NULL,
    state       text NOT NULL CHECK (state IN ('current', 'sealed', 'free')),
    state_since timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 10);

CREATE TABLE __S__.claim_ring_state (
    ring_id    smallint PRIMARY KEY CHECK (ring_id = 1),
    slot_count int NOT NULL
);
CREATE TABLE __S__.claim_ring_slots (
    slot        int PRIMARY KEY,
    generation  bigint NOT NULL,
    state       text NOT NULL CHECK (state IN ('current', 'sealed', 'free')),
    state_since timestamptz NOT NULL DEFAULT now(),
    -- per-slot rescue cursors (receipt plane): stale (claimed_at, job_id, run_lease),
    -- row deadline (deadline_at, job_id, run_lease), batch deadline (deadline_at, batch_id)
    stale_cursor_claimed_at  timestamptz,
    stale_cursor_job_id      bigint,
    stale_cursor_run_lease   bigint,
    deadline_cursor_at       timestamptz,
    deadline_cursor_job_id   bigint,
    deadline_cursor_run_lease bigint,
    batch_deadline_cursor_at timestamptz,
    batch_deadline_cursor_batch_id bigint,
    -- stale cursors: compact batches by (claimed_at, batch_id), row-local claims by
    -- (claimed_at, job_id, run_lease); the revisit point is the oldest claim a pass stepped over
    -- because its heartbeat was fresh, and the pass wraps back to it at the end of the slot
    stale_cursor_batch_id    bigint,
    stale_revisit_at         timestamptz,
    stale_revisit_batch_id   bigint,
    stale_row_cursor_at      timestamptz,
    stale_row_revisit_at     timestamptz
) WITH (fillfactor = 10);

INSERT INTO __S__.queue_ring_state VALUES (1, __QUEUE_SLOTS__);
INSERT INTO __S__.claim_ring_state VALUES (1, __CLAIM_SLOTS__);
INSERT INTO __S__.queue_ring_slots (slot, generation, state)
    SELECT s, CASE WHEN s = 0 THEN 1 ELSE 0 END, CASE WHEN s = 0 THEN 'current' ELSE 'free' END
    FROM generate_series(0, __QUEUE_SLOTS__ - 1) s;
INSERT INTO __S__.claim_ring_slots (slot, generation, state)
    SELECT s, CASE WHEN s = 0 THEN 1 ELSE 0 END, CASE WHEN s = 0 THEN 'current' ELSE 'free' END
    FROM generate_series(0, __CLAIM_SLOTS__ - 1) s;

-- Queues and lanes. A lane is (queue, priority); its enqueue position allocator and its claim
-- cursor are sequences (non-transactional, no dead tuples). The lane row is only a registry and
-- the claim lock target (FOR UPDATE SKIP LOCKED), never updated.
CREATE TABLE __S__.queues (
    queue      text PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now(),
    -- operator switches (rare UPDATEs: pause/resume, dead-letter opt-in from QueueConfig)
    paused     boolean NOT NULL DEFAULT false,
    dlq_enabled boolean NOT NULL DEFAULT false
);
CREATE TABLE __S__.queue_lanes (
    lane_id     int PRIMARY KEY,
    queue       text NOT NULL REFERENCES __S__.queues (queue),
    priority    smallint NOT NULL CHECK (priority BETWEEN 1 AND 4),
    segment_seq regclass NOT NULL,
    cursor_seq  regclass NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (queue, priority)
);
CREATE SEQUENCE __S__.lane_ids;
CREATE SEQUENCE __S__.job_ids;
-- claim batch ids; a receipt id is batch_id * 4096 + ordinal, so a batch's receipts form one range
CREATE SEQUENCE __S__.claim_batch_ids;
CREATE SEQUENCE __S__.evidence_batch_ids;

-- ---------------------------------------------------------------------------------------------
-- Queue ring (ready_slot). INSERT/COPY only; reclaimed by TRUNCATE of a proven-dead slot.
-- Lane position = segment_no << 20 | ordinal: one segment per enqueue call and lane.
-- ---------------------------------------------------------------------------------------------
CREATE TABLE __S__.ready_segments (
    ready_slot int NOT NULL,
    lane_id    int NOT NULL,
    segment_no bigint NOT NULL,
    job_count  int NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
) PARTITION BY LIST (ready_slot);
CREATE TABLE __S__.ready_entries (
    ready_slot   int NOT NULL,
    lane_id      int NOT NULL,
    lane_pos     bigint NOT NULL,
    job_id       bigint NOT NULL,
    queue        text NOT NULL,
    kind         text NOT NULL,
    args         jsonb NOT NULL,
    priority     smallint NOT NULL,
    attempt      int NOT NULL,
    run_lease    bigint NOT NULL,
    max_attempts int NOT NULL,
    run_at       timestamptz NOT NULL DEFAULT now(),
    created_at   timestamptz NOT NULL DEFAULT now(),
    -- per-job timeout: a job whose timeout differs from its claim batch's deadline gets a
    -- row-local lease_claims row with its own deadline_at
    timeout_ms   int
) PARTITION BY LIST (ready_slot);
CREATE TABLE __S__.ready_tombstones (
    ready_slot int NOT NULL,
    job_id     bigint NOT NULL,
    run_lease  bigint NOT NULL,
    reason     text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
) PARTITION BY LIST (ready_slot);
CREATE TABLE __S__.ready_claim_attempt_batches (
    ready_slot     int NOT NULL,
    lane_id        int NOT NULL,
    lane_range     int8range NOT NULL,
    claim_slot     int NOT NULL,
    claim_batch_id bigint NOT NULL,
    attempted_at   timestamptz NOT NULL DEFAULT now()
) PARTITION BY LIST (ready_slot);
CREATE TABLE __S__.done_entries (
    ready_slot   int NOT NULL,
    job_id       bigint NOT NULL,
    run_lease    bigint NOT NULL,
    queue        text NOT NULL,
    kind         text NOT NULL,
    args         jsonb NOT NULL,
    priority     smallint NOT NULL,
    attempt      int NOT NULL,
    max_attempts int NOT NULL,
    state        text NOT NULL CHECK (state IN ('completed', 'failed', 'cancelled')),
    error        text,
    created_at   timestamptz NOT NULL,
    finalized_at timestamptz NOT NULL DEFAULT now()
) PARTITION BY LIST (ready_slot);
CREATE TABLE __S__.receipt_completion_batches (
    ready_slot      int NOT NULL,
    batch_id        bigint NOT NULL,
    job_ids         bigint[] NOT NULL,
    run_leases      bigint[] NOT NULL,
    completed_count int NOT NULL,
    finalized_at    timestamptz NOT NULL DEFAULT now(),
    -- a completion batch can span queues, so history rows are written per (ready_slot, queue):
    -- counting completions is a sum over history rows, not over jobs
    queue           text
) PARTITION BY LIST (ready_slot);

CREATE INDEX ON __S__.ready_segments (lane_id, segment_no);
CREATE INDEX ON __S__.ready_entries (lane_id, lane_pos);
CREATE INDEX ON __S__.ready_entries (job_id);
CREATE INDEX ON __S__.ready_tombstones (job_id, run_lease);
CREATE INDEX ON __S__.ready_claim_attempt_batches (lane_id, (upper(lane_range)));
CREATE INDEX ON __S__.done_entries (job_id);

-- ---------------------------------------------------------------------------------------------
-- Claim ring (claim_slot) — the seed. All four families are INSERT-only and truncated together.
-- ---------------------------------------------------------------------------------------------
CREATE TABLE __S__.lease_claim_batches (
    claim_slot     int NOT NULL,
    batch_id       bigint NOT NULL,
    queue          text NOT NULL,
    job_ids        bigint[] NOT NULL,
    run_leases     bigint[] NOT NULL,
    ready_slots    int[] NOT NULL,
    lane_ids       int[] NOT NULL,
    attempts       int[] NOT NULL,
    max_attempts   int[] NOT NULL,
    receipt_ranges int8multirange NOT NULL,
    claimed_count  int NOT NULL,
    claimed_at     timestamptz NOT NULL,
    deadline_at    timestamptz
) PARTITION BY LIST (claim_slot);
CREATE TABLE __S__.lease_claims (
    claim_slot   int NOT NULL,
    receipt_id   bigint NOT NULL,
    job_id       bigint NOT NULL,
    run_lease    bigint NOT NULL,
    queue        text NOT NULL,
    ready_slot   int NOT NULL,
    lane_id      int NOT NULL,
    attempt      int NOT NULL,
    max_attempts int NOT NULL,
    claimed_at   timestamptz NOT NULL,
    deadline_at  timestamptz
) PARTITION BY LIST (claim_slot);
CREATE TABLE __S__.lease_claim_closures (
    claim_slot int NOT NULL,
    receipt_id bigint NOT NULL,
    job_id     bigint NOT NULL,
    run_lease  bigint NOT NULL,
    outcome    text NOT NULL,
    closed_at  timestamptz NOT NULL DEFAULT now()
) PARTITION BY LIST (claim_slot);
CREATE TABLE __S__.lease_claim_closure_batches (
    claim_slot     int NOT NULL,
    batch_id       bigint NOT NULL,
    receipt_ranges int8multirange NOT NULL,
    closed_count   int NOT NULL,
    outcome        text NOT NULL,
    closed_at      timestamptz NOT NULL DEFAULT now()
) PARTITION BY LIST (claim_slot);

CREATE INDEX ON __S__.lease_claim_batches (batch_id);
CREATE INDEX ON __S__.lease_claim_batches (claimed_at, batch_id);
CREATE INDEX ON __S__.lease_claim_batches (deadline_at, batch_id) WHERE deadline_at IS NOT NULL;
CREATE INDEX ON __S__.lease_claims (receipt_id);
CREATE INDEX ON __S__.lease_claims (claimed_at, job_id, run_lease);
CREATE INDEX ON __S__.lease_claims (deadline_at, job_id, run_lease) WHERE deadline_at IS NOT NULL;

-- ---------------------------------------------------------------------------------------------
-- Execution plane (warm) and backlog (row vacuum, off the hot path).
-- ---------------------------------------------------------------------------------------------
CREATE TABLE __S__.attempt_state (
    job_id       bigint NOT NULL,
    run_lease    bigint NOT NULL,
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    progress     jsonb,
    PRIMARY KEY (job_id, run_lease)
);
CREATE TABLE __S__.deferred_jobs (
    job_id       bigint PRIMARY KEY,
    queue        text NOT NULL,
    kind         text NOT NULL,
    args         jsonb NOT NULL,
    priority     smallint NOT NULL,
    attempt      int NOT NULL,
    run_lease    bigint NOT NULL,
    max_attempts int NOT NULL,
    run_at       timestamptz NOT NULL,
    created_at   timestamptz NOT NULL,
    last_error   text,
    timeout_ms   int
);
CREATE INDEX deferred_jobs_due ON __S__.deferred_jobs (run_at, job_id);

-- Indexes for exact per-queue counts and history lookups.
CREATE INDEX ON __S__.receipt_completion_batches (queue);
CREATE INDEX ON __S__.done_entries (queue, state);
CREATE INDEX deferred_jobs_queue ON __S__.deferred_jobs (queue, attempt);

-- Dead-letter queue: operator hold table (backlog/hold class: row vacuum, off the hot path).
CREATE TABLE __S__.dlq_entries (
    job_id       bigint PRIMARY KEY,
    queue        text NOT NULL,
    kind         text NOT NULL,
    args         jsonb NOT NULL,
    priority     smallint NOT NULL,
    attempt      int NOT NULL,
    run_lease    bigint NOT NULL,
    max_attempts int NOT NULL,
    error        text,
    created_at   timestamptz NOT NULL,
    failed_at    timestamptz NOT NULL DEFAULT now(),
    timeout_ms   int
);
CREATE INDEX dlq_entries_queue_failed ON __S__.dlq_entries (queue, failed_at);
CREATE INDEX dlq_entries_failed ON __S__.dlq_entries (failed_at);

-- Unique jobs. The key table maps a unique key's SHA-256 (kind + canonical args [+ queue]
-- [+ period bucket], built by the client) to the job that last took it. Backlog class: only unique
-- inserts write it (one INSERT, or one UPDATE when a released key is taken again) and maintenance
-- expires old keys in bounded batches.
CREATE TABLE __S__.unique_keys (
    unique_key bytea PRIMARY KEY,
    job_id     bigint NOT NULL,
    queue      text NOT NULL,
    kind       text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX unique_keys_job ON __S__.unique_keys (job_id);
CREATE INDEX unique_keys_created ON __S__.unique_keys (created_at);

-- Terminal history as one relation: explicit terminal rows (failed, cancelled) and compact
-- successes expanded from their completion batches, with the job's record from its ready row
-- (same queue-ring slot, so both live and are pruned together).
CREATE VIEW __S__.terminal_jobs AS
    SELECT d.job_id, d.run_lease, d.queue, d.kind, d.args, d.priority, d.attempt, d.max_attempts,
           d.state, d.error, d.created_at, d.finalized_at
    FROM __S__.done_entries d
    UNION ALL
    SELECT c.job_id, c.run_lease, e.queue, e.kind, e.args, e.priority, e.attempt + 1, e.max_attempts,
           'completed', NULL, e.created_at, b.finalized_at
    FROM __S__.receipt_completion_batches b
    CROSS JOIN LATERAL unnest(b.job_ids, b.run_leases) AS c(job_id, run_lease)
    LEFT JOIN LATERAL (SELECT r.* FROM __S__.ready_entries r
                       WHERE r.ready_slot = b.ready_slot AND r.job_id = c.job_id AND r.run_lease = c.run_lease - 1
                       LIMIT 1) e ON true;

-- Children of every ring table, plus the per-child exclusion constraints that make "a receipt is
-- closed at most once" a database invariant (PostgreSQL 15 cannot declare them on the parent).
DO $$
DECLARE
    s int;
    t text;
BEGIN
    FOR s IN 0 .. __QUEUE_SLOTS__ - 1 LOOP
        FOREACH t IN ARRAY ARRAY['ready_segments', 'ready_entries', 'ready_tombstones',
                                 'ready_claim_attempt_batches', 'done_entries', 'receipt_completion_batches'] LOOP
            EXECUTE format('CREATE TABLE %I.%I PARTITION OF %I.%I FOR VALUES IN (%s)',
                           '__S__', t || '_' || s, '__S__', t, s);
        END LOOP;
    END LOOP;
    FOR s IN 0 .. __CLAIM_SLOTS__ - 1 LOOP
        FOREACH t IN ARRAY ARRAY['lease_claim_batches', 'lease_claims', 'lease_claim_closures',
                                 'lease_claim_closure_batches'] LOOP
            EXECUTE format('CREATE TABLE %I.%I PARTITION OF %I.%I FOR VALUES IN (%s)',
                           '__S__', t || '_' || s, '__S__', t, s);
        END LOOP;
        EXECUTE format('ALTER TABLE %I.%I ADD EXCLUDE USING gist (receipt_ranges WITH &&)',
                       '__S__', 'lease_claim_closure_batches_' || s);
        EXECUTE format('ALTER TABLE %I.%I ADD UNIQUE (receipt_id)', '__S__', 'lease_claim_closures_' || s);
    END LOOP;
END
$$;
