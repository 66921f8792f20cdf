//! Periodic jobs: schedules declared in code (a cron expression in an IANA time zone, or a fixed
//! interval), each fire enqueued exactly once, whichever processes evaluate it and whenever they
//! fail.
//!
//! Every process that declares schedules evaluates them each maintenance tick (not only the
//! maintenance leader: the leader may be a process that declares none, such as `ringwork serve`
//! or a producer-only service, and schedules must not stop while it leads). A fire is keyed by the
//! schedule's name and its fire time: one process takes the schedule's try-lock, checks the fire is
//! not recorded, and inserts the fire's job and its `periodic_fires` row in one transaction; the
//! row's primary key refuses a second insert of the same fire in any case. Fire times are a
//! function of the schedule alone, in whole seconds (an interval's fires are multiples of it since
//! the Unix epoch), so every process computes the same ones.

use std::time::Duration;

use chrono::{DateTime, SubsecRound, Utc};
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
    CatchUp {
        /// The most missed fires to make up for (the most recent ones).
        max: u32,
    },
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

impl When {
    fn cron(pattern: &str, time_zone: &str) -> std::result::Result<Self, String> {
        let cron = croner::parser::CronParser::builder()
            .seconds(croner::parser::Seconds::Optional)
            .build()
            .parse(pattern)
            .map_err(|e| format!("cron pattern {pattern:?} does not parse: {e}"))?;
        let time_zone: Tz = time_zone.parse().map_err(|_| {
            format!("unknown time zone {time_zone:?} (an IANA name such as \"Europe/Stockholm\")")
        })?;
        Ok(When::Cron {
            pattern: pattern.to_string(),
            cron: Box::new(cron),
            time_zone,
        })
    }

    fn describe(&self) -> String {
        match self {
            When::Cron {
                pattern, time_zone, ..
            } => format!("cron {pattern:?} in {time_zone}"),
            When::Every(interval) => format!("every {interval:?}"),
        }
    }

    fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let t = t.trunc_subsecs(0);
        match self {
            When::Cron {
                pattern,
                cron,
                time_zone,
            } => LocalCron::new(cron, *time_zone, pattern).next_after(t),
            When::Every(interval) => {
                let step = interval.as_millis() as i64;
                let next = (t.timestamp_millis().div_euclid(step) + 1) * step;
                DateTime::from_timestamp_millis(next)
            }
        }
    }
}

/// A stored definition (`periodic_definitions`) read back.
pub(crate) struct StoredSchedule(When);

impl StoredSchedule {
    /// `None` for a row that does not read as a schedule (written by another version).
    pub(crate) fn read(
        pattern: Option<&str>,
        time_zone: Option<&str>,
        interval_ms: Option<i64>,
    ) -> Option<Self> {
        match (pattern, time_zone, interval_ms) {
            (Some(pattern), Some(time_zone), None) => When::cron(pattern, time_zone).ok().map(Self),
            (None, None, Some(ms)) if ms > 0 => {
                Some(Self(When::Every(Duration::from_millis(ms as u64))))
            }
            _ => None,
        }
    }

    pub(crate) fn describe(&self) -> String {
        self.0.describe()
    }

