//! `ringwork bulk`: cancel, retry or delete many jobs by filter, in bounded steps.

use std::time::Duration;

use ringwork::{JobFilter, JobStatus};

use super::{confirm, duration, Result};

fn state(text: &str) -> std::result::Result<JobStatus, String> {
    text.parse::<JobStatus>().map_err(|_| {
        format!("unknown state {text:?}; one of available, scheduled, retryable, running, waiting, dead_lettered")
    })
}

/// Which jobs a bulk operation touches: every option narrows the set.
#[derive(clap::Args)]
pub struct Filter {
    /// Only this queue's jobs.
    #[arg(long)]
    queue: Option<String>,
    /// Only jobs of this kind.
    #[arg(long)]
    kind: Option<String>,
    /// A state to include (repeat for several): available, scheduled, retryable, running (cancel);
    /// scheduled, retryable, dead_lettered (retry); dead_lettered (delete).
    #[arg(long = "state", required = true, value_parser = state)]
    states: Vec<JobStatus>,
    /// Only jobs at least this old (created, or for history and dead letters: finished); seconds,
    /// or 1h, 7d.
    #[arg(long, value_parser = duration, allow_hyphen_values = true)]
    older_than: Option<Duration>,
}

impl Filter {
    fn into_filter(self) -> JobFilter {
        JobFilter {
            queue: self.queue,
            kind: self.kind,
            states: self.states,
            older_than: self.older_than,
        }
    }
}

#[derive(clap::Subcommand)]
pub enum Action {
    /// Cancel the matching waiting and running jobs (as `ringwork cancel` does, one by one).
    ///
    /// Example: ringwork bulk cancel --queue mail --state available --state scheduled
    Cancel {
        #[command(flatten)]
        filter: Filter,
        /// Recorded as each job's error.
        #[arg(long, default_value = "cancelled by operator (bulk)")]
        reason: String,
    },
    /// Make matching scheduled and retryable jobs due now; run matching dead-lettered jobs again.
    ///
    /// Example: ringwork bulk retry --queue mail --state dead_lettered --older-than 1h
    Retry {
        #[command(flatten)]
        filter: Filter,
    },
    /// Delete matching dead-lettered jobs (terminal history is reclaimed by retention only).
    ///
    /// Example: ringwork bulk delete --state dead_lettered --older-than 7d --yes
    Delete {
        #[command(flatten)]
        filter: Filter,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
    },
}

pub async fn run(args: super::Group<Action>) -> Result<()> {
    let admin = args.db.open().await?;
    let (verb, outcome) = match args.action {
        Action::Cancel { filter, reason } => (
            "cancelled",
            admin.bulk_cancel(&filter.into_filter(), &reason).await?,
        ),
        Action::Retry { filter } => ("retried", admin.bulk_retry(&filter.into_filter()).await?),
        Action::Delete { filter, yes } => {
            confirm(yes, "delete the matching dead-lettered jobs")?;
            ("deleted", admin.bulk_delete(&filter.into_filter()).await?)
        }
    };
    println!(
        "{verb} {} of {} matching jobs in {} steps",
        outcome.changed, outcome.matched, outcome.steps
    );
    Ok(())
}
