//! The operator pages beside the job lists, over plain HTTP against `ringwork serve`: limits with
//! what each queue and key uses of them, schedules with their actions (and unknown names refused),
//! and the jobs that wait for a callback.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{csrf_of, exchange};
use ringwork::testing::{waiting_for_callback, TestDatabase};
use ringwork::{KeyLimit, NewJob, QueueLimits};
use serde_json::json;

async fn serve(db: &TestDatabase) -> (tokio::process::Child, SocketAddr) {
    common::spawn_serve(&[
        "--no-maintenance",
        "--dashboard-behind-proxy",
        "--database-url",
        db.url(),
        "--schema",
        db.schema().as_str(),
    ])
    .await
}

async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let host = addr.to_string();
    let (status, _, body) = exchange(addr, "GET", path, &[("Host", &host)], "").await;
    (status, body)
}

async fn post_form(addr: SocketAddr, path: &str, form: &str) -> u16 {
    let host = addr.to_string();
    let origin = format!("http://{host}");
    let (status, _, _) = exchange(
        addr,
        "POST",
        path,
        &[
            ("Host", &host),
            ("Origin", &origin),
            ("Content-Type", "application/x-www-form-urlencoded"),
        ],
        form,
    )
    .await;
    status
}

/// The HTML of the element whose opening tag holds `marker`, up to the end of its table row or
/// section (enough to assert what one queue's or key's row says).
fn part<'a>(body: &'a str, marker: &str, end: &str) -> &'a str {
    let start = body
        .find(marker)
        .unwrap_or_else(|| panic!("no {marker} in\n{body}"));
    let rest = &body[start..];
    &rest[..rest.find(end).map_or(rest.len(), |i| i + end.len())]
}

#[tokio::test]
async fn the_limits_page_shows_what_each_queue_and_key_uses() {
    let db = TestDatabase::new().await.unwrap();
    let storage = db.storage();
    storage
        .set_queue_limits(
            "tenants",
            QueueLimits {
                max_running: Some(3),
                rate: Some((100, Duration::from_secs(60))),
                per_key: Some(KeyLimit::arg("tenant").max_running(1)),
            },
        )
        .await
        .unwrap();
    let jobs: Vec<_> = ["a", "a", "b", "c", "d"]
        .iter()
        .map(|t| {
            NewJob::from_parts("bill", json!({ "tenant": t }))
                .unwrap()
                .queue("tenants")
        })
        .collect();
    let mut conn = db.pool().acquire().await.unwrap();
    storage.insert_many(&mut conn, &jobs).await.unwrap();
    drop(conn);
    // a, b and c run (one each, the queue's limit of three reached); a's second job is held for
    // its key, d waits in the ring
    let claimed = storage.claim("tenants", 10, None).await.unwrap();
    assert_eq!(claimed.len(), 3);

    let used = storage.queue_limits_in_use(10).await.unwrap();
    assert_eq!(used.len(), 1, "{used:?}");
    let tenants = &used[0];
    assert_eq!(
        (
            tenants.running,
            tenants.max_running,
            tenants.rate_used,
            tenants.held
        ),
        (3, Some(3), 3, 1),
        "{tenants:?}"
    );
    let keys: Vec<(&str, i64)> = tenants
        .top_keys
        .iter()
        .map(|k| (k.key.as_str(), k.running))
        .collect();
    assert_eq!(keys, vec![("a", 1), ("b", 1), ("c", 1)]);

    let (mut serve, addr) = serve(&db).await;
    let (status, page) = get(addr, "/dashboard/limits").await;
    assert_eq!(status, 200, "{page}");
    let queue = part(&page, "data-queue=\"tenants\"", "</section>");
    assert!(
        part(queue, "<tr class=\"running\"", "</tr>").contains("3 / 3"),
        "{queue}"
    );
    assert!(
        part(queue, "<tr class=\"rate\"", "</tr>").contains("3 / 100"),
        "{queue}"
    );
    assert!(part(queue, "<tr class=\"rate\"", "</tr>").contains("per 1 min"));
    assert!(queue.contains("<span class=\"held\">1</span>"), "{queue}");
    for key in ["a", "b", "c"] {
        let row = part(queue, &format!("data-key=\"{key}\""), "</tr>");
        assert!(row.contains("1 / 1"), "{row}");
    }
    assert!(!queue.contains("data-key=\"d\""), "d never ran: {queue}");

    // one job done: the queue has room again, and the page says so
    let done = claimed.iter().find(|j| j.args["tenant"] == "b").unwrap();
    storage.complete_batch(&[done.attempt_ref()]).await.unwrap();
    let (_, page) = get(addr, "/dashboard/limits").await;
    let queue = part(&page, "data-queue=\"tenants\"", "</section>");
    assert!(
        part(queue, "<tr class=\"running\"", "</tr>").contains("2 / 3"),
        "{queue}"
    );

    // a queue with a running limit alone (no per-key limit) is listed too
    storage
        .set_queue_limits(
            "capped",
            QueueLimits {
                max_running: Some(2),
                ..QueueLimits::default()
            },
        )
        .await
        .unwrap();
    let (status, page) = get(addr, "/dashboard/limits").await;
    assert_eq!(status, 200, "{page}");
    let capped = part(&page, "data-queue=\"capped\"", "</section>");
    assert!(
        part(capped, "<tr class=\"running\"", "</tr>").contains("0 / 2"),
        "{capped}"
    );
    // a queue without limits is not listed
    storage.ensure_queue("plain").await.unwrap();
    let (_, page) = get(addr, "/dashboard/limits").await;
    assert!(!page.contains("data-queue=\"plain\""));
    serve.start_kill().unwrap();
    db.drop().await.unwrap();
}