    pub(crate) fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.0.next_after(t)
    }
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
        let when = When::cron(pattern, time_zone)
            .map_err(|e| Error::Config(format!("schedule {name:?}: {e}")))?;
        let schedule = Self {
            name: name.to_string(),
            when,
            job,
            missed: MissedFires::default(),
        };
        if schedule.next_after(Utc::now()).is_none() {
            return Err(Error::Config(format!(
                "schedule {name:?}: cron pattern {pattern:?} never fires"
            )));
        }
        Ok(schedule)
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

    /// The schedule's name, which keys its fires.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The cron pattern and time zone, or the interval, in words.
    pub fn describe(&self) -> String {
        self.when.describe()
    }

    /// The first fire time strictly after `t`.
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.when.next_after(t)
    }

    /// The definition as `periodic_definitions` keeps it: (cron pattern, time zone, interval in
    /// milliseconds), one form set.
    pub(crate) fn stored(&self) -> (Option<&str>, Option<String>, Option<i64>) {
        match &self.when {
            When::Cron {
                pattern, time_zone, ..
            } => (
                Some(pattern.as_str()),
                Some(time_zone.name().to_string()),
                None,
            ),
            When::Every(interval) => (None, None, Some(interval.as_millis() as i64)),
        }
    }

    /// The last fire time at or before `t` (`inclusive`), or strictly before it.
    fn previous(&self, t: DateTime<Utc>, inclusive: bool) -> Option<DateTime<Utc>> {
        match &self.when {
            When::Cron {
                pattern,
                cron,
                time_zone,
            } => LocalCron::new(cron, *time_zone, pattern).previous(t.trunc_subsecs(0), inclusive),
            When::Every(interval) => {
                let step = interval.as_millis() as i64;
                let ms = t.timestamp_millis();
                let floor = ms.div_euclid(step) * step;
                let at = if floor == ms && !inclusive {
                    floor - step
                } else {
                    floor
                };
                DateTime::from_timestamp_millis(at)
            }
        }
    }

    /// The fire times to fire now, oldest first: every time in `(after, until]` that came due after
    /// `last_pass` (this process's previous evaluation: those are on time), and of the ones due
    /// before it (missed: no process evaluated the schedule then, or it was paused) what the
    /// missed-fire policy keeps. Walks back from `until`, so a long gap costs no more than what
    /// it keeps.
    fn due(
        &self,
        after: DateTime<Utc>,
        last_pass: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Vec<DateTime<Utc>> {
        let keep_missed = match self.missed {
            MissedFires::Skip => 1,
            MissedFires::CatchUp { max } => (max as usize).max(1),
        };
        let mut times = Vec::new();
        let mut missed = 0;
        let mut t = until.trunc_subsecs(0);
        let mut inclusive = true;
        while times.len() < MAX_FIRES_PER_PASS {
            let Some(at) = self.previous(t, inclusive).filter(|at| *at > after) else {
                break;
            };
            if at <= last_pass {
                if missed == keep_missed {
                    break;
                }
                missed += 1;
            }
            times.push(at);
            t = at;
            inclusive = false;
        }
        times.reverse();
        times
    }
}

/// A cron pattern read in a time zone's wall-clock time, with the daylight-saving rules of Vixie
/// cron (and most cron daemons):
/// - a time in an hour that repeats (fall back) fires once, at its first occurrence, unless the
///   pattern's hour field is a wildcard (`*`, `*/2`, `@hourly`): such a pattern fires in real time,
///   so it fires in both passes of the hour;
/// - a time in an hour that is skipped (spring forward) fires once, shifted by the gap (02:30
///   becomes 03:30), unless the hour field is a wildcard: its real times after the gap cover it.
///
/// The pattern is matched on naive local times (croner in UTC, a zone without transitions), and
/// each match is mapped to its instants here, so that the mapping, not croner's own handling of
/// transitions, decides. (croner 3 skipped the second pass of a repeated hour for `*/30 * * * *`
/// and fired a skipped 02:00 at 01:59.)
struct LocalCron<'a> {
    cron: &'a croner::Cron,
    zone: Tz,
    repeats_hourly: bool,
}

/// How far a time-zone transition can move a wall clock (real zones: at most two hours), with a
/// margin: near a transition, matches this far on the other side of `t` are looked at too.
const TRANSITION_WINDOW: chrono::Duration = chrono::Duration::hours(3);
/// The most matches one look-up walks near a transition (a per-second pattern over the window).
const MAX_MATCHES_WALKED: usize = 4 * 3600;

impl<'a> LocalCron<'a> {
    fn new(cron: &'a croner::Cron, zone: Tz, pattern: &str) -> Self {
        let fields: Vec<&str> = pattern.split_whitespace().collect();
        let hour = match fields.len() {
            5 => Some(fields[1]),
            6 => Some(fields[2]),
            _ => None,
        };
        let repeats_hourly = match hour {
            Some(hour) => hour.starts_with('*'),
            None => {
                let alias = pattern.trim().to_ascii_lowercase();
                alias == "@hourly" || alias == "@minutely"
            }
        };
        Self {
            cron,
            zone,
            repeats_hourly,
        }
    }

