-- Workflows: steps that wait off the ring until the steps they depend on are final
-- (sql/functions/workflows.sql). A step's job id is taken when the step is added, so the producer
-- knows it at once; the job reaches the queue ring, with that id, when the step is released.
--
-- Nothing here is a counter that completions update. A dependency is released by evidence that is
-- only ever appended: the step's result, and one arrival row per satisfied edge of each dependent,
-- numbered in arrival order; the dependent is released by the arrival whose number equals its
-- dependency count. Arrivals are written under the workflow's advisory lock, so two last
-- dependencies finishing at once in two processes number 1..n once and release once.
--
-- FROZEN once released, like every migration: a schema change is a new file.
--
-- Backlog class: INSERT while a workflow runs; a finished workflow's rows are deleted together,
-- in bounded batches, once it is older than the completed history is kept (workflow_expire).
CREATE SEQUENCE __S__.workflow_ids;

-- one row per workflow: when it was created, so a finished one can be expired
CREATE TABLE __S__.workflows (
    workflow_id bigint PRIMARY KEY,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- one row per step, written once: the job to enqueue and what it waits for
CREATE TABLE __S__.workflow_steps (
    workflow_id   bigint NOT NULL,
    step          text NOT NULL,
    job_id        bigint NOT NULL,
    queue         text NOT NULL,
    kind          text NOT NULL,
    args          jsonb NOT NULL,
    priority      smallint NOT NULL,
    max_attempts  int NOT NULL,
    timeout_ms    int,
    traceparent   bytea,
    -- what a dependency that failed for good or was cancelled does to this step: cancel it, run it
    -- anyway, or hold it until the dependency is retried and completes
    on_dependency_failure text NOT NULL CHECK (on_dependency_failure IN ('cancel', 'run', 'hold')),
    dependencies  int NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workflow_id, step)
);
CREATE UNIQUE INDEX workflow_steps_job ON __S__.workflow_steps (job_id);

-- one row per dependency edge, written with its dependent: step waits for depends_on
CREATE TABLE __S__.workflow_edges (
    workflow_id bigint NOT NULL,
    depends_on  text NOT NULL,
    step        text NOT NULL,
    PRIMARY KEY (workflow_id, depends_on, step)
);

-- a step's final outcomes (completed, failed, cancelled), one per attempt that ended it: a failed
-- step that an operator retries and that then completes has two
CREATE TABLE __S__.workflow_results (
    workflow_id bigint NOT NULL,
    step        text NOT NULL,
    run_lease   bigint NOT NULL,
    outcome     text NOT NULL CHECK (outcome IN ('completed', 'failed', 'cancelled')),
    finished_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workflow_id, step, run_lease)
);

-- the satisfied edges of a dependent, numbered 1.. in the order they arrived
CREATE TABLE __S__.workflow_arrivals (
    workflow_id bigint NOT NULL,
    step        text NOT NULL,
    seen        int NOT NULL,
    depends_on  text NOT NULL,
    PRIMARY KEY (workflow_id, step, seen),
    UNIQUE (workflow_id, step, depends_on)
);

-- the step's job went to the queue ring (once)
CREATE TABLE __S__.workflow_released (
    workflow_id bigint NOT NULL,
    step        text NOT NULL,
    released_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workflow_id, step)
);

-- the output a step's handler recorded for its dependents (the last one written wins)
CREATE TABLE __S__.workflow_outputs (
    workflow_id bigint NOT NULL,
    step        text NOT NULL,
    output      jsonb NOT NULL,
    PRIMARY KEY (workflow_id, step)
);

-- the workflow was cancelled: no step of it is released after this
CREATE TABLE __S__.workflow_cancels (
    workflow_id  bigint PRIMARY KEY,
    cancelled_at timestamptz NOT NULL DEFAULT now()
);
