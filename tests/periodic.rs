//! Periodic jobs: cron in a time zone or a fixed interval, evaluated by every
//! process that declares them and fired exactly once per fire time, also while processes race,
//! fail and leave; missed fires follow the schedule's policy; paused schedules do not fire; a
//! maintenance leader that declares no schedules (`ringwork serve`) does not stop them.

mod support;

use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use ringwork::{
    Client, Error, JobArgs, JobContext, JobError, MaintenanceConfig, MissedFires, NewJob, Periodic,
    QueueConfig,
};
use serde::{Deserialize, Serialize};
use support::TestDb;

#[derive(Serialize, Deserialize)]
struct Tick {}

impl JobArgs for Tick {
    const KIND: &'static str = "tick";
}

fn tick_job() -> NewJob {
    NewJob::new(&Tick {}).unwrap()
}

/// Fire times recorded for a schedule, oldest first, with how many jobs of kind `tick` exist.
async fn fires(db: &TestDb, schedule: &str) -> Vec<DateTime<Utc>> {
    sqlx::query_scalar(&format!(
        "SELECT fire_at FROM {}.periodic_fires WHERE schedule = $1 ORDER BY fire_at",
        db.schema
    ))
    .bind(schedule)
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

async fn client_with(db: &TestDb, schedules: Vec<Periodic>) -> Client {
    let mut builder = db
        .client()
        // a frozen or dead leader is taken over after 2 x stale_after
        .maintenance(MaintenanceConfig {
            stale_after: Duration::from_millis(600),
            ..support::fast_maintenance()
        })
        .queue("default", QueueConfig::default())
        .register(|_ctx: JobContext, _job: Tick| async { Ok::<(), JobError>(()) });
    for schedule in schedules {
        builder = builder.periodic(schedule);
    }
    builder.build().await.unwrap()
}

#[test]
fn cron_patterns_in_a_time_zone_and_intervals_give_the_expected_fire_times() {
    // 09:00 every day in New York is 14:00 UTC in winter, 13:00 in summer
    let nine = Periodic::cron("nine", "0 9 * * *", "America/New_York", tick_job()).unwrap();
    let winter = Utc.with_ymd_and_hms(2026, 1, 15, 12, 0, 0).unwrap();
    assert_eq!(
        nine.next_after(winter),
        Some(Utc.with_ymd_and_hms(2026, 1, 15, 14, 0, 0).unwrap())
    );
    let summer = Utc.with_ymd_and_hms(2026, 7, 15, 12, 0, 0).unwrap();
    assert_eq!(
        nine.next_after(summer),
        Some(Utc.with_ymd_and_hms(2026, 7, 15, 13, 0, 0).unwrap())
    );
    // six fields: seconds first
    let every_ten_s = Periodic::cron("ten", "*/10 * * * * *", "UTC", tick_job()).unwrap();
    let t = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 3).unwrap();
    assert_eq!(
        every_ten_s.next_after(t),
        Some(Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 10).unwrap())
    );
    // an interval fires at its multiples since the epoch, whoever computes it
    let five_min = Periodic::every("five", Duration::from_secs(300), tick_job()).unwrap();
    let t = Utc.with_ymd_and_hms(2026, 1, 1, 10, 7, 30).unwrap();
    assert_eq!(
        five_min.next_after(t),
        Some(Utc.with_ymd_and_hms(2026, 1, 1, 10, 10, 0).unwrap())
    );
    // bad input: clear errors
    for (result, words) in [
        (
            Periodic::cron("bad", "61 * * * *", "UTC", tick_job()),
            "does not parse",
        ),
        (
            Periodic::cron("bad", "0 9 * * *", "Mars/Olympus", tick_job()),
            "unknown time zone",
        ),
        (
            Periodic::every("bad", Duration::from_millis(10), tick_job()),
            "interval",
        ),
    ] {
        match result {
            Err(Error::Config(msg)) => assert!(msg.contains(words), "{msg}"),
            other => panic!("expected a config error with {words:?}: {other:?}"),
        }
    }
    assert!(matches!(
        Periodic::every("bad\0name", Duration::from_secs(1), tick_job()),
        Err(Error::InvalidName { .. })
    ));
}

