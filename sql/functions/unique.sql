-- Unique jobs (unique_keys): one job per key while its holder is in one of the key's states.
--
-- Every function of the engine is defined exactly once, in the file of its plane, and installed with
-- CREATE OR REPLACE by src/schema.rs whenever the combined hash of these files changes. A function
-- that is removed is dropped by name in dropped.sql. __S__ is the validated schema name.

CREATE OR REPLACE FUNCTION __S__.unique_key_hash(p_key text) RETURNS bytea
LANGUAGE sql IMMUTABLE AS $$ SELECT sha256(convert_to(p_key, 'UTF8')) $$;

CREATE OR REPLACE FUNCTION __S__.insert_unique(p_key text, p_states text[], p_queue text, p_priority smallint,
                                    p_kind text, p_args jsonb, p_max_attempts int, p_run_at timestamptz,
                                    p_timeout_ms int, p_traceparent text,
                                    OUT o_job_id bigint, OUT o_inserted boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_hash bytea := __S__.unique_key_hash(p_key);
    v_existing bigint;
    v_state text;
BEGIN
    PERFORM pg_advisory_xact_lock(__S__.lock_ns('unique'), hashtext(p_key));
    SELECT k.job_id INTO v_existing FROM __S__.unique_keys k WHERE k.unique_key = v_hash;
    IF FOUND THEN
        SELECT s.state INTO v_state FROM __S__.job_state(v_existing) s;
        IF v_state IS NULL THEN
            -- job_state (a SQL function with its own SET, so not inlined) locks the ring tables
            -- after this statement's snapshot was taken: if it waited for a prune of the holder's
            -- slot, it found the ring rows truncated and the archive rows that prune wrote
            -- invisible (TRUNCATE is not MVCC-safe). A statement of its own now has a snapshot
            -- taken after that prune committed; a holder that is really gone reads NULL again.
            SELECT s.state INTO v_state FROM __S__.job_state(v_existing) s;
        END IF;
        IF v_state = ANY (p_states) THEN
            o_job_id := v_existing;
            o_inserted := false;
            RETURN;
        END IF;
    END IF;
    IF p_run_at IS NOT NULL AND p_run_at > __S__.engine_now() THEN
        SELECT j INTO o_job_id
        FROM __S__.schedule_jobs(p_queue, p_priority, ARRAY[p_kind], ARRAY[p_args], ARRAY[p_max_attempts],
                                 ARRAY[p_run_at], ARRAY[p_timeout_ms], ARRAY[p_traceparent]) j;
    ELSE
        SELECT j INTO o_job_id
        FROM __S__.enqueue_jobs(p_queue, p_priority, ARRAY[p_kind], ARRAY[p_args], ARRAY[p_max_attempts],
                                ARRAY[p_timeout_ms], ARRAY[p_traceparent]) j;
    END IF;
    INSERT INTO __S__.unique_keys AS k (unique_key, job_id, queue, kind)
    VALUES (v_hash, o_job_id, p_queue, p_kind)
    ON CONFLICT (unique_key) DO UPDATE
        SET job_id = EXCLUDED.job_id, queue = EXCLUDED.queue, kind = EXCLUDED.kind, created_at = now();
    o_inserted := true;
END
$$;

-- The job that last took a key, if any (cancel by unique key).
CREATE OR REPLACE FUNCTION __S__.unique_job(p_key text) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT k.job_id FROM __S__.unique_keys k WHERE k.unique_key = __S__.unique_key_hash(p_key)
$$;

-- Forget keys older than p_older whose job is no longer pending (or whose history is gone), at most
-- p_limit per call. A pending job's key is kept however old it is. The outer conditions repeat the
-- key's age and holder: if insert_unique re-takes the key while this DELETE waits for its row, the
-- row is re-checked against them (not against the subquery) and survives. PL/pgSQL with a forced
-- generic plan so that the plan (job_state inlined over every ring partition: about 6 ms to plan)
-- is made once per session, not at every maintenance tick; jit off because that plan's cost
-- estimate (every partition of every ring table) passes jit_above_cost: compiling its 800
-- expressions took 280 ms per call, for a statement that runs in well under a millisecond when
-- few keys have expired.
CREATE OR REPLACE FUNCTION __S__.unique_keys_expire(p_older interval, p_limit int) RETURNS int
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan SET jit = off AS $$
DECLARE
    v_gone int;
BEGIN
    WITH candidates AS MATERIALIZED (
        SELECT c.unique_key, c.job_id FROM __S__.unique_keys c
        WHERE c.created_at < now() - p_older
          AND coalesce((SELECT s.state FROM __S__.job_state(c.job_id) s), 'gone')
              NOT IN ('available', 'running', 'waiting', 'scheduled', 'retryable')
        ORDER BY c.created_at
        LIMIT p_limit
    ), gone AS (
        DELETE FROM __S__.unique_keys k USING candidates x
        WHERE k.unique_key = x.unique_key AND k.job_id = x.job_id AND k.created_at < now() - p_older
        RETURNING 1)
    SELECT count(*)::int INTO v_gone FROM gone;
    RETURN v_gone;
END
$$;
