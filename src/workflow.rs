//! Workflows: jobs that run after the jobs they depend on (`sql/functions/workflows.sql`).
//!
//! A [`Workflow`] is a set of named steps, each an ordinary [`NewJob`] plus the steps it depends
//! on. It is inserted in one call, inside the caller's transaction if given one; a step waits off
//! the queue ring until every step it depends on is final, then runs as an ordinary job (its
//! priority, limits, retries, archive history and counts as any other). What a failed or cancelled
//! dependency does to a step is the step's [`DependencyFailure`] policy. A handler reads its
//! dependencies' outputs ([`crate::JobContext::workflow_output`]) and can add steps to its own
//! workflow while it runs ([`crate::JobContext::add_workflow_steps`]).
//!
//! ```no_run
//! # async fn example(client: ringwork::Client) -> ringwork::Result<()> {
//! use ringwork::{NewJob, Step, Workflow};
//! let fetch = NewJob::from_parts("fetch", serde_json::json!({"day": "2026-12-05"}))?;
//! let report = NewJob::from_parts("report", serde_json::json!({}))?;
//! let inserted = client
//!     .insert_workflow(Workflow::new().step(Step::new("fetch", fetch)).step(Step::new("report", report).after(&["fetch"])))
//!     .await?;
//! println!("workflow {}", inserted.workflow_id);
//! # Ok(()) }
//! ```

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};

use crate::error::{Error, Result};
use crate::job::{JobStatus, NewJob};

/// What a step does when a step it depends on fails for good or is cancelled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DependencyFailure {
    /// The step is cancelled, and so are the steps that depend on it with this policy (default).
    #[default]
    Cancel,
    /// The dependency counts as done: the step runs once all its dependencies are final.
    Run,
    /// The step waits until the dependency is retried (`ringwork retry`, a dead-letter retry) and
    /// completes.
    Hold,
}

impl DependencyFailure {
    /// The name the database and the command line use.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cancel => "cancel",
            Self::Run => "run",
            Self::Hold => "hold",
        }
    }

    /// The policy a database name stands for (`cancel` for anything unknown).
    pub(crate) fn parse(name: &str) -> Self {
        match name {
            "run" => Self::Run,
            "hold" => Self::Hold,
            _ => Self::Cancel,
        }
    }
}

/// One step of a workflow: a name unique within the workflow, the job it runs, and the steps it
/// waits for.
#[derive(Clone, Debug)]
pub struct Step {
    name: String,
    job: NewJob,
    depends_on: Vec<String>,
    on_dependency_failure: DependencyFailure,
}

impl Step {
    /// A step named `name` (1..=128 bytes, no control characters) that runs `job`. The job's
    /// queue, priority, attempts, timeout and traceparent apply; a step cannot be unique or have a
    /// `run_at` (it runs when its dependencies are final).
    pub fn new(name: &str, job: NewJob) -> Self {
        Self {
            name: name.to_string(),
            job,
            depends_on: Vec::new(),
            on_dependency_failure: DependencyFailure::default(),
        }
    }

    /// Run after these steps (of this workflow) are final.
    pub fn after(mut self, steps: &[&str]) -> Self {
        self.depends_on
            .extend(steps.iter().map(|step| step.to_string()));
        self
    }

    /// What a dependency that fails for good or is cancelled does to this step.
    pub fn on_dependency_failure(mut self, policy: DependencyFailure) -> Self {
        self.on_dependency_failure = policy;
        self
    }
}

/// Steps to insert: a new workflow ([`crate::Client::insert_workflow`]), or steps added to a
/// running one ([`crate::JobContext::add_workflow_steps`]).
#[derive(Clone, Debug, Default)]
pub struct Workflow {
    steps: Vec<Step>,
}

impl Workflow {
    /// No steps yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The queue of each step's job (for the enqueued count).
    pub(crate) fn queues(&self) -> impl Iterator<Item = &str> {
        self.jobs().map(|job| job.queue.as_str())
    }

