//! ringwork — a Postgres-native background job queue whose hot tables never bloat.
//!
//! Jobs live in rings of list partitions (the queue ring and the claim ring); every hot-path write is
//! an INSERT, and space comes back by TRUNCATE of a slot proven to hold nothing live. See
//! `docs/` for the storage design and operations.
//!
//! ```no_run
//! use ringwork::{Client, JobArgs, JobContext, JobError, NewJob, QueueConfig};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize)]
//! struct SendEmail { to: String }
//! impl JobArgs for SendEmail { const KIND: &'static str = "send_email"; }
//!
//! # async fn demo(pool: sqlx::PgPool) -> ringwork::Result<()> {
//! let client = Client::builder(pool.clone())
//!     .queue("default", QueueConfig::default())
//!     .register(|_ctx: JobContext, job: SendEmail| async move {
//!         println!("mail to {}", job.to);
//!         Ok::<(), JobError>(())
//!     })
//!     .build()
//!     .await?;
//! let mut tx = pool.begin().await?;
//! client.insert_tx(&mut tx, NewJob::new(&SendEmail { to: "a@example.com".into() })?).await?;
//! tx.commit().await?;
//! let running = client.start().await?;
//! running.shutdown(std::time::Duration::from_secs(10)).await;
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

mod admin;
mod bytes;
#[cfg(feature = "dashboard")]
pub mod dashboard;
#[cfg(feature = "embedded")]
pub mod embedded;
mod error;
#[cfg(feature = "http")]
pub mod http;
mod job;
pub mod maintenance;
pub mod periodic;
pub mod roles;
mod runtime;
pub mod schema;
// Some statements exist for the engine's own tests and benchmark lab (feature `testing`) only.
#[cfg_attr(not(feature = "testing"), allow(dead_code))]
mod storage;
pub mod telemetry;
#[cfg(feature = "testing")]
pub mod testing;
mod trace_context;
mod workflow;

pub use admin::{Admin, UnworkedQueue};
pub use error::{Error, Result};
pub use job::{
    JobArgs, JobStatus, NewJob, Unique, UniqueState, DEFAULT_MAX_ATTEMPTS, DEFAULT_PRIORITY,
    DEFAULT_QUEUE,
};
pub use maintenance::MaintenanceConfig;
pub use periodic::{MissedFires, Periodic};
pub use runtime::handler::{BoxError, JobContext, JobError, RetryPolicy};
pub use runtime::{
    check_reachable, Client, ClientBuilder, CompletionConfig, Liveness, Metrics, QueueConfig,
    RunningClient, CLAIM_AHEAD_MAX_HANDLER, CLAIM_AHEAD_WINDOW,
};
pub use schema::{RingSizes, SchemaName};
/// The engine's storage layer: every statement of the engine, the hot paths included. For
/// ringwork's own tests and benchmark lab, with the `testing` feature; not a stable API. Operators
/// and services use [`Admin`].
#[cfg(feature = "testing")]
#[doc(hidden)]
pub use storage::Storage;
pub use storage::{
    ArchiveSearch, ArchiveSearchPage, ArchiveSpan, ArchiveTable, ArgsText, AttemptRef,
    AwaitOutcome, BulkOutcome, CallbackAction, CallbackOutcome, CancelOutcome, ClaimedJob,
    CloseOutcome, DeadLetter, HistoryEntry, HorizonHolder, Inserted, JobFilter, JobPage, JobRecord,
    JobState, KeyInUse, KeyLimit, LimitsInUse, ListedJob, Outcome, PendingJob, ProcessSession,
    Progress, ProgressRecord, PruneBlocker, PruneResult, QueueCounts, QueueLimits, QueueSlotPrune,
    Readiness, ReplicaStatus, RingSlot, ScheduleRecord, TableHealth, ARCHIVE_SEARCH_CAP,
    BULK_CANCEL_STATES, BULK_RETRY_STATES,
};
pub use telemetry::Telemetry;
pub use workflow::{
    Batch, DependencyFailure, InsertedBatch, InsertedWorkflow, Step, StepStatus, Workflow,
    WorkflowCounts, WorkflowState, WorkflowStatus,
};