#[tokio::test]
async fn schedules_are_listed_paused_resumed_and_fired_and_unknown_names_refused() {
    let db = TestDatabase::new().await.unwrap();
    let storage = db.storage();
    storage.set_schedule_paused("nightly", true).await.unwrap();
    // declared by a process, never fired: listed with its definition and next fire
    let beat = ringwork::Periodic::every(
        "beat",
        Duration::from_secs(3600),
        NewJob::from_parts("tick", json!({})).unwrap(),
    )
    .unwrap();
    storage.declare_schedules(&[beat]).await.unwrap();
    let (mut serve, addr) = serve(&db).await;

    let (status, page) = get(addr, "/dashboard/schedules").await;
    assert_eq!(status, 200, "{page}");
    let row = part(&page, "data-schedule=\"beat\"", "</tr>");
    assert!(row.contains("every 3600s"), "{row}");
    let next = part(row, "class=\"next-fire\"", "</td>");
    assert!(next.contains(">in "), "{next}");
    assert!(!next.contains("overdue"), "{next}");
    let row = part(&page, "data-schedule=\"nightly\"", "</tr>");
    assert!(row.contains("paused"), "{row}");
    assert!(row.contains("id=\"resume-nightly\""), "{row}");
    let csrf = csrf_of(&page);

    let status = post_form(
        addr,
        "/dashboard/schedules/resume",
        &format!("schedule=nightly&csrf={csrf}"),
    )
    .await;
    assert_eq!(status, 303);
    let nightly = |all: Vec<ringwork::ScheduleRecord>| {
        all.into_iter()
            .find(|s| s.schedule == "nightly")
            .map(|s| s.paused)
    };
    // resumed and never fired: nothing is kept of it any more
    assert_eq!(nightly(storage.schedules().await.unwrap()), None);

    storage.set_schedule_paused("nightly", true).await.unwrap();
    let status = post_form(
        addr,
        "/dashboard/schedules/trigger",
        &format!("schedule=nightly&csrf={csrf}"),
    )
    .await;
    assert_eq!(status, 303);
    assert!(
        !storage.trigger_schedule("nightly").await.unwrap(),
        "the page's trigger is pending"
    );

    // a name the page does not list, a missing CSRF field, an unknown action: refused, and
    // nothing is left behind
    for (path, form, expected) in [
        (
            "/dashboard/schedules/pause",
            format!("schedule=typo&csrf={csrf}"),
            404,
        ),
        (
            "/dashboard/schedules/trigger",
            format!("schedule=typo&csrf={csrf}"),
            404,
        ),
        ("/dashboard/schedules/pause", "schedule=nightly".into(), 403),
        (
            "/dashboard/schedules/drop",
            format!("schedule=nightly&csrf={csrf}"),
            404,
        ),
    ] {
        assert_eq!(
            post_form(addr, path, &form).await,
            expected,
            "{path} {form}"
        );
    }
    assert!(storage
        .schedules()
        .await
        .unwrap()
        .iter()
        .all(|s| s.schedule == "nightly" || s.schedule == "beat"));
    assert!(
        storage.trigger_schedule("typo").await.unwrap(),
        "no trigger of typo was left"
    );
    serve.start_kill().unwrap();
    db.drop().await.unwrap();
}

