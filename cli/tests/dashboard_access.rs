//! Who reaches the dashboard, over plain HTTP against `ringwork serve`: only requests naming one of
//! its hosts (a page rebound to 127.0.0.1 gets 421), actions only from its own origin, sessions
//! kept by the server (a new one per sign-in, expiring, dead after sign-out), sign-in throttled,
//! exact sign-in exemptions, deep links kept through sign-in, unknown queues never created.

mod common;

use std::net::SocketAddr;

use common::{csrf_of, exchange, header, value_after};
use ringwork::testing::TestDatabase;

const TOKEN: &str = "dashboard-access-token-0123456789";

async fn serve(db: &TestDatabase, mode: &[&str]) -> (tokio::process::Child, SocketAddr) {
    let mut args = vec![
        "--no-maintenance",
        "--dashboard-host",
        "jobs.example.test",
        "--database-url",
        db.url(),
        "--schema",
        db.schema().as_str(),
    ];
    args.extend_from_slice(mode);
    common::spawn_serve(&args).await
}

/// The session id a sign-in's `Set-Cookie` carries, and the whole header.
fn session_cookie(head: &str) -> (String, String) {
    let set = header(head, "set-cookie")
        .expect("a Set-Cookie")
        .to_string();
    let id = set
        .strip_prefix("ringwork_dashboard=")
        .and_then(|rest| rest.split(';').next())
        .expect("the session cookie")
        .to_string();
    (id, set)
}

#[tokio::test]
async fn only_the_dashboards_hosts_are_answered() {
    let db = TestDatabase::new().await.unwrap();
    let (mut serve, addr) = serve(&db, &["--dashboard"]).await;
    let local = addr.to_string();
    for (host, expected) in [
        (local.as_str(), 200),
        ("localhost:9", 200),
        ("jobs.example.test", 200),
        ("JOBS.EXAMPLE.TEST:443", 200),
        ("evil.example", 421),
        ("127.0.0.1.evil.example", 421),
    ] {
        let (status, _, body) =
            exchange(addr, "GET", "/dashboard/queues", &[("Host", host)], "").await;
        assert_eq!(status, expected, "Host {host}");
        if expected == 421 {
            assert!(body.contains("--dashboard-host"), "{body}");
        }
    }
    let (status, _, _) = exchange(addr, "GET", "/dashboard/queues", &[], "").await;
    assert_eq!(status, 421, "no Host at all");
    // /metrics and the rest of the server are not the dashboard's
    let (status, _, _) = exchange(addr, "GET", "/healthz", &[("Host", "evil.example")], "").await;
    assert_ne!(status, 421);
    serve.start_kill().unwrap();
    db.drop().await.unwrap();
}

#[tokio::test]
async fn behind_a_proxy_actions_need_the_dashboards_own_origin_and_a_known_queue() {
    let db = TestDatabase::new().await.unwrap();
    db.storage().ensure_queue("known_q").await.unwrap();
    let (mut serve, addr) = serve(&db, &["--dashboard-behind-proxy"]).await;
    let host = addr.to_string();
    let (_, _, page) = exchange(addr, "GET", "/dashboard/queues", &[("Host", &host)], "").await;
    let csrf = csrf_of(&page);
    let form = format!("queue=known_q&csrf={csrf}");
    // a rebound page: its own name in Host and Origin
    let (status, _, _) = exchange(
        addr,
        "POST",
        "/dashboard/queues/pause",
        &[("Host", "evil.example"), ("Origin", "http://evil.example")],
        &form,
    )
    .await;
    assert_eq!(status, 421);
    // another site's form posting to the real host
    let (status, _, _) = exchange(
        addr,
        "POST",
        "/dashboard/queues/pause",
        &[("Host", &host), ("Origin", "http://evil.example")],
        &form,
    )
    .await;
    assert_eq!(status, 403);
    assert!(!db.storage().queue_counts(Some("known_q")).await.unwrap()[0].paused);
    // the proxy passes its own upstream Host, the browser's Origin is the public name
    let (status, _, _) = exchange(
        addr,
        "POST",
        "/dashboard/queues/pause",
        &[("Host", &host), ("Origin", "https://jobs.example.test")],
        &form,
    )
    .await;
    assert_eq!(status, 303);
    assert!(db.storage().queue_counts(Some("known_q")).await.unwrap()[0].paused);
    // a queue nobody created is not created by a form
    let (status, _, _) = exchange(
        addr,
        "POST",
        "/dashboard/queues/pause",
        &[("Host", &host)],
        &format!("queue=typo_q&csrf={csrf}"),
    )
    .await;
    assert_eq!(status, 404);
    assert!(db
        .storage()
        .queue_counts(Some("typo_q"))
        .await
        .unwrap()
        .is_empty());
    // a refusal is a page of the dashboard, in its layout; one for a foreign Host is bare
    let (_, _, refused) = exchange(
        addr,
        "POST",
        "/dashboard/queues/pause",
        &[("Host", &host)],
        &format!("queue=typo_q&csrf={csrf}"),
    )
    .await;
    assert!(refused.contains("no such queue") && refused.contains("/dashboard/assets/style.css"));
    let (_, _, bare) = exchange(
        addr,
        "GET",
        "/dashboard/queues",
        &[("Host", "evil.example")],
        "",
    )
    .await;
    assert!(!bare.contains("<nav"), "{bare}");
    serve.start_kill().unwrap();
    db.drop().await.unwrap();
}

