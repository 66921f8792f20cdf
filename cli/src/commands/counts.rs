//! `ringwork counts`: exact per-queue counts.

use super::{CliError, Result};

#[derive(clap::Args)]
pub struct Args {
    /// One queue (default: all).
    #[arg(long)]
    queue: Option<String>,
    /// One JSON array of queues, for scripts.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    db: super::Db,
}

pub async fn run(args: Args) -> Result<()> {
    let admin = args.db.open().await?;
    let counts = admin.queue_counts(args.queue.as_deref()).await?;
    if let (Some(queue), true) = (&args.queue, counts.is_empty()) {
        return Err(CliError::NotFound(format!(
            "queue {queue:?} does not exist"
        )));
    }
    if args.json {
        let text = serde_json::to_string(&counts)
            .map_err(|e| ringwork::Error::Config(format!("cannot encode the counts: {e}")))?;
        println!("{text}");
    } else {
        print!("{}", super::status::counts_table(&counts, ""));
    }
    Ok(())
}
