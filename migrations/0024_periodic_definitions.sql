-- Periodic schedule definitions: what each schedule fires on, as the processes that declare it
-- in code define it, so readers (the dashboard, `ringwork cron list`) can say when it fires next
-- and list a schedule before its first fire.
--
-- FROZEN once released, like every migration: a schema change is a new file.
--
-- A process that declares schedules records them when it starts. A row is written only when it is
-- new or its definition changed (a deploy), so a fleet that restarts unchanged writes nothing:
-- warm class, one row per schedule. Exactly one of the two forms is set: a cron pattern with its
-- IANA time zone, or an interval.
CREATE TABLE __S__.periodic_definitions (
    schedule     text PRIMARY KEY,
    cron_pattern text,
    time_zone    text,
    interval_ms  bigint,
    declared_at  timestamptz NOT NULL DEFAULT now(),
    CHECK ((cron_pattern IS NOT NULL AND time_zone IS NOT NULL AND interval_ms IS NULL)
           OR (cron_pattern IS NULL AND time_zone IS NULL AND interval_ms > 0))
);
