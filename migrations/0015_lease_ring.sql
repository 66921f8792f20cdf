-- The lease ring (issue 16): a mutable row for the few attempts that wait for the outside world
-- (a webhook, a human approval, a payment provider's callback), so that a waiting job holds no
-- worker, no open claim and no queue slot.
--
-- FROZEN once released, like every migration: a schema change is a new file.
--
-- A handler registers a callback (JobContext::register_callback): one row here, 'registered', in
-- the current lease slot, naming its attempt's claim. When the handler returns
-- JobError::WaitForCallback the attempt's claim is closed ('waiting') and the row becomes
-- 'waiting': it now carries the job (queue, kind, args, attempts) by itself, so neither the claim
-- ring nor the queue ring keeps anything of the job while it waits. A callback (complete, fail,
-- retry, resume) or its timeout ends the wait and deletes the row; a heartbeat moves its timeout.
-- A callback that arrives before the handler returned is recorded ('resolved') and applied when
-- the handler returns.
--
-- Churn: warm. Rows are updated and deleted, but only waiting attempts have one, and the ring
-- reclaims their dead versions by TRUNCATE: each rotation takes the oldest slot, moves the leases
-- still live in it to itself (one copy per live lease per ring cycle) and truncates the rest. So
-- dead tuples are bounded by what one ring cycle of waiting attempts leaves, under any MVCC horizon.
CREATE TABLE __S__.leases (
    lease_slot   int NOT NULL,
    -- 16 random bytes; the callback id given out is these bytes and their HMAC under callback_keys
    callback_id  bytea NOT NULL,
    state        text NOT NULL CHECK (state IN ('registered', 'resolved', 'waiting')),
    job_id       bigint NOT NULL,
    run_lease    bigint NOT NULL,
    -- the claim of the attempt that registered (open while 'registered')
    claim_slot   int NOT NULL,
    receipt_id   bigint NOT NULL,
    queue        text NOT NULL,
    kind         text NOT NULL,
    args         jsonb NOT NULL,
    priority     smallint NOT NULL,
    attempt      int NOT NULL,
    max_attempts int NOT NULL,
    created_at   timestamptz NOT NULL,
    timeout_ms   int,
    traceparent  text,
    registered_at timestamptz NOT NULL DEFAULT now(),
    timeout_at   timestamptz NOT NULL,
    -- a callback recorded before the handler returned ('resolved'): what to do when it does
    action       text CHECK (action IN ('complete', 'fail', 'retry', 'resume')),
    payload      jsonb,
    error        text
) PARTITION BY LIST (lease_slot);
CREATE INDEX ON __S__.leases (callback_id);
CREATE INDEX ON __S__.leases (job_id, run_lease);
CREATE INDEX ON __S__.leases (timeout_at) WHERE state = 'waiting';

-- The ring's state: the current slot is a sequence (what register_callback reads); each slot's
-- child of lease_ring_ledger holds the one row that says when the slot became current, truncated
-- with the slot. Nothing is ever updated.
CREATE SEQUENCE __S__.lease_ring_current MINVALUE 0 START 0;
CREATE TABLE __S__.lease_ring_ledger (
    lease_slot int NOT NULL,
    generation bigint NOT NULL,
    opened_at  timestamptz NOT NULL DEFAULT now()
) PARTITION BY LIST (lease_slot);

-- The key that signs callback ids (its first row; written once by the first client that needs it).
CREATE TABLE __S__.callback_keys (
    key_id     int PRIMARY KEY,
    secret     bytea NOT NULL CHECK (length(secret) >= 32),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- The payload a resumed attempt reads (JobContext::callback_payload): kept with the attempt's
-- mutable row, deleted when the attempt ends like the rest of it.
ALTER TABLE __S__.attempt_state ADD COLUMN callback jsonb;

DO $$
BEGIN
    FOR s IN 0 .. 7 LOOP
        EXECUTE format('CREATE TABLE %I.%I PARTITION OF %I.leases FOR VALUES IN (%s)',
                       '__S__', 'leases_' || s, '__S__', s);
        EXECUTE format('CREATE TABLE %I.%I PARTITION OF %I.lease_ring_ledger FOR VALUES IN (%s)',
                       '__S__', 'lease_ring_ledger_' || s, '__S__', s);
    END LOOP;
END
$$;
INSERT INTO __S__.lease_ring_ledger (lease_slot, generation) VALUES (0, 1);
SELECT setval('__S__.lease_ring_current', 0, true);
