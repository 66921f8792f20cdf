//! `ringwork callback`: answer a job that waits for an external callback.

use std::time::Duration;

use super::{duration, Result};

/// What the callback says.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum Verb {
    /// The job is completed.
    Complete,
    /// The job fails for good (with --error).
    Fail,
    /// The job is retried (uses an attempt; with --error).
    Retry,
    /// The job's handler runs again and reads --payload.
    Resume,
    /// The wait goes on: its timeout is extended (--extend-secs).
    Heartbeat,
}

impl Verb {
    fn as_str(self) -> &'static str {
        match self {
            Self::Complete => "complete",
            Self::Fail => "fail",
            Self::Retry => "retry",
            Self::Resume => "resume",
            Self::Heartbeat => "heartbeat",
        }
    }
}

#[derive(clap::Args)]
pub struct Args {
    /// What the callback says.
    action: Verb,
    /// The callback id the handler registered (64 hex characters).
    id: String,
    /// JSON for resume (what JobContext::callback_payload reads).
    #[arg(long)]
    payload: Option<String>,
    /// The error recorded by fail or retry.
    #[arg(long)]
    error: Option<String>,
    /// Heartbeat: the new timeout from now (seconds, or 10m, 2h; default 300 s).
    #[arg(long, value_parser = duration, allow_hyphen_values = true)]
    extend_secs: Option<Duration>,
    #[command(flatten)]
    db: super::GroupDb,
}

pub async fn run(args: Args) -> Result<()> {
    let payload = args
        .payload
        .map(|text| {
            serde_json::from_str(&text)
                .map_err(|e| ringwork::Error::Config(format!("--payload is not JSON: {e}")))
        })
        .transpose()?;
    let action = ringwork::CallbackAction::from_parts(
        args.action.as_str(),
        payload,
        args.error,
        args.extend_secs.map(|d| d.as_secs_f64()),
    )?;
    let admin = args.db.open().await?;
    let outcome = admin.resolve_callback(&args.id, action).await?;
    println!("{}", outcome.as_str());
    Ok(())
}
