-- Concurrency limits per key (issue 14 item 3): at most `key_max_running` attempts of a queue
-- running at once per value of the key, the text at `key_path` in the job's args (a tenant id,
-- say), across the fleet. Jobs without the key are limited by the queue's limits only.
--
-- A claim of such a queue that meets a job whose key is at its limit moves the job out of the ring
-- (its lane cursor passes over it, as over a claimed row) into deferred_jobs with `held_key` set
-- and run_at 'infinity', so promotion leaves it alone. A later claim that finds room for the key
-- brings its oldest held jobs back to the ring's tail (promote), where they wait their turn behind
-- the other keys' jobs: a hot key cannot starve the rest, and no row is rewritten per job while it
-- waits. Backlog class, like every deferred_jobs row.
--
-- FROZEN once released, like every migration: a schema change is a new file.
ALTER TABLE __S__.queues
    ADD COLUMN key_path text[],
    ADD COLUMN key_max_running int CHECK (key_max_running > 0),
    ADD CONSTRAINT queues_key_limit_whole CHECK ((key_path IS NULL) = (key_max_running IS NULL));

ALTER TABLE __S__.deferred_jobs ADD COLUMN held_key text;
CREATE INDEX deferred_jobs_held ON __S__.deferred_jobs (queue, held_key, job_id) WHERE held_key IS NOT NULL;