    /// Each step's job.
    pub(crate) fn jobs(&self) -> impl Iterator<Item = &NewJob> {
        self.steps.iter().map(|s| &s.job)
    }

    /// How many steps it has.
    pub fn len(&self) -> usize {
        self.steps.len()
    }

    /// Whether it has no step yet.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// Add a step.
    pub fn step(mut self, step: Step) -> Self {
        self.steps.push(step);
        self
    }

    /// The steps as the SQL API takes them (`enqueue_workflow`, `workflow_add_steps`), after the
    /// checks that need no database: every job valid, names unique, no step depending on itself
    /// or (unless `adding` to a workflow that may have it) on a step not in this call, no cycle.
    pub(crate) fn to_json(&self, adding: bool) -> Result<serde_json::Value> {
        if self.steps.is_empty() {
            return Err(Error::Config("a workflow needs at least one step".into()));
        }
        let mut names = HashSet::new();
        for step in &self.steps {
            crate::job::validate_new_name("workflow step name", &step.name)?;
            if !names.insert(step.name.as_str()) {
                return Err(Error::Config(format!(
                    "workflow step {:?} appears twice",
                    step.name
                )));
            }
        }
        for step in &self.steps {
            for dep in &step.depends_on {
                if dep == &step.name {
                    return Err(Error::Config(format!(
                        "workflow step {:?} depends on itself",
                        step.name
                    )));
                }
                // a step added to a running workflow may name one it already has (checked there)
                if !adding && !names.contains(dep.as_str()) {
                    return Err(Error::Config(format!(
                        "workflow step {:?} depends on {dep:?}, which is not a step of this workflow",
                        step.name
                    )));
                }
            }
        }
        if let Some(cycle) = self.cycle() {
            return Err(Error::Config(format!(
                "workflow steps {cycle:?} depend on each other in a cycle"
            )));
        }
        let ambient = crate::trace_context::current_traceparent();
        let mut out = Vec::with_capacity(self.steps.len());
        for step in &self.steps {
            let mut depends_on = step.depends_on.clone();
            depends_on.sort();
            depends_on.dedup();
            let mut value = job_json(
                &step.job,
                &ambient,
                &format!("workflow step {:?}", step.name),
            )?;
            value["step"] = step.name.clone().into();
            value["depends_on"] = depends_on.into();
            value["on_dependency_failure"] = step.on_dependency_failure.as_str().into();
            out.push(value);
        }
        Ok(serde_json::Value::Array(out))
    }

    /// The steps of this call left when those whose dependencies (within the call) can all run
    /// first are peeled off; `None` when nothing is left.
    fn cycle(&self) -> Option<Vec<String>> {
        let names: HashSet<&str> = self.steps.iter().map(|s| s.name.as_str()).collect();
        let mut waiting: HashMap<&str, usize> = HashMap::new();
        let mut dependents: HashMap<&str, Vec<&str>> = HashMap::new();
        for step in &self.steps {
            let deps: HashSet<&str> = step
                .depends_on
                .iter()
                .map(String::as_str)
                .filter(|d| names.contains(d))
                .collect();
            waiting.insert(step.name.as_str(), deps.len());
            for dep in deps {
                dependents.entry(dep).or_default().push(step.name.as_str());
            }
        }
        let mut ready: Vec<&str> = waiting
            .iter()
            .filter(|(_, n)| **n == 0)
            .map(|(s, _)| *s)
            .collect();
        let mut peeled = 0;
        while let Some(step) = ready.pop() {
            peeled += 1;
            for dependent in dependents.get(step).into_iter().flatten() {
                if let Some(n) = waiting.get_mut(dependent) {
                    *n -= 1;
                    if *n == 0 {
                        ready.push(dependent);
                    }
                }
            }
        }
        if peeled == self.steps.len() {
            return None;
        }
        let mut left: Vec<String> = waiting
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .map(|(s, _)| s.to_string())
            .collect();
        left.sort();
        Some(left)
    }
}