#[tokio::test]
async fn sign_in_keeps_server_side_sessions_that_end_at_sign_out() {
    let db = TestDatabase::new().await.unwrap();
    let (mut serve, addr) = serve(&db, &["--dashboard-token", TOKEN]).await;
    let host = addr.to_string();
    let get = |path: &'static str, cookie: Option<String>| {
        let host = host.clone();
        async move {
            let mut headers = vec![("Host", host.clone())];
            if let Some(cookie) = cookie {
                headers.push(("Cookie", format!("ringwork_dashboard={cookie}")));
            }
            let headers: Vec<(&str, &str)> =
                headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
            exchange(addr, "GET", path, &headers, "").await
        }
    };
    // a deep link is kept through sign-in
    let (status, head, _) = get("/dashboard/jobs?state=failed", None).await;
    assert_eq!(status, 303);
    let to_login = header(&head, "location").unwrap().to_string();
    assert_eq!(to_login, "/dashboard/login?next=%2Fjobs%3Fstate%3Dfailed");
    // exemptions are exact paths: a path that only ends in /login is not the sign-in page
    let (status, head, _) = get("/dashboard/queues/login", None).await;
    assert_eq!(status, 303, "{head}");
    assert!(header(&head, "location")
        .unwrap()
        .starts_with("/dashboard/login"));
    // the stylesheet and the live-update script are served to the sign-in page; the policy
    // allows that script and no other
    let (status, head, script) = get("/dashboard/assets/live.js", None).await;
    assert_eq!(status, 200, "{head}");
    assert!(script.contains("ringworkLive"));
    assert!(header(&head, "content-type")
        .unwrap()
        .starts_with("text/javascript"));
    let policy = header(&head, "content-security-policy")
        .unwrap()
        .to_string();
    assert!(policy.contains("script-src 'self';"), "{policy}");
    assert!(!policy.contains("unsafe"), "{policy}");
    let (_, _, login_page) = get("/dashboard/login?next=%2Fjobs%3Fstate%3Dfailed", None).await;
    assert!(
        login_page.contains("name=\"next\" value=\"/jobs?state=failed\""),
        "{login_page}"
    );

    let sign_in = |extra: Vec<(&'static str, &'static str)>, body: String| {
        let host = host.clone();
        async move {
            let mut headers = vec![("Host", host.as_str())];
            headers.extend(extra);
            exchange(addr, "POST", "/dashboard/login", &headers, &body).await
        }
    };
    let (status, head, _) = sign_in(
        vec![],
        format!("token={TOKEN}&next=%2Fjobs%3Fstate%3Dfailed"),
    )
    .await;
    assert_eq!(status, 303);
    assert_eq!(
        header(&head, "location"),
        Some("/dashboard/jobs?state=failed")
    );
    let (first, set) = session_cookie(&head);
    assert!(
        set.contains("Max-Age=43200") && set.contains("HttpOnly"),
        "{set}"
    );
    assert!(!set.contains("Secure"), "plain HTTP: {set}");
    // a sign-in through a TLS proxy: Secure; a new id every time; a next off the site is ignored
    let (_, head, _) = sign_in(
        vec![("X-Forwarded-Proto", "https")],
        format!("token={TOKEN}&next=%2F%2Fevil.example%2F"),
    )
    .await;
    assert_eq!(header(&head, "location"), Some("/dashboard"));
    let (second, set) = session_cookie(&head);
    assert!(set.contains("; Secure"), "{set}");
    assert_ne!(first, second);

    let (status, _, page) = get("/dashboard/queues", Some(first.clone())).await;
    assert_eq!(status, 200);
    // a made-up id, or one derived from the token, opens nothing
    let (status, _, _) = get("/dashboard/queues", Some("0".repeat(64))).await;
    assert_eq!(status, 303);
    // sign out: that session is over, the other one lives
    let csrf = csrf_of(&page);
    let cookie = format!("ringwork_dashboard={first}");
    let (status, _, _) = exchange(
        addr,
        "POST",
        "/dashboard/logout",
        &[("Host", &host), ("Cookie", &cookie)],
        &format!("csrf={csrf}"),
    )
    .await;
    assert_eq!(status, 303);
    let (status, _, _) = get("/dashboard/queues", Some(first)).await;
    assert_eq!(status, 303, "the signed-out session opens nothing");
    let (status, _, _) = get("/dashboard/queues", Some(second)).await;
    assert_eq!(status, 200);

    // five wrong tokens, then even the right one waits
    for _ in 0..5 {
        let (status, _, _) = sign_in(vec![], "token=wrong-token-guess-000".into()).await;
        assert_eq!(status, 401);
    }
    let (status, _, body) = sign_in(vec![], format!("token={TOKEN}")).await;
    assert_eq!(status, 429, "{body}");
    assert!(body.contains("try again in"), "{body}");
    serve.start_kill().unwrap();
    db.drop().await.unwrap();
}

