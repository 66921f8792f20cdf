-- Health: what an operator needs to know about the database around ringwork.
--
-- Every function of the engine is defined exactly once, in the file of its plane, and installed with
-- CREATE OR REPLACE by src/schema.rs whenever the combined hash of these files changes. A function
-- that is removed is dropped by name in dropped.sql. __S__ is the validated schema name.

-- ---------------------------------------------------------------------------------------------
-- The horizon canary. ringwork's own tables do not bloat while something pins the MVCC horizon
-- (rings are truncated, control rows are appended), so it can tell the operator who pins it for the
-- rest of the database: every session whose snapshot or transaction holds back the horizon for at
-- least p_min_age, every replication slot holding an xmin or catalog_xmin, and every prepared
-- transaction. xmin_age is in transactions (age()), held_for in time; oldest first.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION __S__.horizon_holders(p_min_age interval)
RETURNS TABLE (kind text, holder text, pid int, usename text, application text, client text,
               backend_state text, held_since timestamptz, xmin_age int, query text)
LANGUAGE sql STABLE AS $$
    SELECT h.h_kind, h.h_holder, h.h_pid, h.h_user, h.h_application, h.h_client, h.h_state, h.h_since,
           h.h_age, h.h_query
    FROM (
        SELECT 'session'::text AS h_kind, a.pid::text AS h_holder, a.pid AS h_pid, a.usename::text AS h_user,
               a.application_name AS h_application, a.client_addr::text AS h_client, a.state AS h_state,
               a.xact_start AS h_since, greatest(age(a.backend_xmin), age(a.backend_xid)) AS h_age,
               left(a.query, 200) AS h_query
        FROM pg_stat_activity a
        WHERE (a.backend_xmin IS NOT NULL OR a.backend_xid IS NOT NULL)
          AND a.pid <> pg_backend_pid()
          AND a.xact_start <= now() - p_min_age
        UNION ALL
        SELECT 'replication_slot', s.slot_name::text, s.active_pid, NULL, s.plugin::text, s.database::text,
               CASE WHEN s.active THEN 'active' ELSE 'inactive' END, NULL,
               greatest(age(s.xmin), age(s.catalog_xmin)), NULL
        FROM pg_replication_slots s
        WHERE s.xmin IS NOT NULL OR s.catalog_xmin IS NOT NULL
        UNION ALL
        SELECT 'prepared_transaction', p.gid, NULL, p.owner::text, NULL, p.database::text, 'prepared',
               p.prepared, age(p.transaction), NULL
        FROM pg_prepared_xacts p
        WHERE p.prepared <= now() - p_min_age
    ) h
    ORDER BY h.h_age DESC NULLS LAST
$$;

-- ---------------------------------------------------------------------------------------------
-- ringwork's own tables, each partitioned table summed over its partitions: live and dead tuples
-- (the statistics collector's estimates) and bytes on disk, for metrics and status. Reads
-- pg_stat_user_tables and the catalog only.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION __S__.table_health()
RETURNS TABLE (table_name text, live_tuples bigint, dead_tuples bigint, total_bytes bigint)
LANGUAGE sql STABLE AS $$
    SELECT coalesce(parent.relname, c.relname)::text,
           sum(coalesce(s.n_live_tup, 0))::bigint,
           sum(coalesce(s.n_dead_tup, 0))::bigint,
           sum(pg_total_relation_size(c.oid))::bigint
    FROM pg_class c
    JOIN pg_namespace n ON n.oid = c.relnamespace
    LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
    LEFT JOIN pg_inherits i ON i.inhrelid = c.oid
    LEFT JOIN pg_class parent ON parent.oid = i.inhparent
    WHERE n.nspname = '__S__' AND c.relkind IN ('r', 'p')
    GROUP BY 1
    ORDER BY 1
$$;

-- ---------------------------------------------------------------------------------------------
-- The backend holding the maintenance leader's session advisory lock (p_key, see
-- src/maintenance/runner.rs), or NULL when no process leads. A bigint advisory key shows in
-- pg_locks as classid = its high 32 bits, objid = its low 32 bits, objsubid = 1. For /readyz, not
-- for hot paths: pg_locks is a scan of the shared lock table.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION __S__.maintenance_leader(p_key bigint) RETURNS int
LANGUAGE sql STABLE AS $$
    SELECT l.pid FROM pg_locks l
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND l.classid::bigint = (p_key >> 32) & 4294967295 AND l.objid::bigint = p_key & 4294967295
    LIMIT 1
$$;

-- The processes working this schema, from pg_stat_activity: the session each keeps for LISTEN
-- (its application_name, set by the process: 'ringwork:<schema> pid <pid> <host>'), and the backend
-- that holds the maintenance leader's lock (p_key; named 'ringwork:<schema> leader pid ...'). Nothing is written for it: a process that stops
-- or loses its session drops out at once. A process without a LISTEN session (behind a transaction
-- pooler with no direct URL), or whose pool names its sessions itself (the name is the
-- application's and is kept), is not listed; the leader's backend is, by its lock.
CREATE OR REPLACE FUNCTION __S__.processes(p_key bigint)
RETURNS TABLE (pid int, application text, client text, connected_at timestamptz, state text,
               state_since timestamptz, leader boolean)
LANGUAGE sql STABLE AS $$
    -- the lock table read once, not once per backend
    WITH leader AS MATERIALIZED (SELECT __S__.maintenance_leader(p_key) AS pid)
    SELECT a.pid, a.application_name,
           -- another role's address is hidden without pg_read_all_stats
           CASE WHEN a.client_port = -1 THEN 'local' WHEN a.client_addr IS NULL THEN 'hidden'
                ELSE host(a.client_addr) END,
           a.backend_start, a.state, a.state_change, a.pid IS NOT DISTINCT FROM l.pid
    FROM pg_stat_activity a CROSS JOIN leader l
    WHERE a.datname = current_database()
      AND (starts_with(a.application_name, 'ringwork:__S__ ') OR a.pid IS NOT DISTINCT FROM l.pid)
    ORDER BY 7 DESC, a.application_name, a.backend_start
$$;