/// The `pg_locks` rows of this database's maintenance leader lock, whose key is `$1` (a bigint
/// advisory key shows as classid = its high 32 bits, objid = its low 32 bits). Every test has a
/// database of its own with the same schema name, so the same key: the database tells them apart.
const LEADER_LOCK: &str = "locktype = 'advisory' AND granted AND objsubid = 1
    AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
    AND classid::int8 = ($1 >> 32) & 4294967295 AND objid::int8 = $1 & 4294967295";

/// Every job of kind `tick` ever inserted, in any state (completed is a durable total).
async fn tick_jobs(db: &TestDb) -> i64 {
    let counts = db.storage().queue_counts(Some("default")).await.unwrap();
    let c = &counts[0];
    c.available
        + c.scheduled
        + c.retryable
        + c.running
        + c.completed
        + c.failed
        + c.cancelled
        + c.dead_lettered
}

/// Record a fire of `schedule` at the start of the engine clock's current hour, with no job (as
/// if its job were long gone): the schedule's next fire is then the next hour's, whenever a
/// process first evaluates it.
async fn fired_this_hour(db: &TestDb, schedule: &str) {
    db.exec(&format!(
        "INSERT INTO {{s}}.periodic_fires (schedule, fire_at, job_id)
         SELECT '{schedule}', date_trunc('hour', {{s}}.engine_now()), 0"
    ))
    .await;
}

/// Move the engine clock one `period` on and wait until the schedule has fired at least `want`
/// times.
async fn advance_until_fired(db: &TestDb, schedule: &str, period: Duration, want: usize) {
    db.advance_clock(period).await;
    assert!(
        support::eventually(Duration::from_secs(20), || async {
            fires(db, schedule).await.len() >= want
        })
        .await,
        "{schedule}: fire {want} never came: {:?}",
        fires(db, schedule).await
    );
}

/// Three processes evaluate one schedule at once; the maintenance leader's connection is killed
/// mid-run, then the processes are shut down one after another. Every period in between fires
/// exactly once: no fire twice (one job per fire), and none lost. The schedule is hourly and the
/// engine clock moves an hour at a time, so each step makes one fire due.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_fires_once_per_period_across_racing_and_failing_leaders() {
    let db = TestDb::new().await;
    let hour = Duration::from_secs(3600);
    let schedule = || {
        Periodic::every("hourly", hour, tick_job())
            .unwrap()
            .missed(MissedFires::CatchUp { max: 60 })
    };
    fired_this_hour(&db, "hourly").await;
    let mut running = Vec::new();
    for _ in 0..3 {
        let client = client_with(&db, vec![schedule()]).await;
        running.push(client.start().await.unwrap());
    }
    let mut want = 1;
    for _ in 0..2 {
        want += 1;
        advance_until_fired(&db, "hourly", hour, want).await;
    }
    // a crash of the leader's session: its lock goes, another process takes over
    let key = ringwork::maintenance::leader_lock_key(&db.schema);
    let killed: i64 = sqlx::query_scalar(&format!(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_locks WHERE {LEADER_LOCK}"
    ))
    .bind(key)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(killed, 1, "one leader held the lock");
    for _ in 0..2 {
        want += 1;
        advance_until_fired(&db, "hourly", hour, want).await;
    }
    // graceful exits, one after another: the last one standing keeps firing
    for _ in 0..2 {
        running.remove(0).shutdown(Duration::from_secs(5)).await;
        want += 1;
        advance_until_fired(&db, "hourly", hour, want).await;
    }
    running.remove(0).shutdown(Duration::from_secs(5)).await;

    let times = fires(&db, "hourly").await;
    // the server's own clock may cross an hour boundary during the test: one fire more
    assert!(
        (want..=want + 1).contains(&times.len()),
        "fired {} times for {want} hours: {times:?}",
        times.len()
    );
    for pair in times.windows(2) {
        assert_eq!(
            pair[1] - pair[0],
            chrono::Duration::hours(1),
            "a fire was lost or doubled: {times:?}"
        );
    }
    // one job per fire (but the first, recorded by the test), so no job was left behind by a fire
    // another leader had recorded
    assert_eq!(
        tick_jobs(&db).await,
        times.len() as i64 - 1,
        "one job per fire"
    );
    db.cleanup().await;
}

