-- Sequences (sql/functions/workflows.sql): jobs that share a key run one at a time, in enqueue
-- order. A key's jobs are the steps of a workflow, each depending on the one before it. A key gets
-- a new workflow when its last one has nothing left to run, so a key's rows are reclaimed a burst
-- at a time (workflow_expire) instead of growing for as long as the key is used.
--
-- FROZEN once released, like every migration: a schema change is a new file.
--
-- Backlog class: one row per (key, burst), written once and deleted with its workflow.
CREATE TABLE __S__.workflow_sequences (
    sequence_key text NOT NULL,
    workflow_id  bigint NOT NULL,
    PRIMARY KEY (sequence_key, workflow_id)
);
CREATE UNIQUE INDEX workflow_sequences_workflow ON __S__.workflow_sequences (workflow_id);

-- a workflow's newest step (a sequence's tail) by index
CREATE INDEX workflow_steps_newest ON __S__.workflow_steps (workflow_id, job_id);

-- link step names (link-<n>)
CREATE SEQUENCE __S__.sequence_link_ids;