#[tokio::test]
async fn the_callbacks_page_lists_the_jobs_that_wait_for_one() {
    let db = TestDatabase::new().await.unwrap();
    let (mut serve, addr) = serve(&db).await;
    let (status, page) = get(addr, "/dashboard/callbacks").await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("id=\"no-callbacks\""), "{page}");

    let mut conn = db.pool().acquire().await.unwrap();
    let (waiting, _) = waiting_for_callback(
        &db.admin(),
        &mut conn,
        "approvals",
        3,
        Duration::from_secs(3600),
    )
    .await
    .unwrap();
    drop(conn);
    let (_, page) = get(addr, "/dashboard/callbacks").await;
    let row = part(&page, &format!("data-job=\"{}\"", waiting.job_id), "</tr>");
    assert!(row.contains("approvals"), "{row}");
    assert!(
        row.contains("in 59min") || row.contains("in 60min"),
        "{row}"
    );
    assert!(!page.contains("id=\"no-callbacks\""));
    serve.start_kill().unwrap();
    db.drop().await.unwrap();
}

/// The value of the hidden field `name` in a form of `page`.
fn field(page: &str, name: &str) -> String {
    common::value_after(page, &format!("name=\"{name}\" value=\""))
}

#[tokio::test]
async fn a_bulk_action_confirms_its_count_and_acts_only_on_what_the_page_showed() {
    let db = TestDatabase::new().await.unwrap();
    let storage = db.storage();
    let later = chrono::Utc::now() + chrono::Duration::hours(1);
    let scheduled = |queue: &str, n: usize| -> Vec<NewJob> {
        (0..n)
            .map(|i| {
                NewJob::from_parts("report", json!({ "n": i }))
                    .unwrap()
                    .queue(queue)
                    .run_at(later)
            })
            .collect()
    };
    let mut conn = db.pool().acquire().await.unwrap();
    let shown = storage
        .insert_many(&mut conn, &scheduled("bulkq", 5))
        .await
        .unwrap();
    let other = storage
        .insert_many(&mut conn, &scheduled("other", 2))
        .await
        .unwrap();
    let (mut serve, addr) = serve(&db).await;

    let (status, list) = get(addr, "/dashboard/jobs?state=scheduled&queue=bulkq").await;
    assert_eq!(status, 200);
    assert!(list.contains("id=\"bulk-cancel\""), "{list}");
    assert!(list.contains("id=\"bulk-retry\""), "{list}");
    // the list ends with its fifth job: no next page
    assert!(!list.contains("id=\"next\""), "{list}");
    // under an argument filter the list is narrower than what a bulk action would touch
    let (_, narrowed) = get(
        addr,
        "/dashboard/jobs?state=scheduled&queue=bulkq&args=%22n%22",
    )
    .await;
    assert!(!narrowed.contains("bulk-"), "{narrowed}");
    let (status, confirm) = get(
        addr,
        "/dashboard/jobs/bulk?action=cancel&state=scheduled&queue=bulkq",
    )
    .await;
    assert_eq!(status, 200, "{confirm}");
    assert!(confirm.contains("<b id=\"bulk-count\">5</b>"), "{confirm}");
    // a job that arrives while the operator reads is not what they confirmed
    let arrived = storage
        .insert_many(&mut conn, &scheduled("bulkq", 1))
        .await
        .unwrap();
    drop(conn);
    // the cutoff a millisecond before the page's own: the job that arrived may share the page's
    // millisecond, the shown ones were inserted before the server started (no clock to wait for)
    let shown_at: i64 = field(&confirm, "shown_at").parse().unwrap();
    let form = format!(
        "csrf={}&action=cancel&state=scheduled&queue=bulkq&shown_at={}",
        csrf_of(&confirm),
        shown_at - 1
    );

    // refused: no cutoff, a state the action does not apply to, no CSRF field
    for bad in [
        form.replace("&shown_at=", "&was_shown_at="),
        form.replace("state=scheduled", "state=completed"),
        form.replace("action=cancel", "action=purge"),
    ] {
        assert_eq!(
            post_form(addr, "/dashboard/jobs/bulk", &bad).await,
            400,
            "{bad}"
        );
    }
    let no_csrf = form.replace("csrf=", "not_csrf=");
    assert_eq!(post_form(addr, "/dashboard/jobs/bulk", &no_csrf).await, 403);
    assert_eq!(
        storage.queue_counts(Some("bulkq")).await.unwrap()[0].scheduled,
        6,
        "nothing was cancelled by a refused form"
    );

    let host = addr.to_string();
    let origin = format!("http://{host}");
    let (status, _, done) = exchange(
        addr,
        "POST",
        "/dashboard/jobs/bulk",
        &[
            ("Host", &host),
            ("Origin", &origin),
            ("Content-Type", "application/x-www-form-urlencoded"),
        ],
        &form,
    )
    .await;
    assert_eq!(status, 200, "{done}");
    assert!(done.contains("Cancelled <b>5</b> of 5"), "{done}");
    for id in &shown {
        let state = storage.job_state(*id).await.unwrap().unwrap().state;
        assert_eq!(state, ringwork::JobStatus::Cancelled, "job {id}");
    }
    for id in arrived.iter().chain(&other) {
        let state = storage.job_state(*id).await.unwrap().unwrap().state;
        assert_eq!(
            state,
            ringwork::JobStatus::Scheduled,
            "job {id} was not shown"
        );
    }
    serve.start_kill().unwrap();

    // a read-only dashboard offers no bulk action, and its confirmation page refuses
    let (mut read_only, addr) = common::spawn_serve(&[
        "--no-maintenance",
        "--dashboard",
        "--database-url",
        db.url(),
        "--schema",
        db.schema().as_str(),
    ])
    .await;
    let (_, list) = get(addr, "/dashboard/jobs?state=scheduled&queue=bulkq").await;
    assert!(!list.contains("bulk-"), "{list}");
    let (status, _) = get(
        addr,
        "/dashboard/jobs/bulk?action=cancel&state=scheduled&queue=bulkq",
    )
    .await;
    assert_eq!(status, 403);
    read_only.start_kill().unwrap();
    db.drop().await.unwrap();
}

