-- Rate limits per key (issue 14 item 2): at most `key_rate_limit` claims per `key_rate_period`
-- per value of the queue's concurrency key (migration 0012's key_path), across the fleet. A key
-- may carry a rate, a running limit, or both.
--
-- The window's claims per key come from rate_limit_claims, which gains the key: a claim of such a
-- queue appends one row per key it claimed (not per job), and deletes that queue's keyed rows that
-- left the window. Queue-level rows keep key NULL. A job whose key has no room is held exactly as
-- for a running limit (deferred_jobs.held_key) and comes back when the window has room.
--
-- FROZEN once released, like every migration: a schema change is a new file.
ALTER TABLE __S__.queues
    ADD COLUMN key_rate_limit int CHECK (key_rate_limit > 0),
    ADD COLUMN key_rate_period interval CHECK (key_rate_period > interval '0'),
    ADD CONSTRAINT queues_key_rate_whole CHECK ((key_rate_limit IS NULL) = (key_rate_period IS NULL)),
    DROP CONSTRAINT queues_key_limit_whole,
    ADD CONSTRAINT queues_key_limit_whole
        CHECK ((key_path IS NULL) = (key_max_running IS NULL AND key_rate_limit IS NULL));

ALTER TABLE __S__.rate_limit_claims ADD COLUMN key text;
CREATE INDEX rate_limit_claims_key ON __S__.rate_limit_claims (queue, key, claimed_at) WHERE key IS NOT NULL;