/// A job as the SQL API takes a step, a batch member or a callback, after the checks that need no
/// database. `what` names it in an error.
pub(crate) fn job_json(
    job: &NewJob,
    ambient: &Option<String>,
    what: &str,
) -> Result<serde_json::Value> {
    job.validate()?;
    if job.sequence.is_some() && what != "sequence job" {
        return Err(Error::Config(format!(
            "{what}: a workflow step or batch member cannot also be in a sequence"
        )));
    }
    if job.unique.is_some() || job.run_at.is_some() {
        return Err(Error::Config(format!(
            "{what}: a workflow step or batch member cannot be unique or have a run_at (it runs when the jobs before it are final)"
        )));
    }
    Ok(serde_json::json!({
        "kind": job.kind,
        "args": job.args,
        "queue": job.queue,
        "priority": job.priority,
        "max_attempts": job.max_attempts,
        "timeout_ms": job.timeout_ms(),
        "traceparent": job.traceparent.clone().or_else(|| ambient.clone()),
    }))
}

/// A group of jobs and a callback job that is enqueued exactly once when every member is final.
/// A batch is a workflow: its members are its steps, the callback a step that depends on all of
/// them (see [`Workflow`]); `Admin::workflow(batch_id)` shows it.
///
/// With a callback, the batch is sealed when it is inserted. Without one it stays open: members
/// can be added (`Client::add_to_batch_tx`) until it is sealed (`Client::seal_batch_tx`).
#[derive(Clone, Debug, Default)]
pub struct Batch {
    members: Vec<NewJob>,
    callback: Option<(NewJob, bool)>,
}

impl Batch {
    /// No members yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The queue of each member's job and of the callback's (for the enqueued count).
    pub(crate) fn queues(&self) -> impl Iterator<Item = &str> {
        self.jobs().map(|job| job.queue.as_str())
    }

    /// Each member's job and the callback's.
    pub(crate) fn jobs(&self) -> impl Iterator<Item = &NewJob> {
        self.members
            .iter()
            .chain(self.callback.iter().map(|(job, _)| job))
    }

    /// Add a member.
    pub fn member(mut self, job: NewJob) -> Self {
        self.members.push(job);
        self
    }

    /// Seal the batch at insert with this callback, run once every member is final, whatever
    /// their outcomes; it reads them with [`crate::JobContext::workflow_counts`].
    pub fn callback(mut self, job: NewJob) -> Self {
        self.callback = Some((job, false));
        self
    }

    /// Seal the batch at insert with this callback, run only if every member completed (a member
    /// that fails for good or is cancelled cancels it).
    pub fn success_callback(mut self, job: NewJob) -> Self {
        self.callback = Some((job, true));
        self
    }

    pub(crate) fn members_json(&self) -> Result<serde_json::Value> {
        members_json(&self.members)
    }

    pub(crate) fn callback_json(&self) -> Result<(Option<serde_json::Value>, bool)> {
        match &self.callback {
            Some((job, success_only)) => Ok((
                Some(job_json(
                    job,
                    &crate::trace_context::current_traceparent(),
                    "batch callback",
                )?),
                *success_only,
            )),
            None => Ok((None, false)),
        }
    }
}

pub(crate) fn members_json(members: &[NewJob]) -> Result<serde_json::Value> {
    if members.is_empty() {
        return Err(Error::Config("a batch needs at least one member".into()));
    }
    let ambient = crate::trace_context::current_traceparent();
    members
        .iter()
        .map(|job| job_json(job, &ambient, "batch member"))
        .collect::<Result<Vec<_>>>()
        .map(serde_json::Value::Array)
}