#[tokio::test]
async fn missed_fires_follow_the_policy_and_a_paused_schedule_does_not_fire() {
    let db = TestDb::new().await;
    let minute = Duration::from_secs(60);
    let skip = Periodic::every("skip", minute, tick_job()).unwrap();
    let catch_up = Periodic::every("catch_up", minute, tick_job())
        .unwrap()
        .missed(MissedFires::CatchUp { max: 3 });
    let paused = Periodic::every("paused", minute, tick_job()).unwrap();
    // each last fired ten minutes ago (a long outage)
    let now = Utc::now();
    let ten_ago = skip
        .next_after(now - chrono::Duration::minutes(11))
        .unwrap();
    for name in ["skip", "catch_up", "paused"] {
        db.exec(&format!(
            "INSERT INTO {{s}}.periodic_fires (schedule, fire_at, job_id) VALUES ('{name}', '{}', 0)",
            ten_ago.to_rfc3339()
        ))
        .await;
    }
    let client = client_with(&db, vec![skip.clone(), catch_up, paused]).await;
    assert!(client
        .storage()
        .set_schedule_paused("paused", true)
        .await
        .unwrap());
    let started = Utc::now();
    let running = client.start().await.unwrap();
    // the first pass fires what was missed: one for skip, three for catch_up
    let after_outage =
        |times: Vec<DateTime<Utc>>| times.into_iter().filter(|t| *t > ten_ago).count();
    assert!(
        support::eventually(Duration::from_secs(20), || async {
            after_outage(fires(&db, "skip").await) >= 1
                && after_outage(fires(&db, "catch_up").await) >= 3
        })
        .await,
        "the missed fires were never made up"
    );
    running.shutdown(Duration::from_secs(5)).await;

    // the times due when the client started (one a minute since the last fire), and any that came
    // due while it ran (a minute boundary may pass during the run)
    let ended = Utc::now();
    let mut due_at_start = Vec::new();
    let mut came_due = Vec::new();
    let mut t = ten_ago;
    while let Some(next) = skip.next_after(t).filter(|n| *n <= ended) {
        if next <= started {
            due_at_start.push(next);
        } else {
            came_due.push(next);
        }
        t = next;
    }
    assert!(due_at_start.len() >= 10, "{due_at_start:?}");
    let new = |times: Vec<DateTime<Utc>>| -> Vec<DateTime<Utc>> {
        times.into_iter().filter(|t| *t > ten_ago).collect()
    };
    // The first pass ran at some time between `started` and `ended`: it made up the `kept` most
    // recent times due by then, and each later time fired on its own. A minute boundary may pass
    // before that first pass, so the times are the last `kept` to `kept + came_due` of all those
    // due, oldest first.
    let all_due: Vec<DateTime<Utc>> = due_at_start.iter().chain(&came_due).cloned().collect();
    let made_up = |got: Vec<DateTime<Utc>>, kept: usize| {
        assert!(
            (kept..=kept + came_due.len()).contains(&got.len())
                && got[..] == all_due[all_due.len() - got.len()..],
            "kept {kept}: {got:?}, due {due_at_start:?} then {came_due:?}"
        );
    };
    // skip: only the most recent due time
    made_up(new(fires(&db, "skip").await), 1);
    // catch up, at most 3: the three most recent, oldest first
    made_up(new(fires(&db, "catch_up").await), 3);
    // paused: nothing
    assert!(new(fires(&db, "paused").await).is_empty());

    let listed = client.storage().schedules().await.unwrap();
    let names: Vec<(&str, bool)> = listed
        .iter()
        .map(|s| (s.schedule.as_str(), s.paused))
        .collect();
    assert_eq!(
        names,
        [("catch_up", false), ("paused", true), ("skip", false)]
    );
    // two schedules with one name are refused
    let twice = db
        .client()
        .periodic(skip.clone())
        .periodic(skip)
        .build()
        .await;
    assert!(matches!(twice, Err(Error::Config(msg)) if msg.contains("two periodic schedules")));
    db.cleanup().await;
}

