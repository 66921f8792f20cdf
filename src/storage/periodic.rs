//! Periodic jobs: recording fires exactly once, pausing schedules, listing them
//! (`sql/functions/periodic.sql`).

use chrono::{DateTime, Utc};
use sqlx::Row;

use super::Storage;
use crate::error::Result;
use crate::job::NewJob;
use crate::periodic::Periodic;
use crate::schema::SchemaName;

/// This plane's statements, rendered once per schema.
#[derive(Debug)]
pub(super) struct Statements {
    engine_now: String,
    state: String,
    begin_fire: String,
    record_fire: String,
    set_paused: String,
    schedules: String,
    declare: String,
    forget: String,
    request_trigger: String,
    triggered: String,
    take_trigger: String,
}

impl Statements {
    pub(super) fn new(s: &SchemaName) -> Self {
        Self {
            engine_now: format!("SELECT {s}.engine_now()"),
            state: format!("SELECT last_fire_at, paused FROM {s}.periodic_state($1)"),
            begin_fire: format!("SELECT {s}.periodic_begin_fire($1, $2)"),
            record_fire: format!("SELECT {s}.periodic_record_fire($1, $2, $3)"),
            set_paused: format!("SELECT {s}.set_periodic_paused($1, $2)"),
            schedules: format!(
                "SELECT schedule, last_fire_at, last_job_id, fires, paused, cron_pattern, time_zone, \
                 interval_ms, declared_at, engine_now FROM {s}.periodic_schedules()"
            ),
            declare: format!("SELECT {s}.declare_periodic($1, $2, $3, $4)"),
            forget: format!("SELECT {s}.forget_periodic($1)"),
            request_trigger: format!("SELECT {s}.request_periodic_trigger($1)"),
            triggered: format!("SELECT {s}.periodic_triggered($1)"),
            take_trigger: format!("SELECT {s}.periodic_take_trigger($1)"),
        }
    }
}

/// A schedule as the database knows it: its definition, its fires and whether it is paused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduleRecord {
    /// The schedule's name.
    pub schedule: String,
    /// The fire time of its latest kept fire; `None` when none is kept (a paused schedule that
    /// never fired, or whose fires aged out).
    pub last_fire_at: Option<DateTime<Utc>>,
    /// The job that latest fire inserted.
    pub last_job_id: Option<i64>,
    /// Fires kept (about the last week).
    pub fires: i64,
    /// The schedule is paused: it fires only when triggered (`ringwork cron trigger`).
    pub paused: bool,
    /// Its definition in words (`cron "0 3 * * *" in UTC`, `every 300s`), as the processes that
    /// declare it recorded it when they started; `None` for a schedule no process of this version
    /// declared (it only fired, or is only paused).
    pub definition: Option<String>,
    /// When it fires next by its definition, on the engine's clock; `None` while paused, without
    /// a definition, or when it never fires again. A schedule fires only while a process that
    /// declares it runs.
    pub next_fire_at: Option<DateTime<Utc>>,
    /// A fire that came due more than a minute ago and was not made: no process that declares
    /// the schedule is running (or the schedule left the code). `None` while paused.
    pub overdue_since: Option<DateTime<Utc>>,
}

/// How late a fire may be before a schedule reads as overdue: processes evaluate schedules every
/// maintenance tick, so a minute covers a restart.
const OVERDUE_AFTER: chrono::Duration = chrono::Duration::minutes(1);

impl Storage {
    /// The time on the engine's clock (`sql/functions/clock.sql`): schedules come due by it, so
    /// that a test clock moves them as it moves every other plane's time.
    pub(crate) async fn engine_now(&self) -> Result<DateTime<Utc>> {
        Ok(sqlx::query_scalar(&self.sql.periodic.engine_now)
            .fetch_one(self.db())
            .await?)
    }

    /// The latest recorded fire of a schedule, and whether it is paused.
    pub(crate) async fn periodic_state(
        &self,
        schedule: &str,
    ) -> Result<(Option<DateTime<Utc>>, bool)> {
        Ok(sqlx::query_as(&self.sql.periodic.state)
            .bind(schedule)
            .fetch_one(self.db())
            .await?)
    }

    /// Insert `job` for the fire of `schedule` at `fire_at`, once: the job and the fire's record
    /// commit together; a fire recorded already, or being fired by another process right now,
    /// inserts nothing. Returns the job's id when this call fired it.
    pub(crate) async fn fire_periodic(
        &self,
        schedule: &str,
        fire_at: DateTime<Utc>,
        job: &NewJob,
    ) -> Result<Option<i64>> {
        let mut tx = self.pool.begin().await?;
        let ours: bool = sqlx::query_scalar(&self.sql.periodic.begin_fire)
            .bind(schedule)
            .bind(fire_at)
            .fetch_one(self.on(&mut tx))
            .await?;
        if !ours {
            tx.rollback().await?;
            return Ok(None);
        }
        let job_id = self.insert(&mut tx, job).await?;
        let recorded: bool = sqlx::query_scalar(&self.sql.periodic.record_fire)
            .bind(schedule)
            .bind(fire_at)
            .bind(job_id)
            .fetch_one(self.on(&mut tx))
            .await?;
        if recorded {
            tx.commit().await?;
            Ok(Some(job_id))
        } else {
            tx.rollback().await?;
            Ok(None)
        }
    }

