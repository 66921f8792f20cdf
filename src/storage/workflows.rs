//! Workflows: insert steps, read a workflow's state, cancel it, and the outputs steps record for
//! their dependents (`sql/functions/workflows.sql`). Backlog tables, off the hot path.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, Row};

use super::Storage;
use crate::error::{Error, Result};
use crate::job::JobStatus;
use crate::schema::SchemaName;
use crate::workflow::{
    Batch, InsertedBatch, InsertedWorkflow, StepStatus, Workflow, WorkflowCounts, WorkflowStatus,
};

/// This plane's statements, rendered once per schema.
#[derive(Debug)]
pub(super) struct Statements {
    enqueue_workflow: String,
    enqueue_workflows: String,
    add_steps: String,
    workflow_status: String,
    cancel_workflow: String,
    workflow_of: String,
    set_output: String,
    output: String,
    expire: String,
    enqueue_batch: String,
    batch_add: String,
    seal_batch: String,
    counts: String,
    by_state: String,
    sequence_bursts: String,
    sequence_key_of: String,
}

impl Statements {
    pub(super) fn new(s: &SchemaName) -> Self {
        Self {
            enqueue_workflow: format!(
                "SELECT workflow_id, step, job_id FROM {s}.enqueue_workflow($1)"
            ),
            enqueue_workflows: format!(
                "SELECT workflow_index, workflow_id, step, job_id FROM {s}.enqueue_workflows($1)"
            ),
            add_steps: format!("SELECT step, job_id FROM {s}.workflow_add_steps($1, $2)"),
            workflow_status: format!("SELECT * FROM {s}.workflow_status($1)"),
            cancel_workflow: format!("SELECT {s}.cancel_workflow($1)"),
            workflow_of: format!("SELECT workflow_id, step FROM {s}.workflow_of($1)"),
            sequence_bursts: format!(
                "SELECT workflow_id FROM {s}.workflow_sequences WHERE sequence_key = $1 \
                 ORDER BY workflow_id DESC LIMIT $2"
            ),
            sequence_key_of: format!(
                "SELECT sequence_key FROM {s}.workflow_sequences WHERE workflow_id = $1"
            ),
            set_output: format!("SELECT {s}.set_workflow_output($1, $2)"),
            output: format!("SELECT {s}.workflow_output($1, $2)"),
            expire: format!("SELECT {s}.workflow_expire(make_interval(secs => $1), $2)"),
            enqueue_batch: format!(
                "SELECT batch_id, job_id, callback FROM {s}.enqueue_batch($1, $2, $3)"
            ),
            batch_add: format!("SELECT {s}.batch_add($1, $2)"),
            seal_batch: format!("SELECT {s}.seal_batch($1, $2, $3)"),
            counts: format!("SELECT * FROM {s}.workflow_counts($1)"),
            by_state: format!("SELECT kind, state, n FROM {s}.workflows_by_state()"),
        }
    }
}

impl Storage {
    /// Insert a new workflow on `conn` (a pool connection or the caller's transaction).
    pub async fn insert_workflow(
        &self,
        conn: &mut PgConnection,
        workflow: &Workflow,
    ) -> Result<InsertedWorkflow> {
        let steps = workflow.to_json(false)?;
        self.ensure_lanes_from(conn, workflow.jobs()).await?;
        let rows = sqlx::query(&self.sql.workflows.enqueue_workflow)
            .bind(&steps)
            .fetch_all(self.on(conn))
            .await?;
        let mut inserted = InsertedWorkflow {
            workflow_id: 0,
            steps: Vec::with_capacity(rows.len()),
        };
        for row in rows {
            inserted.workflow_id = row.try_get("workflow_id")?;
            inserted
                .steps
                .push((row.try_get("step")?, row.try_get("job_id")?));
        }
        Ok(inserted)
    }

    /// Insert new workflows in one statement on `conn`: what each wrote, in the order given.
    pub async fn insert_workflows(
        &self,
        conn: &mut PgConnection,
        workflows: &[Workflow],
    ) -> Result<Vec<InsertedWorkflow>> {
        if workflows.is_empty() {
            return Ok(Vec::new());
        }
        let mut all = Vec::with_capacity(workflows.len());
        for (i, workflow) in workflows.iter().enumerate() {
            all.push(workflow.to_json(false).map_err(|e| match e {
                Error::Config(message) => Error::Config(format!(
                    "workflow {} of {}: {message}",
                    i + 1,
                    workflows.len()
                )),
                other => other,
            })?);
        }
        self.ensure_lanes_from(conn, workflows.iter().flat_map(Workflow::jobs))
            .await?;
        let rows = sqlx::query(&self.sql.workflows.enqueue_workflows)
            .bind(serde_json::Value::Array(all))
            .fetch_all(self.on(conn))
            .await?;
        let mut inserted: Vec<InsertedWorkflow> = workflows
            .iter()
            .map(|w| InsertedWorkflow {
                workflow_id: 0,
                steps: Vec::with_capacity(w.len()),
            })
            .collect();
        for row in rows {
            let index: i32 = row.try_get("workflow_index")?;
            let slot = usize::try_from(index)
                .ok()
                .and_then(|i| i.checked_sub(1))
                .and_then(|i| inserted.get_mut(i))
                .ok_or_else(|| {
                    Error::Config(format!("enqueue_workflows returned workflow {index}"))
                })?;
            slot.workflow_id = row.try_get("workflow_id")?;
            slot.steps
                .push((row.try_get("step")?, row.try_get("job_id")?));
        }
        Ok(inserted)
    }

