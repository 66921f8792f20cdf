-- Advisory-lock keys shared by every plane.
--
-- Every function of the engine is defined exactly once, in the file of its plane, and installed with
-- CREATE OR REPLACE by src/schema.rs whenever the combined hash of these files changes. A function
-- that is removed is dropped by name in dropped.sql. __S__ is the validated schema name.

-- Advisory-lock namespaces, derived from the schema name so two schemas never share a key.
CREATE OR REPLACE FUNCTION __S__.lock_ns(p_kind text) RETURNS int
LANGUAGE sql IMMUTABLE AS $$ SELECT hashtext('ringwork:__S__:' || p_kind) & 2147483647 $$;

-- The per-attempt lock every writer on behalf of an attempt takes before deciding (completion,
-- close, cancel, rescue), so that exactly one of them wins (ADR-023 "Complete").
CREATE OR REPLACE FUNCTION __S__.lock_attempt(p_job_id bigint) RETURNS void
LANGUAGE sql AS $$ SELECT pg_advisory_xact_lock(__S__.lock_ns('attempt'), (p_job_id % 2147483647)::int) $$;

-- The lock of a lane shard (its queue_lanes row's lane_id), held until the transaction ends: the
-- claimers' lock (claim tries it and skips a shard another holds), which cancel, unparking and
-- prune's cursor sync take too. An advisory lock rather than the row's: a row lock writes WAL and
-- dirties the row's page each time.
CREATE OR REPLACE FUNCTION __S__.lock_lane(p_lane_id int) RETURNS void
LANGUAGE sql AS $$ SELECT pg_advisory_xact_lock(__S__.lock_ns('lane'), p_lane_id) $$;

-- Wait for a lane shard's lock (lock_lane) at most p_wait (whole milliseconds, at least one): true
-- when granted (held until the transaction ends), false when its holder kept it longer. For a claim
-- whose only candidate shard another claimer holds (claim.sql). The SET clause undoes the timeout
-- at return.
CREATE OR REPLACE FUNCTION __S__.lock_lane_within(p_lane_id int, p_wait interval) RETURNS boolean
LANGUAGE plpgsql SET lock_timeout = 0 AS $$
BEGIN
    PERFORM set_config('lock_timeout', greatest(1, ceil(extract(epoch FROM p_wait) * 1000))::bigint || 'ms', true);
    PERFORM pg_advisory_xact_lock(__S__.lock_ns('lane'), p_lane_id);
    RETURN true;
EXCEPTION WHEN lock_not_available THEN
    RETURN false;
END
$$;

-- Take ACCESS EXCLUSIVE on p_table (an already quoted name), waiting at most p_lock_timeout: true
-- when granted (held until the transaction ends), false when another session holds a conflicting
-- lock past the timeout. For maintenance truncating a time bucket, which tries again next tick
-- rather than queueing hot statements behind its request.
CREATE OR REPLACE FUNCTION __S__.lock_exclusive_within(p_table text, p_lock_timeout text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('lock_timeout', p_lock_timeout, true);
    EXECUTE 'LOCK TABLE ' || p_table || ' IN ACCESS EXCLUSIVE MODE';
    PERFORM set_config('lock_timeout', '0', true);
    RETURN true;
EXCEPTION WHEN lock_not_available THEN
    -- the failed block's setting is undone with it
    RETURN false;
END
$$;
