-- Periodic jobs: what the maintenance leader reads and writes to fire schedules exactly once.
--
-- Every function of the engine is defined exactly once, in the file of its plane, and installed with
-- CREATE OR REPLACE by src/schema.rs whenever the combined hash of these files changes. A function
-- that is removed is dropped by name in dropped.sql. __S__ is the validated schema name.

-- The latest fire of a schedule, and whether it is paused.
CREATE OR REPLACE FUNCTION __S__.periodic_state(p_schedule text)
RETURNS TABLE (last_fire_at timestamptz, paused boolean)
LANGUAGE sql STABLE AS $$
    SELECT (SELECT max(f.fire_at) FROM __S__.periodic_fires f WHERE f.schedule = p_schedule),
           EXISTS (SELECT 1 FROM __S__.periodic_paused p WHERE p.schedule = p_schedule)
$$;

-- Begin a fire, in the transaction that will insert its job: false when another process is firing
-- this schedule right now (its per-schedule lock is taken, held to commit) or the fire is recorded
-- already. Every process that declares the schedule evaluates it; this is what lets one fire it
-- without inserting a job that the primary key would then refuse.
CREATE OR REPLACE FUNCTION __S__.periodic_begin_fire(p_schedule text, p_fire_at timestamptz) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pg_try_advisory_xact_lock(__S__.lock_ns('periodic'), hashtext(p_schedule)) THEN
        RETURN false;
    END IF;
    -- a statement of its own, after the lock: it sees a fire committed by the lock's last holder
    RETURN NOT EXISTS (SELECT 1 FROM __S__.periodic_fires f WHERE f.schedule = p_schedule AND f.fire_at = p_fire_at);
END
$$;

-- Record a fire in the transaction that inserted its job. False: this fire was recorded already (by
-- an overlapping leader); the caller rolls back, and its job with it. Fires of the schedule a week
-- older than this one are deleted with it, so the table stays at about a week of fires.
CREATE OR REPLACE FUNCTION __S__.periodic_record_fire(p_schedule text, p_fire_at timestamptz, p_job_id bigint)
RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO __S__.periodic_fires (schedule, fire_at, job_id) VALUES (p_schedule, p_fire_at, p_job_id)
    ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    DELETE FROM __S__.periodic_fires f
    WHERE f.schedule = p_schedule AND f.fire_at < p_fire_at - interval '7 days';
    RETURN true;
END
$$;

-- Pause or resume a schedule by name; true when that changed something.
CREATE OR REPLACE FUNCTION __S__.set_periodic_paused(p_schedule text, p_paused boolean) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF p_paused THEN
        INSERT INTO __S__.periodic_paused (schedule) VALUES (p_schedule) ON CONFLICT DO NOTHING;
    ELSE
        DELETE FROM __S__.periodic_paused WHERE schedule = p_schedule;
    END IF;
    RETURN FOUND;
END
$$;

-- Record the definitions of the schedules a process declares (migration 0024): a row is written
-- only when it is new or its definition changed, so a restart of an unchanged fleet writes nothing.
-- Returns how many rows were written.
CREATE OR REPLACE FUNCTION __S__.declare_periodic(p_schedules text[], p_patterns text[], p_zones text[],
                                                  p_intervals_ms bigint[]) RETURNS int
LANGUAGE sql AS $$
    WITH written AS (
        INSERT INTO __S__.periodic_definitions AS d (schedule, cron_pattern, time_zone, interval_ms)
        SELECT * FROM unnest(p_schedules, p_patterns, p_zones, p_intervals_ms)
        ON CONFLICT (schedule) DO UPDATE
            SET cron_pattern = excluded.cron_pattern, time_zone = excluded.time_zone,
                interval_ms = excluded.interval_ms, declared_at = now()
            WHERE (d.cron_pattern, d.time_zone, d.interval_ms)
                  IS DISTINCT FROM (excluded.cron_pattern, excluded.time_zone, excluded.interval_ms)
        RETURNING 1
    )
    SELECT count(*)::int FROM written
$$;

-- Forget a schedule's recorded definition (one that left the code reads as overdue until then).
-- Its fires stay, as history; a process that still declares it records it again when it starts.
-- False: no definition was recorded.
CREATE OR REPLACE FUNCTION __S__.forget_periodic(p_schedule text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM __S__.periodic_definitions WHERE schedule = p_schedule;
    RETURN FOUND;
END
$$;

-- Every schedule that is declared, has fired or is paused: its definition (when a process declared
-- it), its last fire, its job, and whether it is paused; with the engine's time, for its next fire.
CREATE OR REPLACE FUNCTION __S__.periodic_schedules()
RETURNS TABLE (schedule text, last_fire_at timestamptz, last_job_id bigint, fires bigint, paused boolean,
               cron_pattern text, time_zone text, interval_ms bigint, declared_at timestamptz,
               engine_now timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT s.schedule, l.fire_at, l.job_id, coalesce(c.n, 0),
           EXISTS (SELECT 1 FROM __S__.periodic_paused p WHERE p.schedule = s.schedule),
           d.cron_pattern, d.time_zone, d.interval_ms, d.declared_at, __S__.engine_now()
    FROM (SELECT f.schedule FROM __S__.periodic_fires f
          UNION SELECT p.schedule FROM __S__.periodic_paused p
          UNION SELECT d.schedule FROM __S__.periodic_definitions d) s
    LEFT JOIN __S__.periodic_definitions d ON d.schedule = s.schedule
    LEFT JOIN LATERAL (SELECT f.fire_at, f.job_id FROM __S__.periodic_fires f WHERE f.schedule = s.schedule
                       ORDER BY f.fire_at DESC LIMIT 1) l ON true
    LEFT JOIN LATERAL (SELECT count(*) AS n FROM __S__.periodic_fires f WHERE f.schedule = s.schedule) c ON true
    ORDER BY s.schedule
$$;

-- Ask for one fire of a schedule now (migration 0011). False: a trigger of it is pending already.
CREATE OR REPLACE FUNCTION __S__.request_periodic_trigger(p_schedule text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO __S__.periodic_triggers (schedule) VALUES (p_schedule) ON CONFLICT DO NOTHING;
    RETURN FOUND;
END
$$;

-- Which of these schedules have a trigger pending: one probe per evaluation pass, not per schedule.
CREATE OR REPLACE FUNCTION __S__.periodic_triggered(p_schedules text[]) RETURNS SETOF text
LANGUAGE sql STABLE AS $$
    SELECT t.schedule FROM __S__.periodic_triggers t WHERE t.schedule = ANY (p_schedules)
$$;

-- Take a schedule's pending trigger, in the transaction that inserts its job: its time, or nothing
-- when another process took it first (the row lock makes the second wait, then find it gone).
CREATE OR REPLACE FUNCTION __S__.periodic_take_trigger(p_schedule text) RETURNS timestamptz
LANGUAGE sql AS $$
    DELETE FROM __S__.periodic_triggers t WHERE t.schedule = p_schedule RETURNING t.requested_at
$$;
