//! `ringwork cron`: periodic schedules' fires, pause, resume and trigger.

use super::{CliError, Result};

#[derive(clap::Subcommand)]
pub enum Action {
    /// Every schedule that a process declares, fired in about the last week, or is paused.
    List,
    /// Stop a schedule firing (in every process) until it is resumed.
    Pause {
        /// The schedule's name, as declared in code.
        schedule: String,
        /// Pause a schedule that has not fired yet (without it, a name `cron list` does not
        /// show is refused, so a typo does not leave a paused schedule behind).
        #[arg(long)]
        create: bool,
    },
    /// Let a paused schedule fire again.
    Resume {
        /// The schedule's name.
        schedule: String,
    },
    /// Forget a schedule's recorded definition: one that left the code stops reading as overdue
    /// (its fires stay; a process that still declares it records it again when it starts).
    Forget {
        /// The schedule's name.
        schedule: String,
    },
    /// Fire a schedule once now, beside its own fire times (a process that declares it inserts
    /// the job on its next evaluation pass, once across the fleet; paused or not).
    Trigger {
        /// The schedule's name.
        schedule: String,
    },
}

pub async fn run(args: super::Group<Action>) -> Result<()> {
    let admin = args.db.open().await?;
    let known = |schedules: &[ringwork::ScheduleRecord], name: &str| {
        schedules.iter().any(|s| s.schedule == name)
    };
    match args.action {
        Action::List => {
            println!("schedule\tpaused\tnext fire\tlast fire\tlast job\tfires kept\tdefined as");
            let time = |t: Option<chrono::DateTime<chrono::Utc>>| {
                t.map(|t| t.to_rfc3339()).unwrap_or_else(|| "-".into())
            };
            for s in admin.schedules().await? {
                println!(
                    "{}\t{}\t{}\t{}\t{}\t{}\t{}",
                    s.schedule,
                    s.paused,
                    match s.overdue_since {
                        Some(due) => format!("overdue since {}", due.to_rfc3339()),
                        None => time(s.next_fire_at),
                    },
                    time(s.last_fire_at),
                    s.last_job_id
                        .map(|id| id.to_string())
                        .unwrap_or_else(|| "-".into()),
                    s.fires,
                    s.definition.as_deref().unwrap_or("-")
                );
            }
        }
        Action::Pause { schedule, create } => {
            if !create && !known(&admin.schedules().await?, &schedule) {
                return Err(CliError::NotFound(format!(
                    "schedule {schedule:?} has not fired in the last week and is not paused; \
                     pass --create to pause it before its first fire"
                )));
            }
            let changed = admin.set_schedule_paused(&schedule, true).await?;
            println!(
                "schedule {schedule:?} {}",
                if changed {
                    "paused"
                } else {
                    "was paused already"
                }
            );
        }
        Action::Resume { schedule } => {
            if !known(&admin.schedules().await?, &schedule) {
                return Err(CliError::NotFound(format!(
                    "schedule {schedule:?} has not fired in the last week and is not paused"
                )));
            }
            let changed = admin.set_schedule_paused(&schedule, false).await?;
            println!(
                "schedule {schedule:?} {}",
                if changed {
                    "resumed (missed fires follow its policy)"
                } else {
                    "was not paused"
                }
            );
        }
        Action::Forget { schedule } => {
            if !admin.forget_schedule(&schedule).await? {
                return Err(CliError::NotFound(format!(
                    "no process has recorded a definition of schedule {schedule:?}"
                )));
            }
            println!("schedule {schedule:?}: its definition is forgotten");
        }
        Action::Trigger { schedule } => {
            let requested = admin.trigger_schedule(&schedule).await?;
            let known = known(&admin.schedules().await?, &schedule);
            println!(
                "schedule {schedule:?}: {}",
                if requested {
                    "triggered; a process that declares it fires it on its next pass"
                } else {
                    "a trigger is pending already"
                }
            );
            if !known {
                eprintln!(
                    "note: {schedule:?} has not fired in the last week; the trigger waits for a process that declares it"
                );
            }
        }
    }
    Ok(())
}