    /// Ask for one fire of `schedule` now, beside its own fire times: the next evaluation pass of a
    /// process that declares the schedule inserts its job, once across the fleet. False: a trigger
    /// of it is pending already. A schedule no running process declares fires when one starts.
    pub async fn trigger_schedule(&self, schedule: &str) -> Result<bool> {
        if schedule.is_empty() || schedule.contains('\0') {
            return Err(crate::Error::Config(format!(
                "schedule name {schedule:?}: empty or contains a NUL byte"
            )));
        }
        Ok(sqlx::query_scalar(&self.sql.periodic.request_trigger)
            .bind(schedule)
            .fetch_one(self.db())
            .await?)
    }

    /// Of these schedules, the ones with a trigger pending.
    pub(crate) async fn triggered_schedules(&self, schedules: &[&str]) -> Result<Vec<String>> {
        Ok(sqlx::query_scalar(&self.sql.periodic.triggered)
            .bind(schedules)
            .fetch_all(self.db())
            .await?)
    }

    /// Fire a pending trigger of `schedule`: take it and insert `job` in one transaction. None: no
    /// trigger was pending (another process fired it).
    pub(crate) async fn fire_trigger(&self, schedule: &str, job: &NewJob) -> Result<Option<i64>> {
        let mut tx = self.pool.begin().await?;
        let taken: Option<DateTime<Utc>> = sqlx::query_scalar(&self.sql.periodic.take_trigger)
            .bind(schedule)
            .fetch_one(self.on(&mut tx))
            .await?;
        if taken.is_none() {
            tx.rollback().await?;
            return Ok(None);
        }
        let job_id = self.insert(&mut tx, job).await?;
        tx.commit().await?;
        Ok(Some(job_id))
    }

    /// Pause (or resume) a schedule: a paused schedule does not fire, and its missed fires are
    /// handled by its missed-fire policy when it is resumed. True when this changed something.
    pub async fn set_schedule_paused(&self, schedule: &str, paused: bool) -> Result<bool> {
        Ok(sqlx::query_scalar(&self.sql.periodic.set_paused)
            .bind(schedule)
            .bind(paused)
            .fetch_one(self.db())
            .await?)
    }

    /// Every schedule that is declared, has fired (in about the last week) or is paused.
    pub async fn schedules(&self) -> Result<Vec<ScheduleRecord>> {
        let rows = sqlx::query(&self.sql.periodic.schedules)
            .fetch_all(self.db())
            .await?;
        rows.into_iter()
            .map(|row| {
                let paused: bool = row.try_get("paused")?;
                let pattern: Option<String> = row.try_get("cron_pattern")?;
                let time_zone: Option<String> = row.try_get("time_zone")?;
                let interval_ms: Option<i64> = row.try_get("interval_ms")?;
                let declared_at: Option<DateTime<Utc>> = row.try_get("declared_at")?;
                let last_fire_at: Option<DateTime<Utc>> = row.try_get("last_fire_at")?;
                let now: DateTime<Utc> = row.try_get("engine_now")?;
                let stored = crate::periodic::StoredSchedule::read(
                    pattern.as_deref(),
                    time_zone.as_deref(),
                    interval_ms,
                );
                let (mut next_fire_at, mut overdue_since) = (None, None);
                if let (Some(stored), false) = (&stored, paused) {
                    next_fire_at = stored.next_after(now);
                    // the fire that should have followed the last one (or the declaration)
                    overdue_since = last_fire_at
                        .or(declared_at)
                        .and_then(|t| stored.next_after(t))
                        .filter(|due| *due < now - OVERDUE_AFTER);
                }
                Ok(ScheduleRecord {
                    schedule: row.try_get("schedule")?,
                    last_fire_at,
                    last_job_id: row.try_get("last_job_id")?,
                    fires: row.try_get("fires")?,
                    paused,
                    definition: stored.map(|s| s.describe()),
                    next_fire_at,
                    overdue_since,
                })
            })
            .collect()
    }

    /// Forget a schedule's recorded definition: a schedule that left the code stops reading as
    /// overdue. Its fires stay; a process that still declares it records it again when it
    /// starts. False when no definition was recorded.
    pub async fn forget_schedule(&self, schedule: &str) -> Result<bool> {
        Ok(sqlx::query_scalar(&self.sql.periodic.forget)
            .bind(schedule)
            .fetch_one(self.db())
            .await?)
    }

    /// Record the definitions of the schedules this process declares, for readers' next fire.
    /// Writes only rows that are new or changed; returns how many.
    pub async fn declare_schedules(&self, schedules: &[Periodic]) -> Result<i32> {
        let mut names = Vec::with_capacity(schedules.len());
        let mut patterns = Vec::with_capacity(schedules.len());
        let mut zones = Vec::with_capacity(schedules.len());
        let mut intervals = Vec::with_capacity(schedules.len());
        for schedule in schedules {
            let (pattern, zone, interval_ms) = schedule.stored();
            names.push(schedule.name());
            patterns.push(pattern);
            zones.push(zone);
            intervals.push(interval_ms);
        }
        Ok(sqlx::query_scalar(&self.sql.periodic.declare)
            .bind(&names)
            .bind(&patterns)
            .bind(&zones)
            .bind(&intervals)
            .fetch_one(self.db())
            .await?)
    }
}
