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