#[tokio::test]
async fn the_search_box_goes_to_a_job_and_the_queue_filter_offers_the_queues() {
    let db = TestDatabase::new().await.unwrap();
    let storage = db.storage();
    let (mut serve, addr) = serve(&db).await;
    let host = addr.to_string();
    for (asked, expected) in [
        ("42", 303),
        ("%2342", 303),
        ("abc", 400),
        ("-1", 400),
        ("", 400),
    ] {
        let (status, head, _) = exchange(
            addr,
            "GET",
            &format!("/dashboard/jobs/find?id={asked}"),
            &[("Host", &host)],
            "",
        )
        .await;
        assert_eq!(status, expected, "{asked}");
        if expected == 303 {
            assert_eq!(
                common::header(&head, "location"),
                Some("/dashboard/jobs/42")
            );
        }
    }
    // a pick list of the queues (while there are at most 200; beyond, the name is typed)
    storage.ensure_queue("q-one").await.unwrap();
    let (_, page) = get(addr, "/dashboard/jobs").await;
    assert!(
        page.contains("<datalist id=\"queue-names\"><option value=\"q-one\">"),
        "{page}"
    );
    serve.start_kill().unwrap();
    db.drop().await.unwrap();
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Ping {}

impl ringwork::JobArgs for Ping {
    const KIND: &'static str = "ping";
}

#[tokio::test]
async fn the_processes_page_shows_each_process_and_the_leader_while_they_run() {
    let db = TestDatabase::new().await.unwrap();
    let admin = db.admin();
    let (mut serve, addr) = serve(&db).await;
    let ours = format!(
        "ringwork:{} pid {} ",
        db.schema().as_str(),
        std::process::id()
    );
    let (_, page) = get(addr, "/dashboard/processes").await;
    assert!(!page.contains(&ours), "{page}");
    assert!(page.contains("No process leads maintenance"), "{page}");

    let client = db
        .client()
        .maintenance(ringwork::testing::fast_maintenance())
        .queue("pings", ringwork::QueueConfig::default())
        .register(|_ctx: ringwork::JobContext, _job: Ping| async move {
            Ok::<(), ringwork::JobError>(())
        })
        .build()
        .await
        .unwrap();
    let running = client.start().await.unwrap();
    assert!(
        ringwork::testing::eventually(Duration::from_secs(20), || async {
            let sessions = admin.processes().await.unwrap();
            sessions.iter().any(|s| s.application.starts_with(&ours))
                && sessions.iter().any(|s| s.leader)
        })
        .await,
        "{:?}",
        admin.processes().await
    );
    let (status, page) = get(addr, "/dashboard/processes").await;
    assert_eq!(status, 200);
    assert!(page.contains(&ours), "{page}");
    let leader = part(&page, "id=\"leader\"", "</p>");
    assert!(
        leader.contains("Maintenance is led by the backend"),
        "{leader}"
    );
    // the leader's session names the process that leads
    let leads = format!(
        "ringwork:{} leader pid {} ",
        db.schema().as_str(),
        std::process::id()
    );
    assert!(
        admin
            .processes()
            .await
            .unwrap()
            .iter()
            .any(|s| s.leader && s.application.starts_with(&leads)),
        "{:?}",
        admin.processes().await
    );

    // stopped: it drops out at once, and nobody leads
    running.shutdown(Duration::from_secs(5)).await;
    assert!(
        ringwork::testing::eventually(Duration::from_secs(20), || async {
            let sessions = admin.processes().await.unwrap();
            !sessions
                .iter()
                .any(|s| s.application.starts_with(&ours) || s.leader)
        })
        .await,
        "{:?}",
        admin.processes().await
    );
    let (_, page) = get(addr, "/dashboard/processes").await;
    assert!(page.contains("No process leads maintenance"), "{page}");
    serve.start_kill().unwrap();
    db.drop().await.unwrap();
}

#[tokio::test]
async fn finished_jobs_are_found_by_time_range_and_by_their_arguments() {
    let db = TestDatabase::new().await.unwrap();
    let storage = db.storage();
    let run = |tags: &'static [&'static str]| {
        let storage = storage.clone();
        let pool = db.pool().clone();
        async move {
            let jobs: Vec<_> = tags
                .iter()
                .map(|t| {
                    NewJob::from_parts("paint", json!({ "tag": t }))
                        .unwrap()
                        .queue("paint")
                })
                .collect();
            let mut conn = pool.acquire().await.unwrap();
            storage.insert_many(&mut conn, &jobs).await.unwrap();
            let claimed = storage.claim("paint", 10, None).await.unwrap();
            let refs: Vec<_> = claimed.iter().map(|j| j.attempt_ref()).collect();
            storage.complete_batch(&refs).await.unwrap();
            claimed.iter().map(|j| j.job_id).collect::<Vec<_>>()
        }
    };
    let early = run(&["red", "blue", "red"]).await;
    // the server's clock between the two completions (the listing's times are the server's)
    let between: String = sqlx::query_scalar(
        "SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US')",
    )
    .fetch_one(db.pool())
    .await
    .unwrap();
    let late = run(&["blue", "red"]).await;
    let (mut serve, addr) = serve(&db).await;
    let sorted = |mut ids: Vec<i64>| {
        ids.sort();
        ids
    };
    let base = "/dashboard/jobs?state=completed&queue=paint";
    let (status, page) = get(addr, &format!("{base}&since={between}")).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(sorted(listed_jobs(&page)), sorted(late.clone()));
    let (_, page) = get(addr, &format!("{base}&before={between}")).await;
    assert_eq!(sorted(listed_jobs(&page)), sorted(early.clone()));
    // arguments: the red ones, in either range
    let (_, page) = get(addr, &format!("{base}&args=red")).await;
    assert_eq!(listed_jobs(&page).len(), 3, "{page}");
    assert!(page.contains("id=\"args-scope\""));
    let (_, page) = get(addr, &format!("{base}&args=red&since={between}")).await;
    assert_eq!(listed_jobs(&page), vec![late[1]]);
    // bad input is a clear 400
    for bad in [
        format!("{base}&since=yesterday"),
        "/dashboard/jobs?state=available&since=2026-01-01T00:00".to_string(),
        format!("{base}&args={}", "x".repeat(201)),
    ] {
        let (status, page) = get(addr, &bad).await;
        assert_eq!(status, 400, "{bad}: {page}");
    }
    serve.start_kill().unwrap();
    db.drop().await.unwrap();
}

