//! Periodic jobs: schedules declared in code (a cron expression in an IANA time zone, or a fixed
//! interval), fired by the maintenance leader, each fire exactly once across leader failovers.
//!
//! A fire is keyed by the schedule's name and its fire time: the leader inserts the fire's job and
//! a `periodic_fires` row in one transaction, and the row's primary key refuses a second insert of
//! the same fire (a fenced leader overlapping its successor). Fire times are a function of the
//! schedule alone (an interval's fires are multiples of it since the Unix epoch), so every process
//! computes the same ones.

use std::time::Duration;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use tracing::warn;

use crate::error::{Error, Result};
use crate::job::{validate_name, NewJob};
use crate::storage::Storage;

/// What a schedule does about fires it missed (no leader, the schedule paused, a deploy).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum MissedFires {
    /// Fire once for the most recent missed time, not for the ones before it.
    #[default]
    Skip,
    /// Fire for each missed time, oldest first, at most the `max` most recent ones.
    CatchUp { max: u32 },
}

#[derive(Clone, Debug)]
enum When {
    Cron {
        pattern: String,
        cron: Box<croner::Cron>,
        time_zone: Tz,
    },
    Every(Duration),
}

/// A job enqueued on a schedule (`ClientBuilder::periodic`).
#[derive(Clone, Debug)]
pub struct Periodic {
    name: String,
    when: When,
    job: NewJob,
    missed: MissedFires,
}

/// The most fires one schedule computes in one pass (a catch-up cap above it is cut to it).
const MAX_FIRES_PER_PASS: usize = 1000;

impl Periodic {
    /// Fire `job` at the times of a cron `pattern` (5 fields, or 6 with seconds first) in the IANA
    /// `time_zone` (`"UTC"`, `"Europe/Stockholm"`). `name` identifies the schedule across
    /// processes and deploys: fires are recorded under it.
    pub fn cron(name: &str, pattern: &str, time_zone: &str, job: NewJob) -> Result<Self> {
        validate_name("schedule name", name)?;
        job.validate()?;
        let cron = croner::parser::CronParser::builder()
            .seconds(croner::parser::Seconds::Optional)
            .build()
            .parse(pattern)
            .map_err(|e| {
                Error::Config(format!(
                    "schedule {name:?}: cron pattern {pattern:?} does not parse: {e}"
                ))
            })?;
        let time_zone: Tz = time_zone.parse().map_err(|_| {
            Error::Config(format!(
                "schedule {name:?}: unknown time zone {time_zone:?} (an IANA name such as \"Europe/Stockholm\")"
            ))
        })?;
        Ok(Self {
            name: name.to_string(),
            when: When::Cron {
                pattern: pattern.to_string(),
                cron: Box::new(cron),
                time_zone,
            },
            job,
            missed: MissedFires::default(),
        })
    }

    /// Fire `job` every `interval` (at least one second), at the multiples of it since the Unix
    /// epoch (every 5 min fires at :00, :05, ...).
    pub fn every(name: &str, interval: Duration, job: NewJob) -> Result<Self> {
        validate_name("schedule name", name)?;
        job.validate()?;
        if interval < Duration::from_secs(1) || interval > Duration::from_secs(366 * 24 * 3600) {
            return Err(Error::Config(format!(
                "schedule {name:?}: interval must be 1 s to a year, got {interval:?}"
            )));
        }
        Ok(Self {
            name: name.to_string(),
            when: When::Every(interval),
            job,
            missed: MissedFires::default(),
        })
    }

    /// What to do about missed fires (default `MissedFires::Skip`).
    pub fn missed(mut self, policy: MissedFires) -> Self {
        self.missed = policy;
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The cron pattern and time zone, or the interval, in words.
    pub fn describe(&self) -> String {
        match &self.when {
            When::Cron {
                pattern, time_zone, ..
            } => format!("cron {pattern:?} in {time_zone}"),
            When::Every(interval) => format!("every {interval:?}"),
        }
    }

    /// The first fire time strictly after `t`.
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match &self.when {
            When::Cron {
                cron, time_zone, ..
            } => cron
                .find_next_occurrence(&t.with_timezone(time_zone), false)
                .ok()
                .map(|at| at.with_timezone(&Utc)),
            When::Every(interval) => {
                let step = interval.as_millis() as i64;
                let next = (t.timestamp_millis().div_euclid(step) + 1) * step;
                DateTime::from_timestamp_millis(next)
            }
        }
    }

    /// The fire times in `(after, until]` this schedule's missed-fire policy keeps, oldest first.
    fn due(&self, after: DateTime<Utc>, until: DateTime<Utc>) -> Vec<DateTime<Utc>> {
        let mut times = Vec::new();
        let mut t = after;
        while let Some(next) = self.next_after(t) {
            if next > until {
                break;
            }
            times.push(next);
            if times.len() > MAX_FIRES_PER_PASS {
                times.remove(0);
            }
            t = next;
        }
        let keep = match self.missed {
            MissedFires::Skip => 1,
            MissedFires::CatchUp { max } => (max as usize).max(1),
        };
        let skip = times.len().saturating_sub(keep);
        times.split_off(skip)
    }
}

/// One leader pass over the schedules: fire what is due since each one's last recorded fire (or,
/// for a schedule that never fired, since `since`: when this process became leader).
pub(crate) async fn fire_due(storage: &Storage, schedules: &[Periodic], since: DateTime<Utc>) {
    let now = Utc::now();
    for schedule in schedules {
        let (last, paused) = match storage.periodic_state(&schedule.name).await {
            Ok(state) => state,
            Err(e) => {
                warn!(schedule = %schedule.name, error = %e, "periodic: cannot read the schedule's state");
                continue;
            }
        };
        if paused {
            continue;
        }
        for fire_at in schedule.due(last.unwrap_or(since), now) {
            match storage
                .fire_periodic(&schedule.name, fire_at, &schedule.job)
                .await
            {
                Ok(Some(job_id)) => {
                    tracing::debug!(schedule = %schedule.name, %fire_at, job_id, "periodic: fired")
                }
                Ok(None) => {} // fired already, by an overlapping leader
                Err(e) => {
                    warn!(schedule = %schedule.name, %fire_at, error = %e, "periodic: fire failed; retried next tick");
                    break;
                }
            }
        }
    }
}
