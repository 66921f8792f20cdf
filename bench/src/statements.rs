//! The statements a phase ran and what they cost, from `pg_stat_statements` when the server has it
//! loaded (the runner's throwaway cluster preloads it when the extension is installed): reset when
//! a phase starts, read when it ends.

use serde::{Deserialize, Serialize};
use sqlx::PgPool;

/// One statement's share of a phase: execution time only (the extension does not time executor
/// start-up, planning is off), nested statements included (`toplevel` false).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct StatementCost {
    pub toplevel: bool,
    pub calls: i64,
    pub total_ms: f64,
    pub ms_per_1k_jobs: f64,
    /// WAL the statement wrote over the phase, bytes.
    #[serde(default)]
    pub wal_bytes: i64,
    /// The normalised text, whitespace collapsed, at most 160 characters.
    pub query: String,
}

/// The `pg_stat_statements` shared library, when the server binaries have it.
pub(crate) fn library_installed() -> bool {
    ringwork::embedded::find_bindir()
        .ok()
        .and_then(|bin| bin.parent().map(|p| p.join("lib/pg_stat_statements.so")))
        .is_some_and(|lib| lib.exists())
}

/// Reset the counters if the database can keep them (creating the extension where the library
/// is preloaded); false when it cannot, and then a phase reports no statements.
pub(crate) async fn reset(admin: &PgPool) -> bool {
    let preloaded: bool = sqlx::query_scalar(
        "SELECT current_setting('shared_preload_libraries') ~ '(^|[ ,])pg_stat_statements($|[ ,])'",
    )
    .fetch_one(admin)
    .await
    .unwrap_or(false);
    if !preloaded {
        return false;
    }
    if sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .execute(admin)
        .await
        .is_err()
    {
        return false;
    }
    sqlx::query("SELECT pg_stat_statements_reset()")
        .execute(admin)
        .await
        .is_ok()
}

/// The `n` statements that took the most time since the reset, per 1,000 of `completed` jobs.
pub(crate) async fn top(admin: &PgPool, completed: u64, n: i64) -> Vec<StatementCost> {
    let rows: Vec<(bool, i64, f64, i64, String)> = sqlx::query_as(
        "SELECT toplevel, calls, total_exec_time, wal_bytes::int8, left(regexp_replace(query, '\\s+', ' ', 'g'), 160)
         FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
         ORDER BY total_exec_time DESC LIMIT $1",
    )
    .bind(n)
    .fetch_all(admin)
    .await
    .unwrap_or_default();
    rows.into_iter()
        .map(
            |(toplevel, calls, total_ms, wal_bytes, query)| StatementCost {
                toplevel,
                calls,
                total_ms,
                ms_per_1k_jobs: if completed > 0 {
                    total_ms * 1000.0 / completed as f64
                } else {
                    0.0
                },
                wal_bytes,
                query,
            },
        )
        .collect()
}
