//! `ringwork status`: one screen for an operator: exact per-queue counts, the queues whose jobs
//! nobody takes, both rings, the backends that make prune give up, and whoever holds back the
//! database's MVCC horizon.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use ringwork::{
    Admin, HorizonHolder, PruneBlocker, QueueCounts, ReplicaStatus, RingSlot, UnworkedQueue,
};

use super::duration;

#[derive(clap::Args)]
pub struct Args {
    /// Print it again at this interval, clearing the screen (seconds, or 5s, 1m; at least 1 s).
    #[arg(long, value_name = "INTERVAL", value_parser = duration, allow_hyphen_values = true)]
    watch: Option<Duration>,
    /// One JSON object per refresh, for scripts.
    #[arg(long)]
    json: bool,
    /// List sessions whose transaction has been open at least this long (seconds, or 30s, 5m).
    #[arg(long, default_value = "10", value_parser = duration, allow_hyphen_values = true)]
    horizon_min_secs: Duration,
    /// Name the queues whose available jobs have waited this long while nobody claimed from them
    /// (seconds, or 30s, 5m). The default is the bound of the `ringwork_queue_unworked` metric
    /// (`ringwork::telemetry::UNWORKED_AFTER`).
    #[arg(long, default_value = "60", value_parser = duration, allow_hyphen_values = true)]
    unworked_after: Duration,
    #[command(flatten)]
    db: super::Db,
}

pub async fn run(args: Args) -> super::Result<()> {
    if args
        .watch
        .is_some_and(|every| every < Duration::from_secs(1))
    {
        return Err(ringwork::Error::Config("--watch must be at least 1 second".into()).into());
    }
    let admin = args.db.open().await?;
    print_status(
        &admin,
        args.json,
        args.watch,
        args.horizon_min_secs,
        args.unworked_after,
    )
    .await?;
    Ok(())
}

#[derive(Serialize)]
struct Status {
    schema: String,
    at: DateTime<Utc>,
    /// `null` on a primary; on a hot standby, how stale the rest may be.
    replica: Option<ReplicaStatus>,
    queues: Vec<QueueCounts>,
    unworked: Vec<UnworkedQueue>,
    rings: Vec<RingSlot>,
    prune_blockers: Vec<PruneBlocker>,
    horizon_holders: Vec<HorizonHolder>,
}

async fn collect(
    admin: &Admin,
    horizon_min_age: Duration,
    unworked_after: Duration,
) -> ringwork::Result<Status> {
    Ok(Status {
        schema: admin.schema().to_string(),
        at: Utc::now(),
        replica: admin.replica_status().await?,
        queues: admin.queue_counts(None).await?,
        unworked: admin.unworked_queues(unworked_after).await?,
        rings: admin.ring_slots().await?,
        prune_blockers: admin.prune_blockers().await?,
        horizon_holders: admin.horizon_holders(horizon_min_age).await?,
    })
}

/// Print the status once, or every `watch` until interrupted.
async fn print_status(
    admin: &Admin,
    json: bool,
    watch: Option<Duration>,
    horizon_min_age: Duration,
    unworked_after: Duration,
) -> ringwork::Result<()> {
    loop {
        let status = collect(admin, horizon_min_age, unworked_after).await?;
        if json {
            println!(
                "{}",
                serde_json::to_string(&status).map_err(|e| ringwork::Error::Config(format!(
                    "status is not representable as JSON: {e}"
                )))?
            );
        } else {
            if watch.is_some() {
                // clear the screen and go home, as watch(1) does
                print!("\x1b[2J\x1b[H");
            }
            print!("{}", render(&status, horizon_min_age, unworked_after));
        }
        match watch {
            Some(every) => tokio::time::sleep(every).await,
            None => return Ok(()),
        }
    }
}

/// The per-queue counts as a table, each line starting with `indent`; `ringwork counts` prints the
/// same table.
pub fn counts_table(queues: &[QueueCounts], indent: &str) -> String {
    let row = |cells: [&dyn std::fmt::Display; 12]| {
        format!(
            "{indent}{:<20} {:>6} {:>10} {:>10} {:>10} {:>8} {:>8} {:>8} {:>10} {:>8} {:>10} {:>6}\n",
            cells[0],
            cells[1],
            cells[2],
            cells[3],
            cells[4],
            cells[5],
            cells[6],
            cells[7],
            cells[8],
            cells[9],
            cells[10],
            cells[11]
        )
    };
    let mut out = row([
        &"queue",
        &"paused",
        &"available",
        &"scheduled",
        &"retryable",
        &"running",
        &"waiting",
        &"pending",
        &"completed",
        &"failed",
        &"cancelled",
        &"dlq",
    ]);
    if queues.is_empty() {
        out.push_str(&format!("{indent}(no queues)\n"));
    }
    for c in queues {
        out.push_str(&row([
            &c.queue,
            &if c.paused { "yes" } else { "no" },
            &c.available,
            &c.scheduled,
            &c.retryable,
            &c.running,
            &c.waiting,
            &c.pending,
            &c.completed,
            &c.failed,
            &c.cancelled,
            &c.dead_lettered,
        ]));
    }
    out
}

