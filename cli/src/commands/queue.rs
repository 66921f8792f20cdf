//! `ringwork pause`, `resume` and `limit`: a queue's operator switches.

use std::time::Duration;

use ringwork::{Admin, KeyLimit, QueueLimits};

use super::{duration, CliError, Result};

#[derive(clap::Args)]
pub struct PauseArgs {
    /// The queue.
    queue: String,
    /// Create the queue (paused) when it does not exist yet; without it a name that does not
    /// exist is refused, so a typo does not create a queue.
    #[arg(long)]
    create: bool,
    #[command(flatten)]
    db: super::Db,
}

#[derive(clap::Args)]
pub struct LimitArgs {
    /// The queue.
    queue: String,
    /// At most this many of the queue's jobs running (claimed) at once, across the fleet.
    #[arg(long)]
    max_running: Option<u32>,
    /// At most this many claims per `--per`, across the fleet.
    #[arg(long)]
    rate: Option<u32>,
    /// The rate's window (seconds, or 30s, 5m; at most a day).
    #[arg(long, default_value = "1", value_parser = duration, allow_hyphen_values = true)]
    per: Duration,
    /// Limits per value of this arg field (dotted for nested: `customer.id`), across the
    /// fleet: `--key-max-running`, `--key-rate` per `--key-per`, or both.
    #[arg(long)]
    key_arg: Option<String>,
    /// At most this many running jobs per key value.
    #[arg(long, requires = "key_arg")]
    key_max_running: Option<u32>,
    /// At most this many claims per key value per `--key-per`.
    #[arg(long, requires = "key_arg")]
    key_rate: Option<u32>,
    /// The per-key rate's window (seconds, or 30s, 5m; at most a day).
    #[arg(long, default_value = "1", value_parser = duration, allow_hyphen_values = true)]
    key_per: Duration,
    /// Create the queue when it does not exist yet (see `pause --create`).
    #[arg(long)]
    create: bool,
    #[command(flatten)]
    db: super::Db,
}

/// A queue named on the command line must exist unless the operator asked to create it.
async fn require_queue(admin: &Admin, queue: &str, create: bool) -> Result<()> {
    if create || admin.queue_names().await?.iter().any(|q| q == queue) {
        return Ok(());
    }
    Err(CliError::NotFound(format!(
        "queue {queue:?} does not exist (pass --create to create it)"
    )))
}

pub async fn pause(args: PauseArgs) -> Result<()> {
    set_paused(args, true).await
}

pub async fn resume(args: PauseArgs) -> Result<()> {
    set_paused(args, false).await
}

async fn set_paused(args: PauseArgs, paused: bool) -> Result<()> {
    let admin = args.db.open().await?;
    require_queue(&admin, &args.queue, args.create).await?;
    let changed = admin.set_queue_paused(&args.queue, paused).await?;
    let outcome = match (paused, changed) {
        (true, true) => "paused",
        (true, false) => "paused (already)",
        (false, true) => "resumed",
        (false, false) => "resumed (was not paused)",
    };
    println!("queue {:?} {outcome}", args.queue);
    Ok(())
}

/// A window as the library takes it: positive, at most a day.
fn window(flag: &str, per: Duration) -> Result<Duration> {
    if per.is_zero() {
        return Err(CliError::Ringwork(ringwork::Error::Config(format!(
            "{flag} must be longer than zero"
        ))));
    }
    Ok(per.min(Duration::from_secs(86_400)))
}

fn describe(limits: &QueueLimits) -> String {
    let mut parts = Vec::new();
    if let Some(n) = limits.max_running {
        parts.push(format!("at most {n} running"));
    }
    if let Some((n, per)) = limits.rate {
        parts.push(format!(
            "at most {n} claims per {}",
            humantime::format_duration(per)
        ));
    }
    if let Some(key) = &limits.per_key {
        let mut each = Vec::new();
        if let Some(n) = key.max_running {
            each.push(format!("{n} running"));
        }
        if let Some((n, per)) = key.rate {
            each.push(format!(
                "{n} claims per {}",
                humantime::format_duration(per)
            ));
        }
        parts.push(format!("per {}: {}", key.path.join("."), each.join(", ")));
    }
    if parts.is_empty() {
        "no limits".into()
    } else {
        parts.join("; ")
    }
}

pub async fn limit(args: LimitArgs) -> Result<()> {
    let per = window("--per", args.per)?;
    let key_per = window("--key-per", args.key_per)?;
    let limits = QueueLimits {
        max_running: args.max_running,
        rate: args.rate.map(|n| (n, per)),
        per_key: args.key_arg.map(|path| KeyLimit {
            path: path.split('.').map(str::to_string).collect(),
            max_running: args.key_max_running,
            rate: args.key_rate.map(|n| (n, key_per)),
        }),
    };
    let admin = args.db.open().await?;
    require_queue(&admin, &args.queue, args.create).await?;
    let changed = admin.set_queue_limits(&args.queue, limits.clone()).await?;
    println!(
        "queue {:?}: {}{}",
        args.queue,
        describe(&limits),
        if changed { "" } else { " (unchanged)" }
    );
    Ok(())
}