/// Store jobs past the SQL API's checks, as rows written before them would be (see
/// tests/hostile_input.rs): one lane, so they list together.
async fn store_around_the_checks(db: &TestDatabase, queue: &str, args: &[String]) -> Vec<i64> {
    let s = db.schema().as_str();
    sqlx::query_scalar(&format!(
        "SELECT * FROM {s}.enqueue_jobs($1, 2::smallint, array_fill('hostile'::text, ARRAY[$3]),
                                        $2::text[]::jsonb[], array_fill(25, ARRAY[$3]),
                                        array_fill(NULL::int, ARRAY[$3]), array_fill(NULL::text, ARRAY[$3]))"
    ))
    .bind(queue)
    .bind(args)
    .bind(args.len() as i32)
    .fetch_all(db.pool())
    .await
    .expect("enqueue_jobs")
}

#[tokio::test]
async fn every_page_renders_beside_rows_no_worker_can_decode() {
    let db = TestDatabase::new().await.unwrap();
    let s = db.schema().as_str();
    let nasty = vec![
        r#"{"n": 1e400}"#.to_string(),
        format!("{}1{}", "[".repeat(300), "]".repeat(300)),
        format!("{{\"blob\": \"{}\"}}", "x".repeat(4 << 20)),
        r#"{"bidi": "\u202Eexe.txt", "zw": "a\u200Bb", "quote": "</pre><script>x</script>"}"#
            .to_string(),
    ];
    let mut ids = store_around_the_checks(&db, "hostile_pages", &nasty).await;
    // the same rows claimed: the undecodable ones fail at their claim, the others run and fail
    ids.extend(store_around_the_checks(&db, "hostile_failed", &nasty).await);
    let storage = db.storage();
    let claimed = storage.claim("hostile_failed", 10, None).await.unwrap();
    let fails: Vec<_> = claimed
        .iter()
        .map(|job| {
            (
                job.attempt_ref(),
                ringwork::CloseOutcome::Failed {
                    error: "e".repeat(70_000),
                },
            )
        })
        .collect();
    storage.close_batch(&fails).await.unwrap();
    let forever: i64 = sqlx::query_scalar(&format!(
        "SELECT * FROM {s}.schedule_jobs('hostile_pages', 2::smallint, ARRAY['k'], ARRAY['{{}}'::jsonb],
                                         ARRAY[25], ARRAY['infinity'::timestamptz], ARRAY[NULL::int],
                                         ARRAY[NULL::text])"
    ))
    .fetch_one(db.pool())
    .await
    .unwrap();
    ids.push(forever);

    let (mut serve, addr) = serve(&db, &["--dashboard"]).await;
    let host = addr.to_string();
    let mut pages: Vec<String> = [
        "/dashboard",
        "/dashboard/queues",
        "/dashboard/dlq",
        "/dashboard/storage",
        "/dashboard/archive?args=%7B%22x%22%3A%22%3Cscript%3Ex%22%7D",
        "/dashboard/callbacks",
        "/dashboard/schedules",
        "/dashboard/limits",
        "/dashboard/processes",
        "/dashboard/sequences?key=%3Cscript%3E",
    ]
    .iter()
    .map(|p| p.to_string())
    .collect();
    for state in ringwork::JobStatus::ALL {
        pages.push(format!("/dashboard/jobs?state={state}"));
        pages.push(format!("/dashboard/jobs?state={state}&queue=hostile_pages"));
    }
    pages.extend(ids.iter().map(|id| format!("/dashboard/jobs/{id}")));
    for page in &pages {
        let (status, _, body) = exchange(addr, "GET", page, &[("Host", &host)], "").await;
        assert_eq!(status, 200, "{page}: {}", &body[..body.len().min(300)]);
        assert!(body.len() < 200_000, "{page}: {} bytes", body.len());
        assert!(
            !body.contains("<script>x"),
            "{page} shows arguments as text"
        );
    }
    // a job that never ran says why its history is empty
    let (_, _, never_ran) = exchange(
        addr,
        "GET",
        &format!("/dashboard/jobs/{}", ids[0]),
        &[("Host", &host)],
        "",
    )
    .await;
    assert!(
        never_ran.contains("No attempt has ended yet"),
        "{}",
        &never_ran[..never_ran.len().min(2000)]
    );
    let (_, _, scheduled) = exchange(
        addr,
        "GET",
        "/dashboard/jobs?state=scheduled&queue=hostile_pages",
        &[("Host", &host)],
        "",
    )
    .await;
    assert!(
        scheduled.contains("9999-12-31"),
        "infinity lists at the bound"
    );
    serve.start_kill().unwrap();
    db.drop().await.unwrap();
}

