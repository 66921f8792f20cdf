//! `ringwork archive`: archive search (finished jobs by what their arguments contain), and turning
//! it on or off for the schema.

use chrono::{DateTime, Utc};
use ringwork::{ArchiveSearch, JobStatus};

use super::{CliError, Result};

#[derive(clap::Subcommand)]
pub enum Action {
    /// Archived jobs whose arguments contain the JSON given, newest first, through the archive
    /// search index: only jobs archived while archive search was on are found. A search matching
    /// more than 10,000 jobs is refused as too wide: narrow it.
    Search {
        /// JSON the arguments contain: an object matches arguments holding at least its keys
        /// with those values.
        args: String,
        /// Only this queue's jobs.
        #[arg(long)]
        queue: Option<String>,
        /// Only this kind's jobs.
        #[arg(long)]
        kind: Option<String>,
        /// Only jobs that ended so: completed, failed or cancelled.
        #[arg(long)]
        state: Option<JobStatus>,
        /// Only jobs finished at or after this time (RFC 3339, `2026-12-01T00:00:00Z`).
        #[arg(long)]
        since: Option<DateTime<Utc>>,
        /// Only jobs finished before this time (RFC 3339).
        #[arg(long)]
        until: Option<DateTime<Utc>>,
        /// How many jobs to list (at most 1,000).
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// Go on after a previous search's last page key (printed when more remain).
        #[arg(long)]
        after: Option<String>,
    },
    /// Turn archive search on: from now on the archive copy indexes each finished job's
    /// arguments (an index entry per argument value; docs/operations.md gives the cost).
    SearchOn,
    /// Turn archive search off: nothing more is indexed; what was stays searchable until
    /// retention removes it.
    SearchOff,
}

pub async fn run(args: super::Group<Action>) -> Result<()> {
    let admin = args.db.open().await?;
    match args.action {
        Action::Search {
            args,
            queue,
            kind,
            state,
            since,
            until,
            limit,
            after,
        } => {
            let args = serde_json::from_str(&args).map_err(|e| {
                CliError::Refused(format!(
                    "the arguments to search for are JSON, such as '{{\"customer\": 42}}': {e}"
                ))
            })?;
            let search = ArchiveSearch {
                args,
                queue,
                kind,
                state,
                since,
                until,
            };
            let page = admin
                .search_archive(&search, after.as_deref(), limit)
                .await?;
            if !page.enabled {
                eprintln!(
                    "archive search is off: jobs archived from now on are not indexed \
                     (`ringwork archive search-on`)"
                );
            }
            if page.too_wide {
                return Err(CliError::Refused(format!(
                    "more than {} archived jobs match, too many to list newest first: narrow \
                     the search (more keys, --queue, --kind, --state, --since, --until)",
                    ringwork::ARCHIVE_SEARCH_CAP
                )));
            }
            println!("job\tstate\tqueue\tkind\tattempt\tfinished\targs");
            for job in &page.jobs {
                println!(
                    "{}\t{}\t{}\t{}\t{}\t{}\t{}",
                    job.job_id,
                    job.state,
                    job.queue,
                    job.kind,
                    job.attempt,
                    job.at.to_rfc3339(),
                    job.args
                );
            }
            if let Some(next) = page.next {
                eprintln!("more: --after {next}");
            }
        }
        Action::SearchOn => {
            admin.set_archive_search(true).await?;
            println!("archive search on: jobs archived from now on are indexed");
        }
        Action::SearchOff => {
            admin.set_archive_search(false).await?;
            println!("archive search off: nothing more is indexed");
        }
    }
    Ok(())
}
