-- Pending jobs in the exact counts: a queue's workflow steps, batch callbacks and sequence jobs that
-- wait for the jobs before them (workflow_steps rows not yet released or ended). Counting them per
-- queue needs the steps by queue: one index entry per step, written with the step and deleted with
-- its workflow (workflow_expire), like the table's other indexes.
--
-- FROZEN once released, like every migration: a schema change is a new file.
CREATE INDEX workflow_steps_queue ON __S__.workflow_steps (queue);
