-- Fire a periodic schedule now, on request (`ringwork cron trigger`, Storage::trigger_schedule). A
-- row asks for one extra fire of the schedule; a process that declares the schedule takes the row
-- and inserts the schedule's job in one transaction, so a trigger fires once however many processes
-- evaluate the schedule. Triggered fires are not recorded in periodic_fires: they do not move the
-- schedule's own fire times.
--
-- FROZEN once released, like every migration: a schema change is a new file.
--
-- Backlog class: one INSERT per request, one DELETE when it fires.
CREATE TABLE __S__.periodic_triggers (
    schedule     text PRIMARY KEY,
    requested_at timestamptz NOT NULL DEFAULT now()
);
