//! The archive: terminal history kept after its queue slot is pruned, in rings of time buckets
//! (`sql/functions/archive.sql`). A sealed queue slot is archived ahead of its prune, under ACCESS
//! SHARE locks only; prune appends whatever arrived since. This module also reclaims it, and
//! searches it by argument content (archive search, migrations 0026 and 0027).

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::Row;

use super::{ListedJob, QueueSlotPrune, Storage};
use crate::error::{Error, Result};
use crate::schema::SchemaName;
use crate::JobStatus;

/// This plane's statements, rendered once per schema.
#[derive(Debug)]
pub(super) struct Statements {
    archive_queue_slot_ahead: String,
    archive_expire: String,
    fold_terminal_totals: String,
    search_archive: String,
    archive_search_enabled: String,
    set_archive_search: String,
}

impl Statements {
    pub(super) fn new(s: &SchemaName) -> Self {
        Self {
            archive_queue_slot_ahead: format!(
                "SELECT {s}.archive_queue_slot_ahead($1, $2, make_interval(secs => $3), \
                 make_interval(secs => $4))"
            ),
            archive_expire: format!("SELECT {s}.archive_expire($1, make_interval(secs => $2), $3)"),
            fold_terminal_totals: format!("SELECT {s}.fold_terminal_totals($1)"),
            // arguments cut in the database, as in a job listing
            search_archive: format!(
                "SELECT job_id, state, queue, kind, left(args::text, {cut}) AS args, attempt, at, \
                 NULL::text AS detail, page_key, matched \
                 FROM {s}.search_archive($1::jsonb, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                cut = super::read::ARGS_PREVIEW_CHARS + 1
            ),
            archive_search_enabled: format!("SELECT {s}.setting('archive_search') IS NOT NULL"),
            set_archive_search: format!("SELECT {s}.set_setting('archive_search', $1)"),
        }
    }
}

/// One of the archive's tables, or one half of archive search's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArchiveTable {
    /// `archived_completion_batches`: completions, one row per queue, second and 256 jobs, kept
    /// `keep_completed`.
    Completions,
    /// `archived_jobs`: failed, cancelled and row-completed jobs, kept `keep_failed`.
    Jobs,
    /// `archived_job_args`' completed jobs (archive search), kept `keep_completed`.
    CompletionsSearch,
    /// `archived_job_args`' failed, cancelled and row-completed jobs, kept `keep_failed`.
    JobsSearch,
}

impl ArchiveTable {
    fn as_str(self) -> &'static str {
        match self {
            ArchiveTable::Completions => "completions",
            ArchiveTable::Jobs => "jobs",
            ArchiveTable::CompletionsSearch => "completions_search",
            ArchiveTable::JobsSearch => "jobs_search",
        }
    }
}

impl Storage {
    /// Copy a sealed queue slot's terminal history to the archive ahead of its prune (migration
    /// 0016), holding only ACCESS SHARE on the slot's children, so that claims, completions and
    /// readers go on meanwhile and the prune's ACCESS EXCLUSIVE locks are held for a count and a
    /// TRUNCATE rather than for the copy. [`Storage::prune_queue_slot_with`] calls it first.
    /// Returns `copied`, `up_to_date`, `not_sealed`, the slot's prune blocker (`pending_ready`,
    /// `open_claims`: such a slot is left to prune), or `busy`.
    pub async fn archive_queue_slot_ahead(
        &self,
        slot: i32,
        options: &QueueSlotPrune,
    ) -> Result<String> {
        Ok(
            sqlx::query_scalar(&self.sql.archive.archive_queue_slot_ahead)
                .bind(slot)
                .bind(format!("{}ms", options.lock_timeout.as_millis().max(1)))
                .bind(options.keep_completed.as_secs_f64())
                .bind(options.keep_failed.as_secs_f64())
                .fetch_one(self.db())
                .await?,
        )
    }

    /// Truncate every bucket of `table` (other than the current one) whose newest row is older
    /// than `keep`. A bucket whose lock is not granted within `lock_timeout` is left for the next
    /// call. Returns the number of buckets truncated.
    pub async fn archive_expire(
        &self,
        table: ArchiveTable,
        keep: Duration,
        lock_timeout: Duration,
    ) -> Result<i32> {
        Ok(sqlx::query_scalar(&self.sql.archive.archive_expire)
            .bind(table.as_str())
            .bind(keep.as_secs_f64())
            .bind(format!("{}ms", lock_timeout.as_millis().max(1)))
            .fetch_one(self.db())
            .await?)
    }

    /// Fold every terminal-totals bucket but the current one into the current one (one row per
    /// queue) and truncate it, so the durable totals stay a handful of rows per queue. A bucket
    /// whose lock is not granted within `lock_timeout` is left for the next call. Returns the
    /// number of buckets folded.
    pub async fn fold_terminal_totals(&self, lock_timeout: Duration) -> Result<i32> {
        Ok(sqlx::query_scalar(&self.sql.archive.fold_terminal_totals)
            .bind(format!("{}ms", lock_timeout.as_millis().max(1)))
            .fetch_one(self.db())
            .await?)
    }

    /// Turn archive search on or off (the `archive_search` setting).
    pub async fn set_archive_search(&self, on: bool) -> Result<()> {
        sqlx::query(&self.sql.archive.set_archive_search)
            .bind(on.then_some(1_i64))
            .execute(self.db())
            .await?;
        Ok(())
    }