fn render(s: &Status, horizon_min_age: Duration, unworked_after: Duration) -> String {
    let mut out = format!(
        "ringwork status: schema {} at {}\n\nqueues\n",
        s.schema,
        s.at.format("%Y-%m-%d %H:%M:%S UTC")
    );
    if let Some(replica) = &s.replica {
        // locks and horizons are per server: the standby's own sessions, not the primary's
        out.insert_str(
            out.len() - "\nqueues\n".len(),
            &format!(
                "{}\n(prune blockers and horizon holders below are the standby's own sessions)\n",
                replica.describe()
            ),
        );
    }
    out.push_str(&counts_table(&s.queues, "  "));
    out.push_str(&format!(
        "\nnot worked (available jobs waiting {} or more, no claim for as long)\n",
        humantime::format_duration(unworked_after)
    ));
    if s.unworked.is_empty() {
        out.push_str("  none\n");
    }
    for u in &s.unworked {
        let claimed = match u.last_claim_age {
            Some(ago) => format!("last claimed {} ago", age_of(ago)),
            None => "no claim in the ring".to_string(),
        };
        out.push_str(&format!(
            "  {}: {} available, the oldest waiting {}, {claimed}: is a worker declaring this queue running?\n",
            u.queue,
            u.available,
            age_of(u.oldest_wait)
        ));
    }
    out.push_str("\nrings\n");
    for ring in ["queue", "claim"] {
        let slots: Vec<&RingSlot> = s.rings.iter().filter(|r| r.ring == ring).collect();
        let count = |state: &str| slots.iter().filter(|r| r.state == state).count();
        let current = slots
            .iter()
            .find(|r| r.state == "current")
            .map(|r| format!("slot {} (generation {})", r.slot, r.generation))
            .unwrap_or_else(|| "none".into());
        out.push_str(&format!(
            "  {ring} ring: current {current}, {} sealed, {} free\n",
            count("sealed"),
            count("free")
        ));
        for r in slots.iter().filter(|r| r.state == "sealed") {
            let since = r
                .state_since
                .map(|t| format!(" for {}", age(s.at - t)))
                .unwrap_or_default();
            let why = r
                .blocker
                .as_deref()
                .unwrap_or("provable (prunes at the next tick unless a lock holder is in the way)");
            out.push_str(&format!("    sealed slot {}{since}: {why}\n", r.slot));
        }
    }
    out.push_str("\nprune blockers\n");
    if s.prune_blockers.is_empty() {
        out.push_str("  none: no backend holds a lock on a sealed slot or an archive bucket\n");
    }
    for b in &s.prune_blockers {
        out.push_str(&format!(
            "  {} slot {}: pid {} ({}) {}, transaction open {:.1} s, {}: {}\n",
            b.ring,
            b.slot,
            b.pid,
            b.application.as_deref().unwrap_or_default(),
            b.backend_state.as_deref().unwrap_or_default(),
            b.xact_age_secs.unwrap_or(0.0),
            b.lock_modes,
            b.query.as_deref().unwrap_or_default().replace('\n', " ")
        ));
    }
    out.push_str(&format!(
        "\nhorizon holders (transactions open {} s or more, replication slots, prepared transactions)\n",
        horizon_min_age.as_secs()
    ));
    if s.horizon_holders.is_empty() {
        out.push_str("  none\n");
    }
    for h in &s.horizon_holders {
        let held = h
            .held_since
            .map(|t| format!(", held {}", age(s.at - t)))
            .unwrap_or_default();
        out.push_str(&format!(
            "  {} {}: {} user {} app {} from {}{held}, xmin age {} transactions{}\n",
            h.kind,
            h.holder,
            h.backend_state.as_deref().unwrap_or("-"),
            h.usename.as_deref().unwrap_or("-"),
            h.application.as_deref().unwrap_or("-"),
            h.client.as_deref().unwrap_or("-"),
            h.xmin_age
                .map(|a| a.to_string())
                .unwrap_or_else(|| "-".into()),
            h.query
                .as_deref()
                .map(|q| format!(": {}", q.replace('\n', " ")))
                .unwrap_or_default()
        ));
    }
    out
}

fn age_of(d: Duration) -> String {
    age(chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX))
}

fn age(d: chrono::Duration) -> String {
    let secs = d.num_seconds().max(0);
    match secs {
        s if s < 120 => format!("{s} s"),
        s if s < 7200 => format!("{} min", s / 60),
        s => format!("{:.1} h", s as f64 / 3600.0),
    }
}