    /// Add steps to a running workflow on `conn`; they may depend on its existing steps.
    pub async fn add_workflow_steps(
        &self,
        conn: &mut PgConnection,
        workflow_id: i64,
        workflow: &Workflow,
    ) -> Result<InsertedWorkflow> {
        let steps = workflow.to_json(true)?;
        self.ensure_lanes_from(conn, workflow.jobs()).await?;
        let rows: Vec<(String, i64)> = sqlx::query_as(&self.sql.workflows.add_steps)
            .bind(workflow_id)
            .bind(&steps)
            .fetch_all(self.on(conn))
            .await?;
        Ok(InsertedWorkflow {
            workflow_id,
            steps: rows,
        })
    }

    /// Every step of a workflow and where the workflow stands; `None` for an unknown workflow.
    pub async fn workflow_status(&self, workflow_id: i64) -> Result<Option<WorkflowStatus>> {
        // a released step's state is its job's: looked up after any prune in progress (read.rs)
        let mut tx = self.begin_job_lookup().await?;
        let rows = sqlx::query(&self.sql.workflows.workflow_status)
            .bind(workflow_id)
            .fetch_all(self.on(&mut tx))
            .await?;
        tx.commit().await?;
        if rows.is_empty() {
            return Ok(None);
        }
        let mut cancelled = false;
        let mut steps = Vec::with_capacity(rows.len());
        for row in rows {
            cancelled = row.try_get("cancelled")?;
            let state: String = row.try_get("state")?;
            let policy: String = row.try_get("on_dependency_failure")?;
            let finished_at: Option<DateTime<Utc>> = row.try_get("finished_at")?;
            steps.push(StepStatus {
                step: row.try_get("step")?,
                job_id: row.try_get("job_id")?,
                queue: row.try_get("queue")?,
                kind: row.try_get("kind")?,
                state: state.parse::<JobStatus>()?,
                depends_on: row.try_get("depends_on")?,
                on_dependency_failure: crate::DependencyFailure::parse(&policy),
                finished_at,
            });
        }
        Ok(Some(WorkflowStatus::from_steps(
            workflow_id,
            cancelled,
            steps,
        )))
    }

    /// Cancel a workflow: steps still waiting are cancelled, running ones are cancelled like any
    /// job, and no step is released after it. The number of steps cancelled; `None` for an
    /// unknown workflow.
    pub async fn cancel_workflow(&self, workflow_id: i64) -> Result<Option<i32>> {
        Ok(sqlx::query_scalar(&self.sql.workflows.cancel_workflow)
            .bind(workflow_id)
            .fetch_one(self.db())
            .await?)
    }

    /// The newest `limit` bursts of a sequence key (each a workflow of the key's jobs, in order),
    /// newest first. A key gets a new burst when its last one has nothing left to run.
    pub async fn sequence_bursts(&self, key: &str, limit: usize) -> Result<Vec<i64>> {
        if key.contains('\0') {
            return Err(crate::Error::Config(
                "a sequence key holds no NUL byte".into(),
            ));
        }
        Ok(sqlx::query_scalar(&self.sql.workflows.sequence_bursts)
            .bind(key)
            .bind(limit.clamp(1, 1000) as i64)
            .fetch_all(self.db())
            .await?)
    }

    /// The sequence key whose burst the workflow is; `None` for a workflow or batch of its own.
    pub async fn sequence_key_of(&self, workflow_id: i64) -> Result<Option<String>> {
        Ok(sqlx::query_scalar(&self.sql.workflows.sequence_key_of)
            .bind(workflow_id)
            .fetch_optional(self.db())
            .await?)
    }

    /// The workflow and step a job runs; `None` when it is not a workflow step.
    pub async fn workflow_of(&self, job_id: i64) -> Result<Option<(i64, String)>> {
        Ok(sqlx::query_as(&self.sql.workflows.workflow_of)
            .bind(job_id)
            .fetch_optional(self.db())
            .await?)
    }

