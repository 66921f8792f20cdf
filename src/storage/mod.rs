//! The storage layer: every statement ringwork runs, by name, against one schema.
//!
//! The runtime asks this layer for "insert these jobs", "claim up to N from queue Q", "complete this
//! batch"; it never builds SQL itself. The work is done by the server-side functions in
//! `sql/functions/`, so claim and completion are one round trip each. One module per plane, named
//! like the SQL file whose functions it calls.

mod archive;
mod callbacks;
mod claim;
mod complete;
mod control;
mod dead_letter;
mod deferred;
mod health;
mod periodic;
mod pooling;
mod prune;
mod queue_ring;
mod read;
mod rescue;
mod rotate;
mod unique;
mod workflows;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use sqlx::{PgConnection, PgPool};

use crate::schema::SchemaName;

pub use archive::{ArchiveSearch, ArchiveSearchPage, ArchiveTable, ARCHIVE_SEARCH_CAP};
pub use callbacks::{AwaitOutcome, CallbackAction, CallbackOutcome};
pub use claim::ClaimedJob;
pub use complete::{AttemptRef, CloseOutcome, Outcome};
pub use control::{
    BulkOutcome, CancelOutcome, JobFilter, KeyLimit, QueueLimits, BULK_CANCEL_STATES,
    BULK_RETRY_STATES,
};
pub use dead_letter::DeadLetter;
pub use health::{
    ArchiveSpan, HorizonHolder, ProcessSession, Readiness, ReplicaStatus, TableHealth,
};
pub use periodic::ScheduleRecord;
use pooling::{ConnStatements, PoolStatements, Pooling};
pub use prune::{PruneBlocker, PruneResult, QueueSlotPrune, RingSlot};
pub use queue_ring::Inserted;
pub use read::{
    ArgsText, HistoryEntry, JobPage, JobRecord, JobState, KeyInUse, LimitsInUse, ListedJob,
    PendingJob, Progress, ProgressRecord, QueueCounts,
};

/// Every plane's named statements, rendered once per schema.
#[derive(Debug)]
struct Statements {
    queue_ring: queue_ring::Statements,
    claim: claim::Statements,
    complete: complete::Statements,
    rescue: rescue::Statements,
    rotate: rotate::Statements,
    prune: prune::Statements,
    callbacks: callbacks::Statements,
    deferred: deferred::Statements,
    unique: unique::Statements,
    dead_letter: dead_letter::Statements,
    archive: archive::Statements,
    control: control::Statements,
    read: read::Statements,
    health: health::Statements,
    periodic: periodic::Statements,
    workflows: workflows::Statements,
}

/// Storage handle for one schema: every statement of the engine, the hot paths (claim, complete,
/// rotate, prune) included. Operators, scripts and services use [`crate::Admin`], the operator API
/// over it; this type is what the runtime, the dashboard and the engine's own tests drive. Cheap to
/// clone.
#[derive(Clone, Debug)]
pub struct Storage {
    pool: PgPool,
    pooling: Pooling,
    schema: SchemaName,
    sql: Arc<Statements>,
    /// The (queue, priority) lanes known to exist (committed).
    known_lanes: Arc<Mutex<HashSet<(String, i16)>>>,
    /// The schema's callback key (lease_ring), read on first use.
    callback_key: Arc<tokio::sync::OnceCell<Vec<u8>>>,
    /// The schema's `max_args_bytes` setting (queue_ring), read on the first insert.
    max_args_bytes: Arc<tokio::sync::OnceCell<i64>>,
}

impl Storage {
    /// A handle on `schema` through `pool`, connecting directly (no transaction pooler). Renders
    /// the schema's statements; runs none.
    pub fn new(pool: PgPool, schema: SchemaName) -> Self {
        let sql = Arc::new(Statements {
            queue_ring: queue_ring::Statements::new(&schema),
            claim: claim::Statements::new(&schema),
            complete: complete::Statements::new(&schema),
            rescue: rescue::Statements::new(&schema),
            rotate: rotate::Statements::new(&schema),
            prune: prune::Statements::new(&schema),
            callbacks: callbacks::Statements::new(&schema),
            deferred: deferred::Statements::new(&schema),
            unique: unique::Statements::new(&schema),
            dead_letter: dead_letter::Statements::new(&schema),
            archive: archive::Statements::new(&schema),
            control: control::Statements::new(&schema),
            read: read::Statements::new(&schema),
            health: health::Statements::new(&schema),
            periodic: periodic::Statements::new(&schema),
            workflows: workflows::Statements::new(&schema),
        });
        Self {
            pool,
            pooling: Pooling::Direct,
            schema,
            sql,
            known_lanes: Arc::default(),
            callback_key: Arc::default(),
            max_args_bytes: Arc::default(),
        }
    }

    /// This storage's pool reaches PostgreSQL through a transaction-mode pooler (PgBouncer with
    /// `pool_mode = transaction`): every statement is sent unnamed and runs inside a transaction.
    /// `session`, if given, reaches the server directly and carries what needs a session of its
    /// own: LISTEN and the maintenance leader's lock (see `session_pool`).
    pub fn behind_transaction_pooler(mut self, session: Option<PgPool>) -> Self {
        self.pooling = Pooling::TransactionPooler { session };
        self
    }

    /// Whether the pool goes through a transaction-mode pooler.
    pub fn transaction_pooler(&self) -> bool {
        matches!(self.pooling, Pooling::TransactionPooler { .. })
    }

    /// The pool this storage runs its statements on.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// A pool whose connections are server sessions (for LISTEN and session advisory locks): the
    /// pool itself, unless it goes through a transaction pooler; then the direct pool given with
    /// `behind_transaction_pooler`, if any.
    pub fn session_pool(&self) -> Option<&PgPool> {
        match &self.pooling {
            Pooling::Direct => Some(&self.pool),
            Pooling::TransactionPooler { session } => session.as_ref(),
        }
    }

    /// The pool as an executor of one statement (in a transaction of its own behind a pooler).
    fn db(&self) -> PoolStatements<'_> {
        PoolStatements {
            pool: &self.pool,
            pooler: self.transaction_pooler(),
        }
    }

    /// A caller's connection as an executor (unnamed statements behind a pooler).
    fn on<'c>(&self, conn: &'c mut PgConnection) -> ConnStatements<'c> {
        ConnStatements {
            conn,
            pooler: self.transaction_pooler(),
        }
    }

    /// The schema this storage reads and writes.
    pub fn schema(&self) -> &SchemaName {
        &self.schema
    }
}

fn outcome(accepted: bool) -> Outcome {
    if accepted {
        Outcome::Applied
    } else {
        Outcome::Stale
    }
}