/// What inserting a batch wrote.
#[derive(Clone, Debug)]
pub struct InsertedBatch {
    /// The batch's id (a workflow id).
    pub batch_id: i64,
    /// The members' job ids, in the order given.
    pub members: Vec<i64>,
    /// The callback's job id, when the batch was sealed at insert.
    pub callback: Option<i64>,
}

/// The other steps of a job's workflow (a batch callback's members) by their last outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkflowCounts {
    /// The workflow (batch) id.
    pub workflow_id: i64,
    /// Completed.
    pub completed: i64,
    /// Failed for good (failed or dead-lettered).
    pub failed: i64,
    /// Cancelled.
    pub cancelled: i64,
    /// Not final yet.
    pub unfinished: i64,
}

/// What inserting steps wrote: the workflow and each step's job id, in the order given.
#[derive(Clone, Debug)]
pub struct InsertedWorkflow {
    /// The workflow's id.
    pub workflow_id: i64,
    /// Each step's name and job id.
    pub steps: Vec<(String, i64)>,
}

impl InsertedWorkflow {
    /// The job id of a step.
    pub fn job_id(&self, step: &str) -> Option<i64> {
        self.steps
            .iter()
            .find(|(s, _)| s == step)
            .map(|(_, id)| *id)
    }
}

/// Where a workflow stands as a whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkflowState {
    /// Some step is not final yet.
    Running,
    /// Every step completed.
    Completed,
    /// Every step is final and at least one failed for good (failed or dead-lettered).
    Failed,
    /// Every step is final, none failed, and at least one was cancelled.
    Cancelled,
}

impl WorkflowState {
    /// `running`, `completed`, `failed` or `cancelled`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }
}

/// One step of a workflow as it stands.
#[derive(Clone, Debug)]
pub struct StepStatus {
    /// The step's name.
    pub step: String,
    /// Its job's id.
    pub job_id: i64,
    /// Its job's queue.
    pub queue: String,
    /// Its job's kind.
    pub kind: String,
    /// `Pending` while it waits for its dependencies, then its job's state.
    pub state: JobStatus,
    /// The steps it waits for.
    pub depends_on: Vec<String>,
    /// What a failed or cancelled dependency does to it.
    pub on_dependency_failure: DependencyFailure,
    /// When it reached its final state (the last time, if it was retried).
    pub finished_at: Option<DateTime<Utc>>,
}

/// A workflow's steps and its state as a whole.
#[derive(Clone, Debug)]
pub struct WorkflowStatus {
    /// The workflow's id.
    pub workflow_id: i64,
    /// Where it stands as a whole.
    pub state: WorkflowState,
    /// Whether it was cancelled (`cancel_workflow`).
    pub cancelled: bool,
    /// Every step, in the order they were added.
    pub steps: Vec<StepStatus>,
}

impl WorkflowStatus {
    pub(crate) fn from_steps(workflow_id: i64, cancelled: bool, steps: Vec<StepStatus>) -> Self {
        let is_final = |s: JobStatus| {
            matches!(
                s,
                JobStatus::Completed
                    | JobStatus::Failed
                    | JobStatus::Cancelled
                    | JobStatus::DeadLettered
            )
        };
        let state = if !steps.iter().all(|s| is_final(s.state)) {
            WorkflowState::Running
        } else if steps
            .iter()
            .any(|s| matches!(s.state, JobStatus::Failed | JobStatus::DeadLettered))
        {
            WorkflowState::Failed
        } else if steps.iter().any(|s| s.state == JobStatus::Cancelled) {
            WorkflowState::Cancelled
        } else {
            WorkflowState::Completed
        };
        Self {
            workflow_id,
            state,
            cancelled,
            steps,
        }
    }

    /// How many steps are in `state`.
    pub fn count(&self, state: JobStatus) -> usize {
        self.steps.iter().filter(|s| s.state == state).count()
    }

    /// A step by name.
    pub fn step(&self, name: &str) -> Option<&StepStatus> {
        self.steps.iter().find(|s| s.step == name)
    }
}