/// `count` jobs of `queue` dead-lettered now (the queue's dead-letter queue on, claimed, failed).
async fn dead_letter(db: &TestDatabase, queue: &str, count: usize) {
    let storage = db.storage();
    storage.set_queue_dead_letter(queue, true).await.unwrap();
    for n in 0..count {
        storage
            .insert(
                &mut db.pool().acquire().await.unwrap(),
                &ringwork::NewJob::from_parts("hostile", serde_json::json!({ "n": n }))
                    .unwrap()
                    .queue(queue),
            )
            .await
            .unwrap();
    }
    let claimed = storage.claim(queue, 100, None).await.unwrap();
    assert_eq!(claimed.len(), count);
    let fails: Vec<_> = claimed
        .iter()
        .map(|job| {
            (
                job.attempt_ref(),
                ringwork::CloseOutcome::Failed {
                    error: "boom".into(),
                },
            )
        })
        .collect();
    storage.close_batch(&fails).await.unwrap();
}

#[tokio::test]
async fn purging_all_dead_letters_stops_at_what_the_page_showed() {
    let db = TestDatabase::new().await.unwrap();
    dead_letter(&db, "dlq_q", 3).await;
    let (mut serve, addr) = serve(&db, &["--dashboard-behind-proxy"]).await;
    let host = addr.to_string();
    let (_, _, page) = exchange(
        addr,
        "GET",
        "/dashboard/dlq?queue=dlq_q",
        &[("Host", &host)],
        "",
    )
    .await;
    let csrf = csrf_of(&page);
    let shown_at = value_after(&page, "name=\"shown_at\" value=\"");
    // a job fails for good after the operator looked: its failure time is set one second past
    // the page's, so the test does not depend on which millisecond the clock is in
    dead_letter(&db, "dlq_q", 1).await;
    sqlx::query(&format!(
        "UPDATE {}.dlq_entries SET failed_at = to_timestamp($1::float8 / 1000) + interval '1 second'
         WHERE job_id = (SELECT max(job_id) FROM {0}.dlq_entries)",
        db.schema()
    ))
    .bind(shown_at.parse::<i64>().expect("shown_at is milliseconds") as f64)
    .execute(db.pool())
    .await
    .unwrap();
    let (status, _, _) = exchange(
        addr,
        "POST",
        "/dashboard/dlq/purge",
        &[("Host", &host)],
        &format!("scope=all&queue=dlq_q&shown_at={shown_at}&csrf={csrf}"),
    )
    .await;
    assert_eq!(status, 303);
    let left = db.storage().queue_counts(Some("dlq_q")).await.unwrap()[0].dead_lettered;
    assert_eq!(
        left, 1,
        "the job dead-lettered after the page was shown is kept"
    );
    serve.start_kill().unwrap();
    db.drop().await.unwrap();
}

