//! `ringwork maintain`: one maintenance pass by hand.

use std::time::Duration;

use ringwork::{schema, Admin, MaintenanceConfig};

use super::{connect, duration, schema_name, Result};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    db: super::Db,
    /// Time without heartbeat or completion before a claim is rescued (seconds, or 30s, 1m; at
    /// least the library's minimum). Use the same value as your workers, or this pass may
    /// rescue their live long jobs.
    #[arg(long, default_value = "60", value_parser = duration, allow_hyphen_values = true)]
    stale_after: Duration,
}

pub async fn run(args: Args) -> Result<()> {
    if args.stale_after < MaintenanceConfig::MIN_STALE_AFTER {
        return Err(ringwork::Error::Config(format!(
            "--stale-after must be at least {} (got {}): a shorter one rescues jobs that are running",
            humantime::format_duration(MaintenanceConfig::MIN_STALE_AFTER),
            humantime::format_duration(args.stale_after)
        ))
        .into());
    }
    let schema = schema_name(&args.db.schema)?;
    let pool = connect(&args.db.database_url, 2).await?;
    let mut conn = pool.acquire().await?;
    let version = schema::installed_version(&mut conn, &schema).await?;
    schema::check_not_newer(&schema, version)?;
    drop(conn);
    let admin = Admin::new(pool, schema.as_str())?;
    let config = MaintenanceConfig {
        rotate_interval: Duration::ZERO,
        stale_after: args.stale_after,
        ..MaintenanceConfig::default()
    };
    let r = admin.run_maintenance(&config).await?;
    let slots = |s: &[i32]| {
        if s.is_empty() {
            "none".to_string()
        } else {
            s.iter()
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    println!(
        "rotated: queue ring {}, claim ring {}, lease ring {}",
        if r.rotated_queue { "yes" } else { "no" },
        if r.rotated_claim { "yes" } else { "no" },
        r.lease_ring
    );
    println!(
        "pruned: queue slots {}; claim slots {}",
        slots(&r.pruned_queue_slots),
        slots(&r.pruned_claim_slots)
    );
    println!(
        "promoted {}, rescued {}, callbacks timed out {}, dead letters expired {}, unique keys expired {}, archive buckets truncated {}, totals buckets folded {}",
        r.promoted,
        r.rescued,
        r.callbacks_timed_out,
        r.dlq_expired,
        r.unique_keys_expired,
        r.archive_buckets_truncated,
        r.totals_buckets_folded
    );
    for (ring, reason) in &r.prune_skips {
        println!("left for a later pass: {ring} ring, {reason}");
    }
    Ok(())
}