    /// Search the archive by argument content ([`ArchiveSearch`]): newest first, `limit` (1 to
    /// 1,000) a page, from the page key `after` (a previous page's `next`).
    pub async fn search_archive(
        &self,
        search: &ArchiveSearch,
        after: Option<&str>,
        limit: usize,
    ) -> Result<ArchiveSearchPage> {
        let invalid = |what: &'static str, value: &str, reason: &'static str| Error::InvalidName {
            what,
            value: value.to_string(),
            reason,
        };
        if let Some(queue) = &search.queue {
            crate::job::validate_name("queue name", queue)?;
        }
        if let Some(kind) = &search.kind {
            crate::job::validate_name("job kind", kind)?;
        }
        if let Some(state) = search.state {
            if !matches!(
                state,
                JobStatus::Completed | JobStatus::Failed | JobStatus::Cancelled
            ) {
                return Err(invalid(
                    "archive search state",
                    state.as_str(),
                    "the archive holds completed, failed and cancelled jobs",
                ));
            }
        }
        let args = search.args.to_string();
        let excerpt = || args.chars().take(64).collect::<String>();
        if args.len() > MAX_SEARCH_ARGS_BYTES {
            return Err(invalid(
                "archive search",
                &excerpt(),
                "the arguments searched for are longer than 4,096 bytes of JSON",
            ));
        }
        if args.contains("\\u0000") {
            return Err(invalid(
                "archive search",
                &excerpt(),
                "JSON text in the database cannot hold the NUL character (\\u0000)",
            ));
        }
        let before = match after {
            None => None,
            Some(key) => Some(page_key_position(key).ok_or_else(|| {
                invalid(
                    "page key",
                    key,
                    "expected the `next` key of an archive search page",
                )
            })?),
        };
        let limit = limit.clamp(1, 1000);
        let enabled: bool = sqlx::query_scalar(&self.sql.archive.archive_search_enabled)
            .fetch_one(self.db())
            .await?;
        let rows = sqlx::query(&self.sql.archive.search_archive)
            .bind(&args)
            .bind(search.queue.as_deref())
            .bind(search.kind.as_deref())
            .bind(search.state.map(JobStatus::as_str))
            .bind(search.since)
            .bind(search.until)
            .bind(before.map(|(at, _)| at))
            .bind(before.map(|(_, id)| id))
            // one more than asked: whether a next page exists
            .bind((limit + 1) as i32)
            .bind(ARCHIVE_SEARCH_CAP as i32)
            .fetch_all(self.db())
            .await?;
        let matched = match rows.first() {
            Some(row) => row.try_get::<i32, _>("matched")? as usize,
            None => 0,
        };
        if matched > ARCHIVE_SEARCH_CAP {
            return Ok(ArchiveSearchPage {
                enabled,
                jobs: Vec::new(),
                next: None,
                too_wide: true,
            });
        }
        let mut jobs = super::read::listed(rows)?;
        let next = if jobs.len() > limit {
            jobs.truncate(limit);
            jobs.last().map(|job| job.page_key.clone())
        } else {
            None
        };
        Ok(ArchiveSearchPage {
            enabled,
            jobs,
            next,
            too_wide: false,
        })
    }
}

/// How many matches one archive search reads at most. The index finds matches in no order, so a
/// page newest first reads them all; a search that matches more is refused as too wide rather
/// than read whole ([`ArchiveSearchPage::too_wide`]).
pub const ARCHIVE_SEARCH_CAP: usize = 10_000;

/// The longest JSON text an archive search looks for.
const MAX_SEARCH_ARGS_BYTES: usize = 4096;

/// An archive search: finished jobs whose arguments contain `args` (JSON containment: an object
/// matches arguments holding at least its keys with those values, `{"customer": 42}`), through
/// an index. Only jobs archived while the schema's `archive_search` setting was on are found
/// (`SELECT <schema>.set_setting('archive_search', 1)`).
#[derive(Clone, Debug, PartialEq)]
pub struct ArchiveSearch {
    /// What the arguments must contain.
    pub args: serde_json::Value,
    /// Only this queue's jobs.
    pub queue: Option<String>,
    /// Only this kind's jobs.
    pub kind: Option<String>,
    /// Only jobs that ended so: completed, failed or cancelled.
    pub state: Option<JobStatus>,
    /// Only jobs finished at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Only jobs finished before this time.
    pub until: Option<DateTime<Utc>>,
}

/// Every archived job: arguments containing `{}` (any object), no other filter.
impl Default for ArchiveSearch {
    fn default() -> Self {
        Self {
            args: serde_json::json!({}),
            queue: None,
            kind: None,
            state: None,
            since: None,
            until: None,
        }
    }
}

/// One page of an archive search.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ArchiveSearchPage {
    /// Whether the `archive_search` setting is on now (jobs archived while it was off are not
    /// found).
    pub enabled: bool,
    /// The matching jobs, newest first.
    pub jobs: Vec<ListedJob>,
    /// The page key of the next page; `None` on the last page.
    pub next: Option<String>,
    /// More than [`ARCHIVE_SEARCH_CAP`] jobs match the arguments, queue, kind and state: too many
    /// to order, and none are listed. More keys, a queue, a kind or a state narrow it; a time
    /// range filters the matches but does not narrow what is read.
    pub too_wide: bool,
}

/// The position a page key `T<microseconds since the epoch>:<job id>` names: a time and a job id.
fn page_key_position(key: &str) -> Option<(DateTime<Utc>, i64)> {
    let (micros, id) = key.strip_prefix('T')?.split_once(':')?;
    let micros: i64 = micros.parse().ok()?;
    let id: i64 = id.parse().ok()?;
    Some((DateTime::from_timestamp_micros(micros)?, id))
}