    /// Record the output of the step `job_id` runs (the last write wins).
    pub async fn set_workflow_output(&self, job_id: i64, output: &serde_json::Value) -> Result<()> {
        let stored: bool = sqlx::query_scalar(&self.sql.workflows.set_output)
            .bind(job_id)
            .bind(output)
            .fetch_one(self.db())
            .await?;
        if !stored {
            return Err(Error::Config(format!(
                "job {job_id} is not a workflow step: it has no output to record"
            )));
        }
        Ok(())
    }

    /// The output `step` of `job_id`'s workflow recorded, if any.
    pub async fn workflow_output(
        &self,
        job_id: i64,
        step: &str,
    ) -> Result<Option<serde_json::Value>> {
        Ok(sqlx::query_scalar(&self.sql.workflows.output)
            .bind(job_id)
            .bind(step)
            .fetch_one(self.db())
            .await?)
    }

    /// Insert a batch on `conn` (sealed when it has a callback).
    pub async fn insert_batch(
        &self,
        conn: &mut PgConnection,
        batch: &Batch,
    ) -> Result<InsertedBatch> {
        let members = batch.members_json()?;
        let (callback, success_only) = batch.callback_json()?;
        self.ensure_lanes_from(conn, batch.jobs()).await?;
        let rows: Vec<(i64, i64, bool)> = sqlx::query_as(&self.sql.workflows.enqueue_batch)
            .bind(&members)
            .bind(&callback)
            .bind(success_only)
            .fetch_all(self.on(conn))
            .await?;
        let mut inserted = InsertedBatch {
            batch_id: 0,
            members: Vec::with_capacity(rows.len()),
            callback: None,
        };
        for (batch_id, job_id, is_callback) in rows {
            inserted.batch_id = batch_id;
            if is_callback {
                inserted.callback = Some(job_id);
            } else {
                inserted.members.push(job_id);
            }
        }
        Ok(inserted)
    }

    /// Add members to an open batch on `conn`; their job ids.
    pub async fn add_to_batch(
        &self,
        conn: &mut PgConnection,
        batch_id: i64,
        members: &[crate::NewJob],
    ) -> Result<Vec<i64>> {
        let members_json = crate::workflow::members_json(members)?;
        self.ensure_lanes_from(conn, members.iter()).await?;
        Ok(sqlx::query_scalar(&self.sql.workflows.batch_add)
            .bind(batch_id)
            .bind(&members_json)
            .fetch_all(self.on(conn))
            .await?)
    }

    /// Seal an open batch on `conn` with its callback (run only if every member completed, with
    /// `success_only`); the callback's job id.
    pub async fn seal_batch(
        &self,
        conn: &mut PgConnection,
        batch_id: i64,
        callback_job: &crate::NewJob,
        success_only: bool,
    ) -> Result<i64> {
        let callback = crate::workflow::job_json(
            callback_job,
            &crate::trace_context::current_traceparent(),
            "batch callback",
        )?;
        self.ensure_lanes_from(conn, std::iter::once(callback_job))
            .await?;
        Ok(sqlx::query_scalar(&self.sql.workflows.seal_batch)
            .bind(batch_id)
            .bind(&callback)
            .bind(success_only)
            .fetch_one(self.on(conn))
            .await?)
    }

    /// The other steps of `job_id`'s workflow by their last outcome; `None` when it is not a step.
    pub async fn workflow_counts(&self, job_id: i64) -> Result<Option<WorkflowCounts>> {
        let row: Option<(i64, i64, i64, i64, i64)> = sqlx::query_as(&self.sql.workflows.counts)
            .bind(job_id)
            .fetch_optional(self.db())
            .await?;
        Ok(row.map(
            |(workflow_id, completed, failed, cancelled, unfinished)| WorkflowCounts {
                workflow_id,
                completed,
                failed,
                cancelled,
                unfinished,
            },
        ))
    }

    /// Workflows kept, by kind (`workflow`, `batch`, `sequence`) and state (`running`,
    /// `completed`, `failed`, `cancelled`).
    pub async fn workflows_by_state(&self) -> Result<Vec<(String, String, i64)>> {
        Ok(sqlx::query_as(&self.sql.workflows.by_state)
            .fetch_all(self.db())
            .await?)
    }

    /// Delete at most `limit` finished workflows whose last step finished more than `keep` ago.
    pub async fn workflow_expire(&self, keep: Duration, limit: i32) -> Result<i32> {
        Ok(sqlx::query_scalar(&self.sql.workflows.expire)
            .bind(keep.as_secs_f64())
            .bind(limit)
            .fetch_one(self.db())
            .await?)
    }
}