    fn offset_at(&self, t: DateTime<Utc>) -> i32 {
        use chrono::{Offset, TimeZone};
        self.zone
            .offset_from_utc_datetime(&t.naive_utc())
            .fix()
            .local_minus_utc()
    }

    fn local(&self, t: DateTime<Utc>) -> chrono::NaiveDateTime {
        t.with_timezone(&self.zone).naive_local()
    }

    /// The instants a wall-clock match fires at, earliest first (none, one or two).
    fn instants(&self, local: chrono::NaiveDateTime) -> Vec<DateTime<Utc>> {
        use chrono::{LocalResult, Offset, TimeZone};
        match self.zone.from_local_datetime(&local) {
            LocalResult::Single(at) => vec![at.with_timezone(&Utc)],
            LocalResult::Ambiguous(a, b) => {
                let (a, b) = (a.with_timezone(&Utc), b.with_timezone(&Utc));
                let (first, second) = if a <= b { (a, b) } else { (b, a) };
                if self.repeats_hourly {
                    vec![first, second]
                } else {
                    vec![first]
                }
            }
            LocalResult::None if self.repeats_hourly => Vec::new(),
            LocalResult::None => {
                // shifted by the gap: read with the offset in force before it
                let before = self
                    .zone
                    .offset_from_utc_datetime(&(local - chrono::Duration::days(1)))
                    .fix()
                    .local_minus_utc();
                vec![Utc.from_utc_datetime(&(local - chrono::Duration::seconds(before as i64)))]
            }
        }
    }

    fn naive_step(
        &self,
        from: chrono::NaiveDateTime,
        forward: bool,
        inclusive: bool,
    ) -> Option<chrono::NaiveDateTime> {
        use chrono::TimeZone;
        let from = Utc.from_utc_datetime(&from);
        let found = if forward {
            self.cron.find_next_occurrence(&from, inclusive)
        } else {
            self.cron.find_previous_occurrence(&from, inclusive)
        };
        found.ok().map(|at| at.naive_utc())
    }

    /// How far the wall clock jumps within TRANSITION_WINDOW of `t` (zero away from transitions).
    /// Within it, wall-clock order and real order can differ: a match up to this far on the other
    /// side of the best one found may still fire closer to `t`.
    fn jump_near(&self, t: DateTime<Utc>) -> chrono::Duration {
        let now = self.offset_at(t);
        let before = (self.offset_at(t - TRANSITION_WINDOW) - now).abs();
        let after = (self.offset_at(t + TRANSITION_WINDOW) - now).abs();
        chrono::Duration::seconds(before.max(after) as i64)
    }

    /// The last fire at or before `t` (`inclusive`), or strictly before it.
    fn previous(&self, t: DateTime<Utc>, inclusive: bool) -> Option<DateTime<Utc>> {
        let jump = self.jump_near(t);
        let mut from = self.local(t) + jump;
        let mut first = true;
        let mut best: Option<(DateTime<Utc>, chrono::NaiveDateTime)> = None;
        for _ in 0..MAX_MATCHES_WALKED {
            let Some(local) = self.naive_step(from, false, first) else {
                break;
            };
            let latest = self
                .instants(local)
                .into_iter()
                .filter(|at| *at < t || (inclusive && *at == t))
                .max();
            if let Some(at) = latest.filter(|at| best.is_none_or(|(b, _)| *at > b)) {
                best = Some((at, local));
            }
            if best.is_some_and(|(_, best_local)| local <= best_local - jump) {
                break;
            }
            from = local;
            first = false;
        }
        best.map(|(at, _)| at.trunc_subsecs(0))
    }

    /// The first fire strictly after `t`.
    fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let jump = self.jump_near(t);
        let mut from = self.local(t) - jump;
        let mut best: Option<(DateTime<Utc>, chrono::NaiveDateTime)> = None;
        for _ in 0..MAX_MATCHES_WALKED {
            let Some(local) = self.naive_step(from, true, false) else {
                break;
            };
            let earliest = self.instants(local).into_iter().filter(|at| *at > t).min();
            if let Some(at) = earliest.filter(|at| best.is_none_or(|(b, _)| *at < b)) {
                best = Some((at, local));
            }
            if best.is_some_and(|(_, best_local)| local >= best_local + jump) {
                break;
            }
            from = local;
        }
        best.map(|(at, _)| at.trunc_subsecs(0))
    }
}