#[tokio::test]
async fn a_sequence_page_shows_its_head_and_bursts_as_they_move() {
    let db = TestDatabase::new().await.unwrap();
    let storage = db.storage();
    let mut conn = db.pool().acquire().await.unwrap();
    let mut ids = Vec::new();
    for n in 0..3 {
        let job = NewJob::from_parts("invoice", json!({ "n": n }))
            .unwrap()
            .queue("billing")
            .sequence("cust-7", ringwork::DependencyFailure::Run);
        ids.push(storage.insert(&mut conn, &job).await.unwrap());
    }
    drop(conn);
    let (mut serve, addr) = serve(&db).await;
    let (status, page) = get(addr, "/dashboard/sequences?key=cust-7").await;
    assert_eq!(status, 200, "{page}");
    let head = part(&page, "id=\"head\"", "</p>");
    assert!(head.contains(&format!("/jobs/{}\"", ids[0])), "{head}");
    assert!(head.contains("available"), "{head}");
    let burst = part(&page, "<tr data-workflow=", "</tr>");
    assert!(burst.contains("2 pending, 1 available"), "{burst}");

    // the head runs and completes: the next job is the head
    let claimed = storage.claim("billing", 10, None).await.unwrap();
    assert_eq!(
        claimed.iter().map(|j| j.job_id).collect::<Vec<_>>(),
        vec![ids[0]]
    );
    storage
        .complete_batch(&[claimed[0].attempt_ref()])
        .await
        .unwrap();
    let (_, page) = get(addr, "/dashboard/sequences?key=cust-7").await;
    let head = part(&page, "id=\"head\"", "</p>");
    assert!(head.contains(&format!("/jobs/{}\"", ids[1])), "{head}");

    // the burst's workflow page links back to its sequence
    let workflow = storage.workflow_of(ids[0]).await.unwrap().unwrap().0;
    let (_, page) = get(addr, &format!("/dashboard/workflows/{workflow}")).await;
    assert!(page.contains("/dashboard/sequences?key=cust-7"), "{page}");
    // an unknown key says so
    let (status, page) = get(addr, "/dashboard/sequences?key=nobody").await;
    assert_eq!(status, 200);
    assert!(
        page.contains("No job of the sequence nobody is kept"),
        "{page}"
    );
    serve.start_kill().unwrap();
    db.drop().await.unwrap();
}

