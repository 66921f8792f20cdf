//! `ringwork ring`: both rings' slots and what holds prune back.

use super::Result;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    db: super::Db,
}

pub async fn run(args: Args) -> Result<()> {
    let admin = args.db.open().await?;
    println!(
        "{:<6} {:>4} {:>10} {:<8} {:<25} blocker",
        "ring", "slot", "generation", "state", "since"
    );
    for s in admin.ring_slots().await? {
        println!(
            "{:<6} {:>4} {:>10} {:<8} {:<25} {}",
            s.ring,
            s.slot,
            s.generation,
            s.state,
            s.state_since
                .map(|t| t.format("%Y-%m-%d %H:%M:%S%.3f").to_string())
                .unwrap_or_else(|| "-".into()),
            s.blocker.unwrap_or_default()
        );
    }
    let blockers = admin.prune_blockers().await?;
    if blockers.is_empty() {
        println!("\nno backend holds a lock on a sealed slot or an archive bucket");
    } else {
        println!("\nlocks that make prune (or archive retention) give up:");
        for b in blockers {
            println!(
                "  {} slot {:>2}: pid {} ({}) {}, transaction open {:.1} s, {}: {}",
                b.ring,
                b.slot,
                b.pid,
                b.application.unwrap_or_default(),
                b.backend_state.unwrap_or_default(),
                b.xact_age_secs.unwrap_or(0.0),
                b.lock_modes,
                b.query.unwrap_or_default().replace('\n', " ")
            );
        }
    }
    Ok(())
}