/// Evaluate `schedules` every `tick` until `stop`: fire what is due since each one's last recorded
/// fire (for a schedule that never fired: since this process started evaluating).
pub(crate) async fn run(
    storage: Storage,
    schedules: std::sync::Arc<[Periodic]>,
    tick: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    // Fire times are taken on the engine's clock, never the host's: every process of a fleet then
    // agrees on what is due whatever its host's clock says, and a test clock moves schedules too.
    let mut started: Option<DateTime<Utc>> = None;
    let mut last_pass: Option<DateTime<Utc>> = None;
    let mut missed_passes = false;
    let mut declared = false;
    loop {
        // the definitions, for readers' next fire: once, retried each tick until it is written
        if !declared {
            match storage.declare_schedules(&schedules).await {
                Ok(_) => declared = true,
                Err(e) => {
                    warn!(error = %e, "periodic: cannot record the schedules' definitions; retried next tick")
                }
            }
        }
        match storage.engine_now().await {
            Ok(now) => {
                let first = *started.get_or_insert(now.trunc_subsecs(0));
                // after passes that could not read the clock (the database unreachable), what
                // came due meanwhile is missed, as after any outage: the schedule's policy
                // decides, rather than every fire of the outage firing as if on time
                let since = if missed_passes {
                    now
                } else {
                    last_pass.unwrap_or(first)
                };
                fire_due(&storage, &schedules, first, since, now).await;
                last_pass = Some(now);
                missed_passes = false;
            }
            Err(e) => {
                missed_passes = true;
                warn!(error = %e, "periodic: cannot read the engine's clock; retried next tick")
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(tick) => {}
            _ = stop.changed() => return,
        }
    }
}

/// One pass over the schedules.
async fn fire_due(
    storage: &Storage,
    schedules: &[Periodic],
    started: DateTime<Utc>,
    last_pass: DateTime<Utc>,
    now: DateTime<Utc>,
) {
    // triggers first (`ringwork cron trigger`): one probe for all schedules; a paused schedule's
    // trigger still fires, since an operator asked for it by name
    let names: Vec<&str> = schedules.iter().map(|s| s.name.as_str()).collect();
    match storage.triggered_schedules(&names).await {
        Ok(triggered) => {
            for schedule in schedules.iter().filter(|s| triggered.contains(&s.name)) {
                match storage.fire_trigger(&schedule.name, &schedule.job).await {
                    Ok(Some(job_id)) => {
                        tracing::info!(schedule = %schedule.name, job_id, "periodic: fired on trigger")
                    }
                    Ok(None) => {} // another process fired it
                    Err(e) => {
                        warn!(schedule = %schedule.name, error = %e, "periodic: trigger failed; retried next tick")
                    }
                }
            }
        }
        Err(e) => warn!(error = %e, "periodic: cannot read pending triggers"),
    }
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
        for fire_at in schedule.due(last.unwrap_or(started), last_pass, now) {
            match storage
                .fire_periodic(&schedule.name, fire_at, &schedule.job)
                .await
            {
                Ok(Some(job_id)) => {
                    tracing::debug!(schedule = %schedule.name, %fire_at, job_id, "periodic: fired")
                }
                Ok(None) => {} // fired already, or being fired by another process
                Err(e) => {
                    warn!(schedule = %schedule.name, %fire_at, error = %e, "periodic: fire failed; retried next tick");
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(s: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, s).unwrap()
    }

    fn job() -> NewJob {
        NewJob::from_parts("k", serde_json::json!({})).unwrap()
    }

    #[test]
    fn fires_due_since_the_last_pass_all_fire_and_only_missed_ones_follow_the_policy() {
        let every_second = Periodic::every("s", Duration::from_secs(1), job()).unwrap();
        // a slow pass: two fires came due since the previous one; Skip must not drop the older
        assert_eq!(every_second.due(at(10), at(10), at(12)), [at(11), at(12)]);
        // an outage: fired last at :10, and this process evaluated first at :19 (it started
        // then): :11..:19 were missed (Skip keeps :19), :20 came due on time
        assert_eq!(every_second.due(at(10), at(19), at(20)), [at(19), at(20)]);
        let catch_up = every_second.clone().missed(MissedFires::CatchUp { max: 3 });
        assert_eq!(
            catch_up.due(at(10), at(19), at(20)),
            [at(17), at(18), at(19), at(20)]
        );
        // nothing due
        assert!(every_second.due(at(20), at(20), at(20)).is_empty());
        // sub-seconds never leak into fire times
        let t = at(5) + chrono::Duration::milliseconds(300);
        let cron = Periodic::cron("c", "* * * * * *", "UTC", job()).unwrap();
        assert_eq!(cron.next_after(t), Some(at(6)));
        assert_eq!(cron.due(at(3), at(3), t), [at(4), at(5)]);
    }

    #[test]
    fn a_pattern_that_never_fires_is_refused() {
        assert!(matches!(
            Periodic::cron("feb30", "0 0 30 2 *", "UTC", job()),
            Err(Error::Config(msg)) if msg.contains("never fires")
        ));
    }

    /// Fire times over daylight-saving changes in New York (2026: spring forward 8 March 02:00 EST,
    /// fall back 1 November 02:00 EDT), as UTC "day hh:mm".
    fn fires_between(pattern: &str, from: DateTime<Utc>, until: DateTime<Utc>) -> Vec<String> {
        let p = Periodic::cron("dst", pattern, "America/New_York", job()).unwrap();
        let fired = p.due(from, from, until);
        // the same times forwards, one next_after at a time
        let mut forwards = Vec::new();
        let mut t = from;
        while let Some(next) = p.next_after(t).filter(|n| *n <= until) {
            forwards.push(next);
            t = next;
        }
        assert_eq!(fired, forwards, "{pattern}: backwards and forwards agree");
        fired
            .iter()
            .map(|t| t.format("%d %H:%M").to_string())
            .collect()
    }

    #[test]
    fn daylight_saving_changes_fire_fixed_times_once_and_wildcard_hours_in_real_time() {
        let utc = |m, d, h, min| Utc.with_ymd_and_hms(2026, m, d, h, min, 0).unwrap();
        // fall back: 01:00-01:59 happens twice (05:00-05:59 UTC as EDT, 06:00-06:59 as EST)
        assert_eq!(
            fires_between("0 1 * * *", utc(10, 31, 12, 0), utc(11, 2, 12, 0)),
            ["01 05:00", "02 06:00"],
            "a fixed time in the repeated hour fires once"
        );
        assert_eq!(
            fires_between("*/30 * * * *", utc(11, 1, 4, 10), utc(11, 1, 7, 10)),
            ["01 04:30", "01 05:00", "01 05:30", "01 06:00", "01 06:30", "01 07:00"],
            "every 30 minutes in real time through the repeated hour"
        );
        // spring forward: 02:00-02:59 does not happen
        assert_eq!(
            fires_between("30 2 * * *", utc(3, 7, 12, 0), utc(3, 9, 12, 0)),
            ["08 07:30", "09 06:30"],
            "a skipped time fires once, shifted by the gap (03:30 EDT)"
        );
        assert_eq!(
            fires_between("0 1 * * *", utc(3, 7, 12, 0), utc(3, 9, 12, 0)),
            ["08 06:00", "09 05:00"],
            "a time outside the gap fires once a day"
        );
        assert_eq!(
            fires_between("*/30 * * * *", utc(3, 8, 6, 10), utc(3, 8, 7, 40)),
            ["08 06:30", "08 07:00", "08 07:30"],
            "every 30 minutes in real time across the gap"
        );
        // seconds field, hourly alias
        assert_eq!(
            fires_between("@hourly", utc(11, 1, 4, 30), utc(11, 1, 7, 30)).len(),
            3
        );
    }
}