/// The maintenance leader declares no schedules (like `ringwork serve`, or a producer-only
/// service): the processes that declare them fire them anyway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_fire_while_a_process_without_schedules_is_the_maintenance_leader() {
    let db = TestDb::new().await;
    let leader = client_with(&db, vec![]).await.start().await.unwrap();
    let key = ringwork::maintenance::leader_lock_key(&db.schema);
    let leaders = || async {
        sqlx::query_scalar::<_, i64>(&format!(
            "SELECT count(*) FROM pg_locks WHERE {LEADER_LOCK}"
        ))
        .bind(key)
        .fetch_one(&db.pool)
        .await
        .unwrap()
    };
    assert!(
        support::eventually(Duration::from_secs(10), || async { leaders().await == 1 }).await,
        "the process without schedules was elected"
    );
    let hour = Duration::from_secs(3600);
    fired_this_hour(&db, "beat").await;
    let worker = client_with(
        &db,
        vec![Periodic::every("beat", hour, tick_job()).unwrap()],
    )
    .await
    .start()
    .await
    .unwrap();
    for want in 2..=3 {
        advance_until_fired(&db, "beat", hour, want).await;
    }
    worker.shutdown(Duration::from_secs(5)).await;
    leader.shutdown(Duration::from_secs(5)).await;
    db.cleanup().await;
}

async fn pending_triggers(db: &TestDb) -> i64 {
    db.scalar_i64("SELECT count(*) FROM {s}.periodic_triggers")
        .await
}

/// `ringwork cron trigger`: one extra fire, inserted once however many processes declare the
/// schedule, paused or not, without moving the schedule's own fire times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trigger_fires_the_schedule_once_across_the_fleet() {
    let db = TestDb::new().await;
    // once a year: it never fires on its own during the test
    let yearly = || Periodic::cron("yearly", "0 0 1 1 *", "UTC", tick_job()).unwrap();
    let storage = db.storage();
    assert!(storage.trigger_schedule("yearly").await.unwrap());
    assert!(
        !storage.trigger_schedule("yearly").await.unwrap(),
        "one pending trigger at a time"
    );
    let mut fleet = Vec::new();
    for _ in 0..3 {
        let client = client_with(&db, vec![yearly()]).await;
        fleet.push(client.start().await.unwrap());
    }
    // the fired jobs run (the tick handler): count them done
    let ticks = || async { storage.queue_counts(Some("default")).await.unwrap()[0].completed };
    assert!(
        support::eventually(Duration::from_secs(10), || async { ticks().await >= 1 }).await,
        "the trigger fired"
    );
    // the trigger is taken in the transaction that inserts its job, so once it is gone no other
    // process can fire it again: one job in all, by one of three processes
    assert_eq!(pending_triggers(&db).await, 0);
    assert_eq!(
        tick_jobs(&db).await,
        1,
        "fired once, by one of three processes"
    );
    // paused, a trigger still fires: the operator asked for it by name
    storage.set_schedule_paused("yearly", true).await.unwrap();
    assert!(storage.trigger_schedule("yearly").await.unwrap());
    assert!(
        support::eventually(Duration::from_secs(10), || async { ticks().await >= 2 }).await,
        "the second trigger fired"
    );
    assert_eq!(pending_triggers(&db).await, 0);
    let counts = storage.queue_counts(Some("default")).await.unwrap();
    assert_eq!(tick_jobs(&db).await, 2, "{counts:?}");
    for client in fleet {
        client.shutdown(Duration::from_secs(5)).await;
    }
    assert!(
        fires(&db, "yearly").await.is_empty(),
        "no fire time recorded"
    );
    assert!(matches!(
        storage.trigger_schedule("bad\0name").await,
        Err(Error::Config(_))
    ));
    db.cleanup().await;
}

