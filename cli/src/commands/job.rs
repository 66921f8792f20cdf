//! `ringwork job`, `cancel` and `cancel-unique`: one job, by id or by its unique key.

use std::time::Duration;

use ringwork::{CancelOutcome, NewJob, Unique};

use super::{duration, CliError, Result};

#[derive(clap::Args)]
pub struct ShowArgs {
    /// The job's id.
    job_id: i64,
    /// The job as one JSON object, for scripts.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    db: super::Db,
}

#[derive(clap::Args)]
pub struct CancelArgs {
    /// The job's id.
    job_id: i64,
    /// Recorded as the job's error.
    #[arg(long, default_value = "cancelled by operator")]
    reason: String,
    #[command(flatten)]
    db: super::Db,
}

#[derive(clap::Args)]
pub struct CancelUniqueArgs {
    /// The job's kind.
    #[arg(long)]
    kind: String,
    /// The job's arguments as JSON (compared canonically: key order does not matter).
    #[arg(long)]
    args: String,
    /// The job's queue; with --by-queue it is part of the key.
    #[arg(long, default_value = "default")]
    queue: String,
    /// The producer made the queue part of the key (`Unique::by_queue`).
    #[arg(long)]
    by_queue: bool,
    /// The unique period, if the producer used one (seconds, or 1h, 1d); the current bucket's job
    /// is cancelled.
    #[arg(long, value_parser = duration, allow_hyphen_values = true)]
    period: Option<Duration>,
    #[command(flatten)]
    db: super::Db,
}

fn outcome_text(job: &str, outcome: &CancelOutcome) -> Result<String> {
    match outcome {
        CancelOutcome::Cancelled => Ok(format!("{job}: cancelled; it will not run")),
        CancelOutcome::CancelledRunning => Ok(format!(
            "{job}: cancelled while running; its handler is signalled and its result will be discarded"
        )),
        CancelOutcome::AlreadyFinished => Ok(format!("{job}: already finished; nothing to cancel")),
        CancelOutcome::NotFound => Err(CliError::NotFound(format!(
            "{job}: not found (never existed, or its history aged out)"
        ))),
    }
}

pub async fn cancel(args: CancelArgs) -> Result<()> {
    let admin = args.db.open().await?;
    let outcome = admin.cancel_job(args.job_id, &args.reason).await?;
    println!(
        "{}",
        outcome_text(&format!("job {}", args.job_id), &outcome)?
    );
    Ok(())
}

pub async fn cancel_unique(args: CancelUniqueArgs) -> Result<()> {
    let job_args: serde_json::Value = serde_json::from_str(&args.args)
        .map_err(|e| ringwork::Error::Config(format!("--args is not JSON: {e}")))?;
    let mut unique = Unique::default();
    if args.by_queue {
        unique = unique.by_queue();
    }
    if let Some(period) = args.period {
        unique = unique.by_period(period);
    }
    let job = NewJob::from_parts(&args.kind, job_args)?
        .queue(&args.queue)
        .unique(unique);
    let admin = args.db.open().await?;
    let outcome = admin.cancel_unique(&job, "cancelled by operator").await?;
    println!(
        "{}",
        outcome_text(&format!("the {} job holding that key", args.kind), &outcome)?
    );
    Ok(())
}

pub async fn show(args: ShowArgs) -> Result<()> {
    let admin = args.db.open().await?;
    let Some(record) = admin.load_job(args.job_id).await? else {
        return Err(CliError::NotFound(format!(
            "job {}: not found (never existed, or its history aged out)",
            args.job_id
        )));
    };
    let s = &record.state;
    if args.json {
        let value = serde_json::json!({
            "job_id": s.job_id,
            "state": s.state.to_string(),
            "queue": s.queue,
            "kind": s.kind,
            "attempt": s.attempt,
            "run_lease": s.run_lease,
            "detail": s.detail,
            "progress": record.progress.as_ref().map(|p| serde_json::json!({
                "percent": p.progress.percent,
                "message": p.progress.message,
                "checkpoint": p.progress.checkpoint,
                "run_lease": p.run_lease,
                "recorded_at": p.recorded_at.to_rfc3339(),
            })),
            "history": record.history.iter().map(|step| serde_json::json!({
                "run_lease": step.run_lease,
                "state": step.state.to_string(),
                "at": step.at.to_rfc3339(),
                "error": step.error,
            })).collect::<Vec<_>>(),
        });
        println!("{value}");
        return Ok(());
    }
    println!(
        "job {}: {} (queue {}, kind {}, attempt {}, run_lease {}){}",
        s.job_id,
        s.state,
        s.queue,
        s.kind,
        s.attempt,
        s.run_lease,
        s.detail
            .as_deref()
            .map(|d| format!(": {d}"))
            .unwrap_or_default()
    );
    if let Some(p) = &record.progress {
        println!(
            "  progress {:.1} % (run_lease {}, {}): {}{}",
            p.progress.percent,
            p.run_lease,
            p.recorded_at.to_rfc3339(),
            p.progress.message,
            p.progress
                .checkpoint
                .as_ref()
                .map(|c| format!("  checkpoint {c}"))
                .unwrap_or_default()
        );
    }
    for step in record.history {
        println!(
            "  run_lease {:>3}  {:<13} {}  {}",
            step.run_lease,
            step.state,
            step.at.to_rfc3339(),
            step.error.unwrap_or_default()
        );
    }
    Ok(())
}