#[tokio::test]
async fn a_list_that_ends_on_a_page_boundary_has_no_next_page() {
    let db = TestDatabase::new().await.unwrap();
    let storage = db.storage();
    let later = chrono::Utc::now() + chrono::Duration::hours(1);
    let jobs: Vec<_> = (0..50)
        .map(|n| {
            NewJob::from_parts("report", json!({ "n": n }))
                .unwrap()
                .queue("fifty")
                .run_at(later)
        })
        .collect();
    let mut conn = db.pool().acquire().await.unwrap();
    storage.insert_many(&mut conn, &jobs).await.unwrap();
    drop(conn);
    let (mut serve, addr) = serve(&db).await;
    let (_, page) = get(addr, "/dashboard/jobs?state=scheduled&queue=fifty").await;
    assert_eq!(page.matches("<tr data-job=").count(), 50);
    assert!(!page.contains("id=\"next\""), "{page}");
    let (_, page) = get(
        addr,
        "/dashboard/jobs?state=scheduled&queue=fifty&args=%22n%22",
    )
    .await;
    assert_eq!(page.matches("<tr data-job=").count(), 50);
    assert!(!page.contains("id=\"next\""), "{page}");
    serve.start_kill().unwrap();
    db.drop().await.unwrap();
}

/// The queues page orders by a count, most first: the order from the dashboard's latest sample of
/// every queue, the counts read now for the page's queues; an unknown order is refused.
#[tokio::test]
async fn queues_are_ordered_by_a_count_from_the_latest_sample() {
    let db = TestDatabase::new().await.unwrap();
    let storage = db.storage();
    let mut conn = db.pool().acquire().await.unwrap();
    for (queue, n) in [("few", 1), ("many", 3), ("none", 0)] {
        storage.ensure_queue(queue).await.unwrap();
        for _ in 0..n {
            storage
                .insert(
                    &mut conn,
                    &NewJob::from_parts("tick", json!({})).unwrap().queue(queue),
                )
                .await
                .unwrap();
        }
    }
    let (mut serve, addr) = serve(&db).await;
    // the sampler's first sample is taken when the server starts
    assert!(
        ringwork::testing::eventually(Duration::from_secs(10), || async {
            let (status, body) = get(addr, "/dashboard/queues?sort=available").await;
            status == 200 && !body.contains("No sample of the counts yet")
        })
        .await,
        "the dashboard took its first sample"
    );
    let (_, page) = get(addr, "/dashboard/queues?sort=available").await;
    assert!(page.contains("id=\"queue-order\""), "{page}");
    let order: Vec<&str> = ["many", "few", "none"]
        .into_iter()
        .filter(|q| page.contains(&format!("data-queue=\"{q}\"")))
        .collect();
    assert_eq!(order.len(), 3, "{page}");
    let at = |q: &str| page.find(&format!("data-queue=\"{q}\"")).unwrap();
    assert!(at("many") < at("few") && at("few") < at("none"), "{page}");

    // a job more in "few": shown at once, the order stays the sample's until the next one
    storage
        .insert(
            &mut conn,
            &NewJob::from_parts("tick", json!({})).unwrap().queue("few"),
        )
        .await
        .unwrap();
    let (_, page) = get(addr, "/dashboard/queues?sort=available").await;
    let few = part(&page, "data-queue=\"few\"", "</tr>");
    assert!(
        part(few, "data-state=\"available\"", "</td>").contains(">2<"),
        "{few}"
    );
    // the name filter keeps the order
    let (_, page) = get(addr, "/dashboard/queues?sort=available&filter=e").await;
    assert!(page.contains("name=\"sort\" value=\"available\""), "{page}");
    assert!(page.contains("data-queue=\"none\"") && !page.contains("data-queue=\"many\""));

    let (status, _) = get(addr, "/dashboard/queues?sort=nonsense").await;
    assert_eq!(status, 400);
    serve.start_kill().unwrap();
    db.drop().await.unwrap();
}

