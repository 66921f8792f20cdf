-- Periodic jobs (issue 14): one row per fire of a schedule, keyed by the schedule's name and the
-- fire time. The maintenance leader inserts a fire's job and its row in one transaction, and the
-- primary key makes a fire happen once even when a fenced leader and its successor overlap.
--
-- FROZEN once released, like every migration: a schema change is a new file.
--
-- Backlog class: INSERT per fire (at most one per schedule per period), and old fires of a schedule
-- deleted a week after, by the same transaction that records a newer one.
CREATE TABLE __S__.periodic_fires (
    schedule  text NOT NULL,
    fire_at   timestamptz NOT NULL,
    job_id    bigint NOT NULL,
    fired_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (schedule, fire_at)
);
-- A paused schedule does not fire (ringwork cron pause / resume); a row per paused schedule.
CREATE TABLE __S__.periodic_paused (
    schedule  text PRIMARY KEY,
    paused_at timestamptz NOT NULL DEFAULT now()
);
