//! One error type for the library. Every variant says what was wrong in words an operator can act on.

use thiserror::Error;

/// Errors returned by ringwork.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum Error {
    /// The database rejected a statement or the connection failed.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),

    /// A schema, queue or kind name that cannot be used.
    #[error("invalid {what} {value:?}: {reason}")]
    InvalidName {
        /// What the name is for (`schema name`, `queue name`, `job kind`, ...).
        what: &'static str,
        /// The name as given.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },

    /// Job arguments that cannot be stored (not serialisable, or holding a NUL character).
    #[error("invalid job arguments for kind {kind:?}: {reason}")]
    InvalidArgs {
        /// The kind of the job whose arguments were refused.
        kind: String,
        /// Why they cannot be stored.
        reason: String,
    },

    /// A configuration value outside its allowed range.
    #[error("invalid configuration: {0}")]
    Config(String),

    /// The database schema was written by a newer ringwork than this binary.
    #[error(
        "schema {schema:?} is at version {database} but this ringwork binary knows only up to version {binary}; \
         upgrade the binary (refusing to run against a newer schema)"
    )]
    SchemaTooNew {
        /// The schema's name.
        schema: String,
        /// The schema version installed in the database.
        database: i32,
        /// The newest schema version this binary knows.
        binary: i32,
    },

    /// The database server could not be reached (refused, unreachable, or no answer in time).
    #[error("cannot reach the database server at {target}: {reason}")]
    Unreachable {
        /// The server tried: `host:port`, or the socket path.
        target: String,
        /// Why it could not be reached (the I/O error, or no answer within 5 s).
        reason: String,
    },

    /// A write on behalf of an attempt that is no longer open: it was rescued, cancelled or
    /// completed before this write, which changed nothing (the stale-writer guard).
    #[error(
        "attempt {run_lease} of job {job_id} is no longer open (rescued, cancelled or already \
         completed); this write changed nothing"
    )]
    Stale {
        /// The job the write was for.
        job_id: i64,
        /// The run lease of the attempt the write named.
        run_lease: i64,
    },

    /// A callback id that this schema did not give out (malformed, or its signature does not
    /// match), or one whose wait is over (answered already, timed out, or its attempt ended
    /// before it waited).
    #[error("callback {id}: {reason}")]
    Callback {
        /// The callback id as given.
        id: String,
        /// Why it was refused.
        reason: String,
    },

    /// The database schema is not the one this binary's migrations describe.
    #[error("schema {schema:?} cannot be used: {reason}")]
    SchemaMismatch {
        /// The schema's name (empty where it is not known).
        schema: String,
        /// What does not match.
        reason: String,
    },
}

/// Shorthand for `Result<T, ringwork::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;
