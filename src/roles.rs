//! Least privilege: what each kind of process needs in a schema, as the statements that grant it.
//!
//! The role that runs `ringwork migrate` owns the schema and everything in it. Every other role
//! gets only what its work needs, and none gets CREATE: the two things a running process creates
//! (a lane's sequences, a queue's running mark) are created by `SECURITY DEFINER` functions as the
//! owner, and only roles granted EXECUTE may call those. Run the statements as the owner, after
//! `migrate`: `ALTER DEFAULT PRIVILEGES` then extends the grants to what a later migration or a
//! new lane adds. `ringwork grant` runs (or prints) them.

use crate::error::{Error, Result};
use crate::schema::SchemaName;

/// What a role may do in the schema.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Access {
    /// Runs a `Client` with queues: claims, completes, retries, and, when elected, maintenance
    /// (rotation and prune TRUNCATE ring slots). Reads the callback key to sign callback ids.
    Worker,
    /// Inserts jobs (the Rust client, `enqueue` from SQL): no TRUNCATE, no DELETE, never the
    /// callback key.
    Producer,
    /// Reads counts, listings and job pages (`ringwork status`, a read-only dashboard with
    /// `--no-maintenance`): SELECT only, never the callback key, and not the functions that create.
    Reader,
}

impl Access {
    /// The name `ringwork grant --access` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Worker => "worker",
            Self::Producer => "producer",
            Self::Reader => "reader",
        }
    }
}

impl std::str::FromStr for Access {
    type Err = Error;

    fn from_str(name: &str) -> Result<Self> {
        match name {
            "worker" => Ok(Self::Worker),
            "producer" => Ok(Self::Producer),
            "reader" => Ok(Self::Reader),
            other => Err(Error::Config(format!(
                "unknown access {other:?}: expected worker, producer or reader"
            ))),
        }
    }
}

/// The functions that create objects as the schema's owner (`SECURITY DEFINER`).
const CREATING_FUNCTIONS: &[&str] = &[
    "create_lane_shard(text, smallint, int)",
    "create_running_mark(text)",
];

/// `role` as a quoted SQL identifier: any name PostgreSQL accepts for a role (1..=63 bytes, no NUL).
fn quoted_role(role: &str) -> Result<String> {
    if role.is_empty() || role.len() > 63 || role.contains('\0') {
        return Err(Error::InvalidName {
            what: "role name",
            value: role.to_string(),
            reason: "must be 1..=63 bytes without NUL",
        });
    }
    Ok(format!("\"{}\"", role.replace('"', "\"\"")))
}

/// The statements that give `role` the access `access` to `schema`, in order. Idempotent: run
/// them again after a migration, or to repair grants.
pub fn grant_statements(schema: &SchemaName, role: &str, access: Access) -> Result<Vec<String>> {
    let r = quoted_role(role)?;
    let s = schema.as_str();
    let (tables, sequences) = match access {
        Access::Worker => (
            "SELECT, INSERT, UPDATE, DELETE, TRUNCATE",
            "USAGE, SELECT, UPDATE",
        ),
        Access::Producer => ("SELECT, INSERT, UPDATE", "USAGE, SELECT, UPDATE"),
        Access::Reader => ("SELECT", "SELECT"),
    };
    let mut statements = vec![
        format!("GRANT USAGE ON SCHEMA {s} TO {r}"),
        format!("GRANT {tables} ON ALL TABLES IN SCHEMA {s} TO {r}"),
        format!("GRANT {sequences} ON ALL SEQUENCES IN SCHEMA {s} TO {r}"),
        format!("GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {s} TO {r}"),
        format!("ALTER DEFAULT PRIVILEGES IN SCHEMA {s} GRANT {tables} ON TABLES TO {r}"),
        format!("ALTER DEFAULT PRIVILEGES IN SCHEMA {s} GRANT {sequences} ON SEQUENCES TO {r}"),
        format!("ALTER DEFAULT PRIVILEGES IN SCHEMA {s} GRANT EXECUTE ON FUNCTIONS TO {r}"),
    ];
    // the engine clock's offset is read by every claim, and written only by a test clock: a role
    // that moved it would make live claims look stale and scheduled jobs due
    statements.push(format!(
        "REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON {s}.clock_offset FROM {r}"
    ));
    if access != Access::Worker {
        // the key callback ids are signed with: whoever reads it can mint them
        statements.push(format!("REVOKE ALL ON {s}.callback_keys FROM {r}"));
    }
    if access == Access::Reader {
        for function in CREATING_FUNCTIONS {
            statements.push(format!(
                "REVOKE EXECUTE ON FUNCTION {s}.{function} FROM {r}"
            ));
        }
    }
    Ok(statements)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_names_are_quoted_and_bad_ones_refused() {
        let schema = SchemaName::new("rw").unwrap();
        let statements = grant_statements(&schema, "ops \"team\"", Access::Reader).unwrap();
        assert_eq!(
            statements[0],
            "GRANT USAGE ON SCHEMA rw TO \"ops \"\"team\"\"\""
        );
        assert!(statements
            .iter()
            .any(|s| s == "REVOKE ALL ON rw.callback_keys FROM \"ops \"\"team\"\"\""));
        assert!(grant_statements(&schema, "", Access::Worker).is_err());
        assert!(grant_statements(&schema, "a\0b", Access::Worker).is_err());
        assert!("admin".parse::<Access>().is_err());
    }
}