#[tokio::test]
async fn each_archive_bucket_links_to_the_jobs_that_finished_in_it_and_archive_search_finds_them() {
    let db = TestDatabase::new().await.unwrap();
    let storage = db.storage();
    db.scalar_i64("SELECT {s}.set_setting('archive_search', 1)")
        .await
        .unwrap();
    let jobs: Vec<_> = (0..3)
        .map(|n| {
            NewJob::from_parts("paint", json!({ "n": n }))
                .unwrap()
                .queue("paint")
        })
        .collect();
    let mut conn = db.pool().acquire().await.unwrap();
    storage.insert_many(&mut conn, &jobs).await.unwrap();
    drop(conn);
    let claimed = storage.claim("paint", 10, None).await.unwrap();
    let refs: Vec<_> = claimed.iter().map(|j| j.attempt_ref()).collect();
    storage.complete_batch(&refs).await.unwrap();
    let mut done: Vec<i64> = claimed.iter().map(|j| j.job_id).collect();
    done.sort();
    // the slot is sealed and pruned: its completions now live in the archive only
    storage.rotate_queue_ring(Duration::ZERO).await.unwrap();
    let keep = Duration::from_secs(86_400);
    let options = ringwork::QueueSlotPrune {
        lock_timeout: Duration::from_millis(250),
        keep_completed: keep,
        keep_failed: keep,
        park_idle: None,
    };
    for slot in storage.sealed_queue_slots().await.unwrap() {
        assert_eq!(
            storage.prune_queue_slot_with(slot, &options).await.unwrap(),
            ringwork::PruneResult::Pruned
        );
    }
    let (mut serve, addr) = serve(&db).await;
    let (status, page) = get(addr, "/dashboard/storage").await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("href=\"/dashboard/archive\""), "{page}");
    let (status, page) = get(addr, "/dashboard/archive").await;
    assert_eq!(status, 200, "{page}");
    let archive = &page[page
        .find("<table id=\"archive\"")
        .expect("the archive's buckets")..];
    let link = archive
        .match_indices("href=\"")
        .map(|(at, m)| archive[at + m.len()..].split('"').next().unwrap())
        .find(|href| href.contains("state=completed"))
        .expect("a bucket's completed jobs")
        .replace("&amp;", "&");
    assert!(
        link.contains("since=") && link.contains("before="),
        "{link}"
    );
    let (status, listing) = get(addr, &link).await;
    assert_eq!(status, 200, "{listing}");
    let mut listed = listed_jobs(&listing);
    listed.sort();
    assert_eq!(listed, done, "the bucket's completed jobs");
    // the failed ones of the same bucket: none
    let failed = link.replace("state=completed", "state=failed");
    let (status, listing) = get(addr, &failed).await;
    assert_eq!(status, 200);
    assert!(!listing.contains("<tr data-job=\""), "no job failed");

    // archive search: the job whose arguments hold {"n": 1}, and with a state filter, none
    let one = claimed
        .iter()
        .find(|j| j.args == json!({ "n": 1 }))
        .expect("the job with n = 1")
        .job_id;
    let (status, found) = get(addr, "/dashboard/archive?args=%7B%22n%22%3A+1%7D").await;
    assert_eq!(status, 200, "{found}");
    assert_eq!(listed_jobs(&found), vec![one]);
    assert!(!found.contains("id=\"search-off\""), "{found}");
    let (status, found) = get(
        addr,
        "/dashboard/archive?args=%7B%22n%22%3A+1%7D&state=failed&queue=paint",
    )
    .await;
    assert_eq!(status, 200, "{found}");
    assert!(listed_jobs(&found).is_empty() && found.contains("id=\"no-matches\""));
    // every job matches {}
    let (_, found) = get(addr, "/dashboard/archive?args=%7B%7D").await;
    let mut all = listed_jobs(&found);
    all.sort();
    assert_eq!(all, done);
    // bad input: a clear 400 each
    for (bad, says) in [
        ("/dashboard/archive?args=%7Bn%3A1", "JSON"),
        (
            "/dashboard/archive?args=%7B%7D&state=running",
            "completed, failed and cancelled",
        ),
        ("/dashboard/archive?args=%7B%7D&after=L1%3A2", "page key"),
        (
            "/dashboard/archive?args=%7B%7D&since=yesterday",
            "not a time",
        ),
    ] {
        let (status, page) = get(addr, bad).await;
        assert_eq!(status, 400, "{bad}: {page}");
        assert!(page.contains(says), "{bad}: {page}");
    }
    // turned off, the page says so (what was indexed is still found)
    db.scalar_i64("SELECT coalesce({s}.set_setting('archive_search', NULL), 0)")
        .await
        .unwrap();
    let (_, found) = get(addr, "/dashboard/archive?args=%7B%22n%22%3A+1%7D").await;
    assert!(found.contains("id=\"search-off\""), "{found}");
    assert_eq!(listed_jobs(&found), vec![one]);
    serve.start_kill().unwrap();
    db.drop().await.unwrap();
}

/// The job ids a page lists (its `<tr data-job="…">` rows), in order.
fn listed_jobs(page: &str) -> Vec<i64> {
    page.match_indices("<tr data-job=\"")
        .map(|(at, m)| {
            page[at + m.len()..]
                .split('"')
                .next()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect()
}