#[tokio::test]
async fn queue_pages_count_one_page_of_queues_and_filter_by_name() {
    let db = TestDatabase::new().await.unwrap();
    let storage = db.storage();
    for n in 0..120 {
        storage
            .ensure_queue(&format!("tenant_{n:03}"))
            .await
            .unwrap();
    }
    storage.ensure_queue("billing").await.unwrap();
    let (mut serve, addr) = serve(&db, &["--dashboard"]).await;
    let host = addr.to_string();
    // the overview's cards 24 a page, the queues page's rows 50
    for (path, last, first_next) in [
        ("/dashboard", "tenant_022", "tenant_023"),
        ("/dashboard/queues", "tenant_048", "tenant_049"),
    ] {
        let (status, _, first) = exchange(addr, "GET", path, &[("Host", &host)], "").await;
        assert_eq!(status, 200);
        assert!(
            first.contains("data-queue=\"billing\""),
            "{path}: name order"
        );
        assert!(first.contains(&format!("data-queue=\"{last}\"")));
        assert!(
            !first.contains(&format!("data-queue=\"{first_next}\"")),
            "{path}: one page"
        );
        let next = value_after(&first, "id=\"next\" href=\"").replace("&amp;", "&");
        let (status, _, second) = exchange(addr, "GET", &next, &[("Host", &host)], "").await;
        assert_eq!(status, 200, "{next}: {second}");
        assert!(
            second.contains(&format!("data-queue=\"{first_next}\""))
                && !second.contains("data-queue=\"billing\"")
        );
        let (_, _, filtered) = exchange(
            addr,
            "GET",
            &format!("{path}?filter=bill"),
            &[("Host", &host)],
            "",
        )
        .await;
        assert!(filtered.contains("data-queue=\"billing\"") && !filtered.contains("tenant_"));
    }
    // a filter no name could hold is a clear 400, not a database error
    let (status, _, _) = exchange(
        addr,
        "GET",
        "/dashboard/queues?filter=%00",
        &[("Host", &host)],
        "",
    )
    .await;
    assert_eq!(status, 400);
    serve.start_kill().unwrap();
    db.drop().await.unwrap();
}

/// The overview marks the card of a queue whose available jobs wait while nobody claims from it,
/// and only that one.
#[tokio::test]
async fn the_overview_marks_a_queue_whose_jobs_nobody_takes() {
    let db = TestDatabase::new().await.unwrap();
    let storage = db.storage();
    let mut conn = db.pool().acquire().await.unwrap();
    let job = |queue: &str| {
        ringwork::NewJob::from_parts("k", serde_json::json!({}))
            .unwrap()
            .queue(queue)
    };
    storage
        .insert_many(&mut conn, &[job("mail"), job("busy"), job("busy")])
        .await
        .unwrap();
    drop(conn);
    db.advance_clock(std::time::Duration::from_secs(120))
        .await
        .unwrap();
    assert_eq!(storage.claim("busy", 1, None).await.unwrap().len(), 1);
    let (mut serve, addr) = serve(&db, &["--dashboard"]).await;
    let host = addr.to_string();
    let (status, _, page) = exchange(addr, "GET", "/dashboard", &[("Host", &host)], "").await;
    assert_eq!(status, 200);
    // a card runs from its data-queue attribute to the next card's
    let card = |queue: &str| {
        let marker = format!("data-queue=\"{queue}\"");
        let at = page
            .find(&marker)
            .unwrap_or_else(|| panic!("no card for {queue}"))
            + marker.len();
        let rest = &page[at..];
        rest[..rest.find("data-queue=").unwrap_or(rest.len())].to_string()
    };
    assert!(card("mail").contains("state unworked"), "{}", card("mail"));
    assert!(!card("busy").contains("state unworked"), "{}", card("busy"));
    serve.start_kill().unwrap();
    db.drop().await.unwrap();
}
