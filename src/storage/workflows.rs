//! Workflows: insert steps, read a workflow's state, cancel it, and the outputs steps record for
//! their dependents (`sql/functions/workflows.sql`). Backlog tables, off the hot path.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, Row};

use super::Storage;
use crate::error::{Error, Result};
use crate::job::JobStatus;
use crate::schema::SchemaName;
use crate::workflow::{InsertedWorkflow, StepStatus, Workflow, WorkflowStatus};

/// This plane's statements, rendered once per schema.
#[derive(Debug)]
pub(super) struct Statements {
    enqueue_workflow: String,
    add_steps: String,
    workflow_status: String,
    cancel_workflow: String,
    workflow_of: String,
    set_output: String,
    output: String,
    expire: String,
}

impl Statements {
    pub(super) fn new(s: &SchemaName) -> Self {
        Self {
            enqueue_workflow: format!(
                "SELECT workflow_id, step, job_id FROM {s}.enqueue_workflow($1)"
            ),
            add_steps: format!("SELECT step, job_id FROM {s}.workflow_add_steps($1, $2)"),
            workflow_status: format!("SELECT * FROM {s}.workflow_status($1)"),
            cancel_workflow: format!("SELECT {s}.cancel_workflow($1)"),
            workflow_of: format!("SELECT workflow_id, step FROM {s}.workflow_of($1)"),
            set_output: format!("SELECT {s}.set_workflow_output($1, $2)"),
            output: format!("SELECT {s}.workflow_output($1, $2)"),
            expire: format!("SELECT {s}.workflow_expire(make_interval(secs => $1), $2)"),
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

    /// Add steps to a running workflow on `conn`; they may depend on its existing steps.
    pub async fn add_workflow_steps(
        &self,
        conn: &mut PgConnection,
        workflow_id: i64,
        workflow: &Workflow,
    ) -> Result<InsertedWorkflow> {
        let steps = workflow.to_json(true)?;
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
                on_dependency_failure: crate::workflow::parse_policy(&policy),
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

    /// Delete at most `limit` finished workflows whose last step finished more than `keep` ago.
    pub async fn workflow_expire(&self, keep: Duration, limit: i32) -> Result<i32> {
        Ok(sqlx::query_scalar(&self.sql.workflows.expire)
            .bind(keep.as_secs_f64())
            .bind(limit)
            .fetch_one(self.db())
            .await?)
    }
}
