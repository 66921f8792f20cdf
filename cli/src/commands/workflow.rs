//! `ringwork workflow`: a workflow's steps and state, and cancelling it.

use super::{CliError, Result};

#[derive(clap::Subcommand)]
pub enum Action {
    /// Every step of a workflow: its job, its state and the steps it waits for; then the
    /// workflow's state and its steps per state.
    Show {
        /// The workflow's id (`InsertedWorkflow::workflow_id`, `enqueue_workflow`).
        workflow_id: i64,
        /// The workflow as one JSON object, for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Cancel a workflow: waiting steps are cancelled, running ones are cancelled like
    /// `ringwork cancel`, and no step is released after it.
    Cancel {
        /// The workflow's id.
        workflow_id: i64,
    },
}

pub async fn run(args: super::Group<Action>) -> Result<()> {
    let admin = args.db.open().await?;
    match args.action {
        Action::Show { workflow_id, json } => {
            let Some(status) = admin.workflow(workflow_id).await? else {
                return Err(not_found(workflow_id));
            };
            if json {
                let steps: Vec<serde_json::Value> = status
                    .steps
                    .iter()
                    .map(|s| {
                        serde_json::json!({
                            "step": s.step,
                            "job_id": s.job_id,
                            "queue": s.queue,
                            "kind": s.kind,
                            "state": s.state.as_str(),
                            "depends_on": s.depends_on,
                            "on_dependency_failure": s.on_dependency_failure.as_str(),
                            "finished_at": s.finished_at.map(|t| t.to_rfc3339()),
                        })
                    })
                    .collect();
                println!(
                    "{}",
                    serde_json::json!({
                        "workflow_id": status.workflow_id,
                        "state": status.state.as_str(),
                        "cancelled": status.cancelled,
                        "steps": steps,
                    })
                );
                return Ok(());
            }
            println!("step\tjob\tstate\tqueue\tkind\twaits for");
            for s in &status.steps {
                println!(
                    "{}\t{}\t{}\t{}\t{}\t{}",
                    s.step,
                    s.job_id,
                    s.state,
                    s.queue,
                    s.kind,
                    if s.depends_on.is_empty() {
                        "-".to_string()
                    } else {
                        s.depends_on.join(", ")
                    }
                );
            }
            let mut counts: Vec<String> = ringwork::JobStatus::ALL
                .iter()
                .map(|state| (state, status.count(*state)))
                .filter(|(_, n)| *n > 0)
                .map(|(state, n)| format!("{n} {state}"))
                .collect();
            if status.cancelled {
                counts.push("cancelled by an operator".into());
            }
            println!(
                "workflow {}: {} ({})",
                status.workflow_id,
                status.state.as_str(),
                counts.join(", ")
            );
        }
        Action::Cancel { workflow_id } => match admin.cancel_workflow(workflow_id).await? {
            Some(n) => println!(
                "workflow {workflow_id}: cancelled; {n} steps cancelled, none will be released"
            ),
            None => return Err(not_found(workflow_id)),
        },
    }
    Ok(())
}

fn not_found(workflow_id: i64) -> CliError {
    CliError::NotFound(format!(
        "workflow {workflow_id} not found (never created, or expired after keep_completed)"
    ))
}
