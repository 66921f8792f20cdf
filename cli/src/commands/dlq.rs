//! `ringwork dlq`: list, retry and purge dead-lettered jobs.

use super::{confirm, CliError, Result};

#[derive(clap::Subcommand)]
pub enum Action {
    /// List dead-lettered jobs, oldest failure first.
    List {
        /// Only this queue's.
        #[arg(long)]
        queue: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(i64).range(1..=10_000))]
        limit: i64,
    },
    /// Run a dead-lettered job again (fresh attempts, higher run_lease).
    Retry {
        /// The job's id.
        job_id: i64,
    },
    /// Delete dead-lettered jobs: one by id, a whole queue's, or (with --all) every one.
    ///
    /// Example: ringwork dlq purge --queue mail --yes
    Purge {
        /// One job, by id.
        job_id: Option<i64>,
        /// Every dead-lettered job of this queue.
        #[arg(long)]
        queue: Option<String>,
        /// Every dead-lettered job.
        #[arg(long)]
        all: bool,
        /// Do not ask for confirmation (asked for a queue's or all).
        #[arg(long)]
        yes: bool,
    },
}

pub async fn run(args: super::Group<Action>) -> Result<()> {
    let admin = args.db.open().await?;
    match args.action {
        Action::List { queue, limit } => {
            for dead in admin.dead_letters(queue.as_deref(), limit).await? {
                println!(
                    "{}\t{}\t{}\tattempt {}\t{}\t{}",
                    dead.job_id,
                    dead.queue,
                    dead.kind,
                    dead.attempt,
                    dead.failed_at,
                    dead.error.unwrap_or_default()
                );
            }
        }
        Action::Retry { job_id } => {
            if !admin.retry_dead_letter(job_id).await? {
                return Err(CliError::NotFound(format!(
                    "job {job_id} is not in the dead-letter queue"
                )));
            }
            println!("job {job_id} scheduled to run again");
        }
        Action::Purge {
            job_id,
            queue,
            all,
            yes,
        } => {
            match (job_id, &queue, all) {
                (None, None, false) => {
                    return Err(
                        ringwork::Error::Config("name a job id, --queue, or --all".into()).into(),
                    )
                }
                (Some(_), _, _) => {}
                (None, Some(q), _) => confirm(
                    yes,
                    &format!("purge every dead-lettered job of queue {q:?}"),
                )?,
                (None, None, true) => confirm(yes, "purge every dead-lettered job")?,
            }
            let n = admin.purge_dead_letters(queue.as_deref(), job_id).await?;
            if let (Some(id), 0) = (job_id, n) {
                return Err(CliError::NotFound(format!(
                    "job {id} is not in the dead-letter queue"
                )));
            }
            println!("purged {n} dead-lettered job(s)");
        }
    }
    Ok(())
}
