//! The dashboard end to end: `ringwork serve` against a real database, driven by a
//! headless Chromium through chromedriver (Debian's `chromium` and `chromium-driver`, which
//! `.ci/run` installs). Jobs with known outcomes are run by a real client; the test reads what the
//! pages show, signs in, pauses and resumes a queue, retries a dead-lettered job and sees it run,
//! checks that a job whose args hold `<script>` is shown as text, and that actions without the
//! CSRF field, from another site, or without signing in are refused. Screenshots of every page go
//! to docs/dashboard/.

mod common;

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fantoccini::{Client as Browser, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use ringwork::embedded;
use ringwork::testing::{eventually, TestDatabase};
use ringwork::{JobArgs, JobContext, JobError, JobStatus, NewJob, QueueConfig};
use serde::{Deserialize, Serialize};

const TOKEN: &str = "dashboard-test-token-0123456789";
const SCRIPT_ARG: &str = "<script>document.title='pwned'</script>";

#[derive(Serialize, Deserialize)]
struct Mail {
    to: String,
    fail: bool,
}

impl JobArgs for Mail {
    const KIND: &'static str = "dash_mail";
}

/// chromedriver on a free port, stopped when dropped.
struct Driver {
    child: tokio::process::Child,
    url: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// Debian's chromedriver, when chromium and chromium-driver are installed.
fn chromedriver() -> Option<&'static str> {
    ["/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .filter(|_| std::path::Path::new("/usr/bin/chromium").exists())
}

async fn start_driver(binary: &str) -> Driver {
    let port = embedded::free_port().unwrap();
    let child = tokio::process::Command::new(binary)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start chromedriver");
    let url = format!("http://127.0.0.1:{port}");
    assert!(
        eventually(Duration::from_secs(20), || async {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
        })
        .await,
        "chromedriver did not start"
    );
    Driver { child, url }
}

async fn open_browser(driver: &Driver) -> Browser {
    let mut caps = serde_json::Map::new();
    let mut args = vec![
        "--headless=new",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1300,900",
    ];
    if embedded::is_root() {
        // Chromium's sandbox refuses to run as root (CI runs as root)
        args.push("--no-sandbox");
    }
    caps.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({ "binary": "/usr/bin/chromium", "args": args }),
    );
    ClientBuilder::new(HttpConnector::new())
        .capabilities(caps)
        .connect(&driver.url)
        .await
        .expect("a chromium session")
}

/// One form POST: (status, body).
async fn post(addr: SocketAddr, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, String) {
    common::post(
        addr,
        path,
        headers,
        "application/x-www-form-urlencoded",
        body,
    )
    .await
}

async fn screenshot(browser: &Browser, name: &str) {
    let png = browser.screenshot().await.expect("screenshot");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/dashboard");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
}

async fn click(browser: &Browser, locator: Locator<'_>) {
    browser
        .find(locator)
        .await
        .unwrap_or_else(|e| panic!("nothing to click: {e}"))
        .click()
        .await
        .unwrap();
}

/// Wait until the element's text holds `expected` (a click's navigation may not have landed yet).
async fn wait_text(browser: &Browser, css: &str, expected: &str) {
    let mut seen = String::new();
    for _ in 0..100 {
        if let Ok(element) = browser.find(Locator::Css(css)).await {
            if let Ok(text) = element.text().await {
                if text.contains(expected) {
                    return;
                }
                seen = text;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{css}: expected {expected:?}, saw {seen:?}");
}

async fn text_of(browser: &Browser, css: &str) -> String {
    browser
        .wait()
        .at_most(Duration::from_secs(10))
        .for_element(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("no {css}: {e}"))
        .text()
        .await
        .unwrap()
}

#[tokio::test]
async fn the_dashboard_shows_what_ran_and_its_actions_work_in_a_real_browser() {
    let Some(chromedriver) = ringwork::testing::tool_or_skip(
        "the_dashboard_shows_what_ran_and_its_actions_work_in_a_real_browser",
        "chromium and chromedriver",
        chromedriver(),
    ) else {
        return;
    };
    let db = TestDatabase::new().await.unwrap();
    // archive search on from the start, so the jobs below are indexed when they are archived
    db.scalar_i64("SELECT {s}.set_setting('archive_search', 1)")
        .await
        .unwrap();
    let healed = Arc::new(AtomicBool::new(false));
    let runs = Arc::new(AtomicU32::new(0));
    let client = {
        let healed = Arc::clone(&healed);
        let runs = Arc::clone(&runs);
        db.client()
            .maintenance(ringwork::testing::fast_maintenance())
            .queue(
                "mail",
                QueueConfig {
                    max_workers: 4,
                    dead_letter: true,
                    ..QueueConfig::default()
                },
            )
            .register(move |_ctx: JobContext, job: Mail| {
                let healed = Arc::clone(&healed);
                let runs = Arc::clone(&runs);
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    if job.fail && !healed.load(Ordering::SeqCst) {
                        Err(JobError::Terminal("smtp said no <b>550</b>".into()))
                    } else {
                        Ok(())
                    }
                }
            })
            .build()
            .await
            .unwrap()
    };
    let mail = |to: &str, fail: bool| {
        NewJob::new(&Mail {
            to: to.into(),
            fail,
        })
        .unwrap()
        .queue("mail")
        .max_attempts(1)
    };
    let script_job = client.insert(mail(SCRIPT_ARG, false)).await.unwrap();
    client.insert(mail("a@example.com", false)).await.unwrap();
    client.insert(mail("b@example.com", false)).await.unwrap();
    let failing = client
        .insert(mail("bounce@example.com", true))
        .await
        .unwrap();
    let later = client
        .insert(
            mail("later@example.com", false)
                .run_at(chrono::Utc::now() + chrono::Duration::hours(1)),
        )
        .await
        .unwrap();
    let running = client.start().await.unwrap();
    let storage = db.storage();
    assert!(
        eventually(Duration::from_secs(30), || async {
            let counts = storage.queue_counts(Some("mail")).await.unwrap();
            counts
                .first()
                .is_some_and(|c| c.completed == 3 && c.dead_lettered == 1 && c.running == 0)
        })
        .await,
        "the jobs did not finish: {:?}",
        storage.queue_counts(Some("mail")).await
    );

    // the server, with actions behind a token, mounted at /dashboard
    let (mut serve, addr) = common::spawn_serve(&[
        "--no-maintenance",
        "--dashboard-token",
        TOKEN,
        "--dashboard-sample-secs",
        "1",
        "--database-url",
        db.url(),
        "--schema",
        db.schema().as_str(),
    ])
    .await;
    let base = format!("http://{addr}/dashboard");

    let driver = start_driver(chromedriver).await;
    let browser = open_browser(&driver).await;

    // with a token every page needs sign-in, and an action without it is refused; the page
    // asked for is where sign-in lands
    browser.goto(&format!("{base}/dlq")).await.unwrap();
    assert!(browser
        .current_url()
        .await
        .unwrap()
        .as_str()
        .ends_with("/dashboard/login?next=%2Fdlq"));
    let (status, _) = post(addr, "/dashboard/queues/pause", &[], "queue=mail").await;
    assert_eq!(status, 401);
    browser
        .find(Locator::Id("token"))
        .await
        .unwrap()
        .send_keys(TOKEN)
        .await
        .unwrap();
    click(&browser, Locator::Id("sign-in")).await;
    wait_text(&browser, "header .mode", "signed in").await;
    assert!(browser
        .current_url()
        .await
        .unwrap()
        .as_str()
        .ends_with("/dashboard/dlq"));

    // overview: a card per queue
    browser.goto(&base).await.unwrap();
    assert_eq!(
        text_of(&browser, "div.card[data-queue='mail'] h3 a").await,
        "mail"
    );
    assert_eq!(
        text_of(&browser, "div.card[data-queue='mail'] .depth").await,
        "0"
    );

    // queues: exact counts
    browser.goto(&format!("{base}/queues")).await.unwrap();
    let cell = |state: &str| format!("tr[data-queue='mail'] td[data-state='{state}']");
    assert_eq!(text_of(&browser, &cell("completed")).await, "3");
    assert_eq!(text_of(&browser, &cell("dead_lettered")).await, "1");
    assert_eq!(text_of(&browser, &cell("scheduled")).await, "1");
    assert_eq!(text_of(&browser, &cell("available")).await, "0");
    let cookie = browser
        .get_named_cookie("ringwork_dashboard")
        .await
        .expect("the session cookie");
    let cookie_header = format!("ringwork_dashboard={}", cookie.value());
    let (status, _) = post(
        addr,
        "/dashboard/queues/pause",
        &[("Cookie", &cookie_header)],
        "queue=mail",
    )
    .await;
    assert_eq!(status, 403, "no CSRF field");
    browser.goto(&format!("{base}/queues")).await.unwrap();
    let csrf = browser
        .find(Locator::Css("tr[data-queue='mail'] input[name='csrf']"))
        .await
        .unwrap()
        .attr("value")
        .await
        .unwrap()
        .expect("a CSRF field");
    let (status, _) = post(
        addr,
        "/dashboard/queues/pause",
        &[
            ("Cookie", &cookie_header),
            ("Origin", "http://evil.example"),
        ],
        &format!("queue=mail&csrf={csrf}"),
    )
    .await;
    assert_eq!(status, 403, "from another site");
    let (status, _) = post(
        addr,
        "/dashboard/queues/pause",
        &[("Cookie", &cookie_header), ("Sec-Fetch-Site", "cross-site")],
        &format!("queue=mail&csrf={csrf}"),
    )
    .await;
    assert_eq!(status, 403, "from another site (fetch metadata)");
    assert!(!storage.queue_counts(Some("mail")).await.unwrap()[0].paused);
    // an empty selection never widens into "all": nothing is purged
    let (status, _) = post(
        addr,
        "/dashboard/dlq/purge",
        &[("Cookie", &cookie_header)],
        &format!("scope=selected&csrf={csrf}"),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(
        storage.queue_counts(Some("mail")).await.unwrap()[0].dead_lettered,
        1
    );

    // pause and resume by clicking
    screenshot(&browser, "queues").await;
    click(&browser, Locator::Css("tr[data-queue='mail'] button")).await;
    wait_text(&browser, "tr[data-queue='mail'] button", "Resume").await;
    assert_eq!(
        text_of(&browser, "tr[data-queue='mail'] span.state").await,
        "paused"
    );
    assert!(storage.queue_counts(Some("mail")).await.unwrap()[0].paused);
    click(&browser, Locator::Css("tr[data-queue='mail'] button")).await;
    wait_text(&browser, "tr[data-queue='mail'] button", "Pause").await;
    assert!(!storage.queue_counts(Some("mail")).await.unwrap()[0].paused);

    // jobs: the completed ones, the script shown as text and never run
    browser
        .goto(&format!("{base}/jobs?state=completed&queue=mail"))
        .await
        .unwrap();
    let rows = browser
        .find_all(Locator::Css("table#jobs tbody tr"))
        .await
        .unwrap();
    assert_eq!(rows.len(), 3);
    let script_cell = text_of(&browser, &format!("tr[data-job='{script_job}'] td.args")).await;
    assert!(script_cell.contains(SCRIPT_ARG), "{script_cell}");
    // the one script element is the dashboard's own file; the arguments' is text
    let scripts = browser.find_all(Locator::Css("script")).await.unwrap();
    assert_eq!(scripts.len(), 1);
    let src = scripts[0].attr("src").await.unwrap().unwrap_or_default();
    assert!(src.ends_with("/dashboard/assets/live.js"), "{src}");
    assert_ne!(browser.title().await.unwrap(), "pwned");
    screenshot(&browser, "jobs").await;

    // a job's page
    click(
        &browser,
        Locator::Css(&format!("tr[data-job='{script_job}'] a")),
    )
    .await;
    assert_eq!(text_of(&browser, "#state").await, "completed");
    assert!(text_of(&browser, "#args").await.contains(SCRIPT_ARG));
    assert_ne!(browser.title().await.unwrap(), "pwned");
    screenshot(&browser, "job").await;

    // the header's search box: a job id and Enter go to that job's page
    browser.goto(&format!("{base}/queues")).await.unwrap();
    browser
        .find(Locator::Css("form.find input[name='id']"))
        .await
        .unwrap()
        .send_keys(&format!("{script_job}\n"))
        .await
        .unwrap();
    wait_text(&browser, "#state", "completed").await;
    assert!(
        browser
            .current_url()
            .await
            .unwrap()
            .path()
            .ends_with(&format!("/jobs/{script_job}")),
        "the search box went to the job's page"
    );

    // the jobs page's argument search, typed into its form: only the job whose arguments hold it
    browser
        .goto(&format!("{base}/jobs?state=completed&queue=mail"))
        .await
        .unwrap();
    browser
        .find(Locator::Css("form.filters input[name='args']"))
        .await
        .unwrap()
        .send_keys("pwned\n")
        .await
        .unwrap();
    assert!(
        eventually(Duration::from_secs(10), || async {
            browser
                .current_url()
                .await
                .is_ok_and(|url| url.query().is_some_and(|q| q.contains("args=pwned")))
        })
        .await,
        "the form was not submitted"
    );
    let only_the_script_job = || async {
        let Ok(rows) = browser
            .find_all(Locator::Css("table#jobs tbody tr[data-job]"))
            .await
        else {
            return false;
        };
        rows.len() == 1
            && rows[0].attr("data-job").await.ok().flatten() == Some(script_job.to_string())
    };
    assert!(
        eventually(Duration::from_secs(10), only_the_script_job).await,
        "the argument search lists the one job whose arguments hold it"
    );

    // the time range, set in the form's own fields and submitted: a range that starts an hour from
    // now lists nothing, one that started an hour ago lists the job again (a datetime-local
    // field's value is the same ISO text in every locale; what typing takes depends on the locale)
    let submit_since = |since: chrono::DateTime<chrono::Utc>| {
        let browser = browser.clone();
        async move {
            // minutes: a datetime-local field drops ":00" seconds from its value, so a time
            // taken on a minute's first second would never read back as it was set
            let since = since.format("%Y-%m-%dT%H:%M").to_string();
            browser
                .execute(
                    "const form = document.querySelector('form.filters');\
                     form.querySelector(\"input[name='since']\").value = arguments[0];\
                     form.submit(); return true;",
                    vec![serde_json::json!(since)],
                )
                .await
                .unwrap();
            let shown = || async {
                let Ok(field) = browser
                    .find(Locator::Css("form.filters input[name='since']"))
                    .await
                else {
                    return false;
                };
                field.attr("value").await.ok().flatten().as_deref() == Some(since.as_str())
                    && browser
                        .current_url()
                        .await
                        .is_ok_and(|url| url.query().is_some_and(|q| q.contains("since=")))
            };
            assert!(
                eventually(Duration::from_secs(10), shown).await,
                "the range from {since} was not submitted"
            );
        }
    };
    submit_since(chrono::Utc::now() + chrono::Duration::hours(1)).await;
    let job_rows = || async {
        browser
            .find_all(Locator::Css("table#jobs tbody tr[data-job]"))
            .await
            .map(|rows| rows.len())
            .unwrap_or(usize::MAX)
    };
    assert_eq!(
        job_rows().await,
        0,
        "nothing finished after an hour from now"
    );
    submit_since(chrono::Utc::now() - chrono::Duration::hours(1)).await;
    assert!(
        eventually(Duration::from_secs(10), only_the_script_job).await,
        "the range from an hour ago lists the job whose arguments hold the text"
    );

    // a column's name orders the queues by that count
    browser.goto(&format!("{base}/queues")).await.unwrap();
    click(
        &browser,
        Locator::Css("table#queues thead a[href*='sort=available']"),
    )
    .await;
    wait_text(&browser, "#queue-order", "Ordered by available").await;

    // the scheduled job can be made due now; it then runs
    browser.goto(&format!("{base}/jobs/{later}")).await.unwrap();
    assert_eq!(text_of(&browser, "#state").await, "scheduled");
    click(&browser, Locator::Id("retry")).await;
    assert!(
        eventually(Duration::from_secs(20), || async {
            storage.job_state(later).await.unwrap().unwrap().state == JobStatus::Completed
        })
        .await,
        "the scheduled job did not run after 'Retry now'"
    );

    // dead letters: retry the failed one from a selection and see it run
    browser.goto(&format!("{base}/dlq")).await.unwrap();
    let error = text_of(&browser, &format!("tr[data-job='{failing}'] td.error")).await;
    assert_eq!(error, "smtp said no <b>550</b>");
    screenshot(&browser, "dead-letters").await;
    healed.store(true, Ordering::SeqCst);
    let runs_before = runs.load(Ordering::SeqCst);
    click(
        &browser,
        Locator::Css(&format!("tr[data-job='{failing}'] input[type='checkbox']")),
    )
    .await;
    click(&browser, Locator::Id("retry-selected")).await;
    assert!(
        eventually(Duration::from_secs(20), || async {
            storage.job_state(failing).await.unwrap().unwrap().state == JobStatus::Completed
        })
        .await,
        "the retried job did not run"
    );
    assert!(runs.load(Ordering::SeqCst) > runs_before);
    browser.goto(&format!("{base}/dlq")).await.unwrap();
    assert!(browser
        .find_all(Locator::Css("table#dead tbody tr"))
        .await
        .unwrap()
        .is_empty());
    browser
        .goto(&format!("{base}/jobs/{failing}"))
        .await
        .unwrap();
    assert_eq!(text_of(&browser, "#state").await, "completed");

    // a workflow: its steps drawn by depth, linked from a step's job page
    let flow = client
        .insert_workflow(
            ringwork::Workflow::new()
                .step(ringwork::Step::new(
                    "fetch",
                    mail("fetch@example.com", false),
                ))
                .step(
                    ringwork::Step::new("north", mail("north@example.com", false))
                        .after(&["fetch"]),
                )
                .step(
                    ringwork::Step::new("south", mail("south@example.com", false))
                        .after(&["fetch"]),
                )
                .step(
                    ringwork::Step::new("report", mail("report@example.com", false))
                        .after(&["north", "south"]),
                ),
        )
        .await
        .unwrap();
    let admin = client.admin();
    assert!(
        eventually(Duration::from_secs(20), || async {
            admin
                .workflow(flow.workflow_id)
                .await
                .unwrap()
                .is_some_and(|w| w.state == ringwork::WorkflowState::Completed)
        })
        .await,
        "the workflow did not complete"
    );
    let report = flow.job_id("report").unwrap();
    browser
        .goto(&format!("{base}/jobs/{report}"))
        .await
        .unwrap();
    click(&browser, Locator::Id("workflow")).await;
    assert_eq!(text_of(&browser, "#workflow-state").await, "completed");
    assert_eq!(
        browser
            .find_all(Locator::Css("#steps .column"))
            .await
            .unwrap()
            .len(),
        3,
        "fetch, then north and south, then report"
    );
    assert!(text_of(&browser, &format!("#step-{report}"))
        .await
        .contains("waits for north, south"));
    screenshot(&browser, "workflow").await;
    // a workflow waiting on a queue nobody works is cancelled from its page
    let stuck = client
        .insert_workflow(
            ringwork::Workflow::new()
                .step(ringwork::Step::new(
                    "export",
                    mail("x@example.com", false).queue("nobody"),
                ))
                .step(
                    ringwork::Step::new("notify", mail("y@example.com", false)).after(&["export"]),
                ),
        )
        .await
        .unwrap();
    browser
        .goto(&format!("{base}/workflows/{}", stuck.workflow_id))
        .await
        .unwrap();
    assert_eq!(text_of(&browser, "#workflow-state").await, "running");
    click(&browser, Locator::Id("cancel-workflow")).await;
    wait_text(&browser, "#workflow-state", "cancelled").await;
    assert_eq!(
        storage
            .job_state(stuck.job_id("notify").unwrap())
            .await
            .unwrap()
            .unwrap()
            .state,
        JobStatus::Cancelled
    );

    // storage health
    browser.goto(&format!("{base}/storage")).await.unwrap();
    assert!(!browser
        .find_all(Locator::Css("table#rings tbody tr"))
        .await
        .unwrap()
        .is_empty());
    assert!(text_of(&browser, "table#tables")
        .await
        .contains("ready_entries"));
    screenshot(&browser, "storage").await;

    // the archive: once a slot with the mail jobs is archived, archive search typed into its
    // form finds the one sent to a@example.com
    let archive_options = ringwork::QueueSlotPrune {
        lock_timeout: Duration::from_millis(250),
        keep_completed: Duration::from_secs(86_400),
        keep_failed: Duration::from_secs(86_400),
        park_idle: None,
    };
    let to_a = ringwork::ArchiveSearch {
        args: serde_json::json!({ "to": "a@example.com" }),
        ..ringwork::ArchiveSearch::default()
    };
    assert!(
        eventually(Duration::from_secs(30), || async {
            storage.rotate_queue_ring(Duration::ZERO).await.unwrap();
            for slot in storage.sealed_queue_slots().await.unwrap() {
                storage
                    .archive_queue_slot_ahead(slot, &archive_options)
                    .await
                    .unwrap();
            }
            let page = storage.search_archive(&to_a, None, 10).await.unwrap();
            !page.jobs.is_empty()
        })
        .await,
        "the mail jobs were not archived"
    );
    browser.goto(&format!("{base}/archive")).await.unwrap();
    browser
        .find(Locator::Css("form.filters input[name='args']"))
        .await
        .unwrap()
        .send_keys("{\"to\": \"a@example.com\"}\n")
        .await
        .unwrap();
    wait_text(&browser, "table#found", "a@example.com").await;
    assert_eq!(
        browser
            .find_all(Locator::Css("table#found tbody tr"))
            .await
            .unwrap()
            .len(),
        1
    );
    screenshot(&browser, "archive").await;

    // live: the queues page updates in place (no reload), and holds still while paused
    browser.goto(&format!("{base}/queues")).await.unwrap();
    wait_text(&browser, "#live", "live").await;
    browser
        .execute("window.notReloaded = true; return true;", vec![])
        .await
        .unwrap();
    let scheduled: i64 = text_of(&browser, &cell("scheduled")).await.parse().unwrap();
    click(&browser, Locator::Css("#live button")).await;
    wait_text(&browser, "#live", "paused").await;
    client
        .insert(
            mail("later-too@example.com", false)
                .run_at(chrono::Utc::now() + chrono::Duration::hours(1)),
        )
        .await
        .unwrap();
    let tick = "return window.ringworkLive.tick().then(function () { return true; });";
    browser.execute(tick, vec![]).await.unwrap();
    assert_eq!(
        text_of(&browser, &cell("scheduled")).await,
        scheduled.to_string(),
        "paused: the page holds still"
    );
    // resuming updates at once
    click(&browser, Locator::Css("#live button")).await;
    wait_text(&browser, &cell("scheduled"), &(scheduled + 1).to_string()).await;
    wait_text(&browser, "#live", "updated").await;
    assert_eq!(
        browser
            .execute("return window.notReloaded === true;", vec![])
            .await
            .unwrap(),
        serde_json::json!(true),
        "updated in place, not reloaded"
    );

    // schedules: a paused one, resumed from its page
    storage.set_schedule_paused("digest", true).await.unwrap();
    browser.goto(&format!("{base}/schedules")).await.unwrap();
    wait_text(&browser, "tr[data-schedule='digest']", "paused").await;
    screenshot(&browser, "schedules").await;
    click(&browser, Locator::Id("resume-digest")).await;
    wait_text(&browser, "#no-schedules", "No schedule").await;
    assert!(storage.schedules().await.unwrap().is_empty());

    // limits: a queue at its running limit, with a key holding a job back
    storage
        .set_queue_limits(
            "reports",
            ringwork::QueueLimits {
                max_running: Some(5),
                rate: Some((600, Duration::from_secs(60))),
                per_key: Some(ringwork::KeyLimit::arg("tenant").max_running(1)),
            },
        )
        .await
        .unwrap();
    let reports: Vec<_> = ["acme", "acme", "globex", "initech"]
        .iter()
        .map(|t| {
            NewJob::from_parts("report", serde_json::json!({ "tenant": t }))
                .unwrap()
                .queue("reports")
        })
        .collect();
    let mut conn = db.pool().acquire().await.unwrap();
    storage.insert_many(&mut conn, &reports).await.unwrap();
    assert_eq!(storage.claim("reports", 10, None).await.unwrap().len(), 3);
    browser.goto(&format!("{base}/limits")).await.unwrap();
    wait_text(
        &browser,
        "section[data-queue='reports'] tr.running",
        "3 / 5",
    )
    .await;
    wait_text(&browser, "section[data-queue='reports'] .held", "1").await;
    screenshot(&browser, "limits").await;

    // callbacks: a job waiting for a partner's answer
    let (waiting, _) = ringwork::testing::waiting_for_callback(
        &db.admin(),
        &mut conn,
        "approvals",
        3,
        Duration::from_secs(3600),
    )
    .await
    .unwrap();
    drop(conn);
    browser.goto(&format!("{base}/callbacks")).await.unwrap();
    wait_text(
        &browser,
        &format!("tr[data-job='{}']", waiting.job_id),
        "approvals",
    )
    .await;
    screenshot(&browser, "callbacks").await;

    // processes: this test's client, working the schema, leads maintenance
    browser.goto(&format!("{base}/processes")).await.unwrap();
    wait_text(&browser, "#leader", "Maintenance is led by the backend").await;
    assert!(text_of(&browser, "table#processes")
        .await
        .contains(&format!("pid {}", std::process::id())));
    screenshot(&browser, "processes").await;

    // a sequence's page: its head waits in a queue nobody works here
    let mut ids = Vec::new();
    for n in 0..3 {
        ids.push(
            client
                .insert(
                    NewJob::from_parts("post", serde_json::json!({ "entry": n }))
                        .unwrap()
                        .queue("ledger")
                        .sequence("account-7", ringwork::DependencyFailure::Hold),
                )
                .await
                .unwrap(),
        );
    }
    browser
        .goto(&format!("{base}/sequences?key=account-7"))
        .await
        .unwrap();
    wait_text(&browser, "#head", &format!("Head: job {}", ids[0])).await;
    assert!(text_of(&browser, "table#bursts")
        .await
        .contains("2 pending"));
    screenshot(&browser, "sequence").await;

    // bulk: cancel every scheduled mail job, through the confirmation page
    browser
        .goto(&format!("{base}/jobs?state=scheduled&queue=mail"))
        .await
        .unwrap();
    let scheduled = storage.queue_counts(Some("mail")).await.unwrap()[0].scheduled;
    assert!(scheduled >= 1);
    click(&browser, Locator::Id("bulk-cancel")).await;
    wait_text(&browser, "#bulk-count", &scheduled.to_string()).await;
    screenshot(&browser, "bulk").await;
    click(&browser, Locator::Id("bulk-confirm")).await;
    wait_text(
        &browser,
        "#bulk-result",
        &format!("Cancelled {scheduled} of {scheduled}"),
    )
    .await;
    assert_eq!(
        storage.queue_counts(Some("mail")).await.unwrap()[0].scheduled,
        0
    );

    // the overview again: by now it has samples, and the retried jobs show as throughput
    browser.goto(&base).await.unwrap();
    let points = browser
        .find(Locator::Css("div.card[data-queue='mail'] polyline"))
        .await
        .unwrap()
        .attr("points")
        .await
        .unwrap()
        .unwrap_or_default();
    assert!(points.split(' ').count() >= 2, "a sparkline: {points:?}");
    screenshot(&browser, "overview").await;

    browser.close().await.unwrap();
    drop(driver);
    serve.start_kill().unwrap();
    running.shutdown(Duration::from_secs(5)).await;
    db.drop().await.unwrap();
}

#[tokio::test]
async fn a_read_only_dashboard_refuses_every_action() {
    let db = TestDatabase::new().await.unwrap();
    db.storage().ensure_queue("ro_q").await.unwrap();
    let (mut serve, addr) = common::spawn_serve(&[
        "--no-maintenance",
        "--dashboard",
        "--database-url",
        db.url(),
        "--schema",
        db.schema().as_str(),
    ])
    .await;
    for path in [
        "/dashboard/queues/pause",
        "/dashboard/dlq/purge",
        "/dashboard/jobs/1/cancel",
    ] {
        let (status, body) = post(addr, path, &[], "queue=ro_q&csrf=x").await;
        assert_eq!(status, 403, "{path}");
        assert!(body.contains("read-only"), "{body}");
    }
    // a bearer token means nothing without one configured
    let (status, _) = post(
        addr,
        "/dashboard/queues/pause",
        &[("Authorization", "Bearer anything-at-all-here")],
        "queue=ro_q",
    )
    .await;
    assert_eq!(status, 403);
    assert!(!db.storage().queue_counts(Some("ro_q")).await.unwrap()[0].paused);
    // a short token is refused at start
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_ringwork"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--dashboard-token",
            "short",
        ])
        .args(["--database-url", db.url(), "--schema", db.schema().as_str()])
        .output()
        .await
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("at least 16 characters"));
    serve.start_kill().unwrap();
    db.drop().await.unwrap();
}
