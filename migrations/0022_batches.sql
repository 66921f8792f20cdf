-- Batches (sql/functions/workflows.sql): a workflow whose steps are members, sealed by adding one
-- callback step that depends on all of them. This table says which workflows are batches; a batch
-- is sealed once its callback step exists.
--
-- FROZEN once released, like every migration: a schema change is a new file.
--
-- Backlog class: one row per batch, deleted with its workflow (workflow_expire).
CREATE TABLE __S__.workflow_batches (
    workflow_id bigint PRIMARY KEY,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- member step names (member-<n>): unique within a batch however many producers add to it
CREATE SEQUENCE __S__.batch_member_ids;
