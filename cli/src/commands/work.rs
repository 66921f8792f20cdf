//! `ringwork work` (hidden): a worker process for the `sleep` job kind, for the crash tests.

use std::time::Duration;

use ringwork::MaintenanceConfig;

use super::{duration, Result};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    db: super::Db,
    #[arg(long, default_value = "default")]
    queue: String,
    #[arg(long, default_value_t = 16)]
    workers: usize,
    /// Time without heartbeat or completion before a claim is rescued (seconds, or 30s, 1m).
    #[arg(long, default_value = "60", value_parser = duration, allow_hyphen_values = true)]
    stale_after: Duration,
    /// Time between ring rotations (seconds, or 500ms, 1s).
    #[arg(long, default_value = "1", value_parser = duration, allow_hyphen_values = true)]
    rotate_every: Duration,
}

pub async fn run(args: Args) -> Result<()> {
    let maintenance = MaintenanceConfig {
        tick: Duration::from_millis(100),
        stale_after: args.stale_after,
        rotate_interval: args.rotate_every,
        ..MaintenanceConfig::default()
    };
    super::demo::work(
        &args.db.database_url,
        &args.db.schema,
        &args.queue,
        args.workers,
        maintenance,
    )
    .await?;
    Ok(())
}