/// What readers see of a schedule before and without its fires: the definition every declaring
/// process records when it starts (written only when new or changed), the next fire on the
/// engine's clock, and "overdue" once a fire came due that no process made.
#[tokio::test]
async fn declared_schedules_are_listed_with_their_next_fire_and_read_overdue_when_nobody_fires_them(
) {
    let db = TestDb::new().await;
    let storage = db.storage();
    let hour = Duration::from_secs(3600);
    let beat = Periodic::every("beat", hour, tick_job()).unwrap();
    let nightly = Periodic::cron("nightly", "0 3 * * *", "Europe/Stockholm", tick_job()).unwrap();
    assert_eq!(
        storage
            .declare_schedules(&[beat.clone(), nightly.clone()])
            .await
            .unwrap(),
        2
    );
    // a restart of an unchanged fleet writes nothing
    assert_eq!(
        storage
            .declare_schedules(&[beat.clone(), nightly.clone()])
            .await
            .unwrap(),
        0
    );
    let now: DateTime<Utc> = sqlx::query_scalar(&format!("SELECT {}.engine_now()", db.schema))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let listed = storage.schedules().await.unwrap();
    let find = |all: &[ringwork::ScheduleRecord], name: &str| {
        all.iter().find(|s| s.schedule == name).cloned().unwrap()
    };
    let b = find(&listed, "beat");
    assert_eq!(b.definition.as_deref(), Some("every 3600s"));
    assert_eq!(b.next_fire_at, beat.next_after(now));
    assert_eq!((b.fires, b.last_fire_at, b.overdue_since), (0, None, None));
    let n = find(&listed, "nightly");
    assert_eq!(
        n.definition.as_deref(),
        Some("cron \"0 3 * * *\" in Europe/Stockholm")
    );
    assert_eq!(n.next_fire_at, nightly.next_after(now));

    // a changed definition (a deploy) is written again
    let beat_faster = Periodic::every("beat", Duration::from_secs(60), tick_job()).unwrap();
    assert_eq!(
        storage
            .declare_schedules(std::slice::from_ref(&beat_faster))
            .await
            .unwrap(),
        1
    );

    // two hours pass on the engine's clock and no process declares the schedules: overdue from
    // the first fire after the declaration
    db.advance_clock(2 * hour).await;
    let listed = storage.schedules().await.unwrap();
    let b = find(&listed, "beat");
    let declared_at: DateTime<Utc> = sqlx::query_scalar(&format!(
        "SELECT declared_at FROM {}.periodic_definitions WHERE schedule = 'beat'",
        db.schema
    ))
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(b.overdue_since, beat_faster.next_after(declared_at));
    assert!(
        b.next_fire_at.unwrap() > now + chrono::Duration::hours(2) - chrono::Duration::minutes(1)
    );

    // paused: neither a next fire nor overdue
    storage.set_schedule_paused("beat", true).await.unwrap();
    let b = find(&storage.schedules().await.unwrap(), "beat");
    assert!(b.paused);
    assert_eq!((b.next_fire_at, b.overdue_since), (None, None));

    // a schedule that left the code: its definition is forgotten, and with no fire kept and no
    // pause it is not listed any more; forgetting it again finds nothing
    assert!(storage.forget_schedule("nightly").await.unwrap());
    assert!(!storage.forget_schedule("nightly").await.unwrap());
    let listed = storage.schedules().await.unwrap();
    assert!(listed.iter().all(|s| s.schedule != "nightly"), "{listed:?}");
    assert!(find(&listed, "beat").definition.is_some());
    db.cleanup().await;
}

/// A started process records the schedules it declares.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_started_process_records_its_schedules() {
    let db = TestDb::new().await;
    let client = client_with(
        &db,
        vec![Periodic::every("beat", Duration::from_secs(3600), tick_job()).unwrap()],
    )
    .await
    .start()
    .await
    .unwrap();
    let storage = db.storage();
    assert!(
        support::eventually(Duration::from_secs(10), || async {
            storage
                .schedules()
                .await
                .unwrap()
                .iter()
                .any(|s| s.schedule == "beat" && s.definition.as_deref() == Some("every 3600s"))
        })
        .await,
        "the process recorded its schedule"
    );
    client.shutdown(Duration::from_secs(5)).await;
    db.cleanup().await;
}
