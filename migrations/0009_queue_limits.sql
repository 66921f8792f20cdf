-- Fleet-wide limits per queue (issue 14): at most `max_running` attempts of the queue claimed and
-- not yet closed, across every process; at most `rate_limit` claims per `rate_period`. NULL: no
-- limit. Set by an operator (Storage::set_queue_limits, `ringwork limit`); read by every claim.
--
-- The running count comes from the claim ring (open claims are never pruned). The rate window
-- cannot: a claim slot is truncated as soon as its claims are closed, often well within a rate
-- period. So a claim of a rate-limited queue appends one row (per claim call, not per job) to
-- rate_limit_claims, and the queue's claims delete the rows that left the window. Backlog class,
-- about one row per claim call within the period, rate-limited queues only.
--
-- FROZEN once released, like every migration: a schema change is a new file.
ALTER TABLE __S__.queues
    ADD COLUMN max_running int CHECK (max_running > 0),
    ADD COLUMN rate_limit  int CHECK (rate_limit > 0),
    ADD COLUMN rate_period interval CHECK (rate_period > interval '0'),
    ADD CONSTRAINT queues_rate_limit_whole CHECK ((rate_limit IS NULL) = (rate_period IS NULL));

CREATE TABLE __S__.rate_limit_claims (
    queue      text NOT NULL,
    claimed_at timestamptz NOT NULL,
    claimed    int NOT NULL
);
CREATE INDEX ON __S__.rate_limit_claims (queue, claimed_at);
