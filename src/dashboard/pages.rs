//! The pages. maud escapes every value it interpolates: job arguments, errors, queue and kind
//! names are user data and reach the page only as text.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use chrono::{DateTime, Utc};
use maud::{html, Markup, DOCTYPE};

use super::{failure, ListQuery, Shared};
use crate::storage::{QueueCounts, ReplicaStatus};
use crate::JobStatus;

const PAGE_SIZE: usize = 50;

type AppState = State<Arc<Shared>>;

/// A URL query string (`a=1&b=x%20y`).
pub(crate) fn query(pairs: &[(&str, &str)]) -> String {
    serde_urlencoded::to_string(pairs).unwrap_or_default()
}

/// A page of its own, without the dashboard's links (refusals and errors).
/// A refusal or error, as a page. A bare page here; the dashboard's `in_layout` step shows it
/// inside the layout (nav, stylesheet) for every request that passed the Host check.
pub(crate) fn message_page(title: &str, message: &str) -> Response {
    let mut response = Html(
        html! {
            (DOCTYPE)
            html lang="en" {
                head { meta charset="utf-8"; title { "ringwork · " (title) } }
                body { h1 { (title) } p.error { (message) } }
            }
        }
        .into_string(),
    )
    .into_response();
    response.extensions_mut().insert(Message {
        title: title.to_string(),
        message: message.to_string(),
    });
    response
}

/// What `message_page` showed, for `in_layout`.
#[derive(Clone)]
pub(crate) struct Message {
    title: String,
    message: String,
}

/// The message inside the layout.
/// It reads nothing from the database: a refusal or a busy server must not wait for a connection.
pub(crate) fn message_in_layout(
    shared: &Shared,
    headers: &HeaderMap,
    message: &Message,
) -> Response {
    let body = html! { h1 { (message.title) } p.error { (message.message) } };
    render_page(shared, headers, "", &message.title, body, None, false)
}

/// What a page says of where it read: nothing on a primary, how stale it may be on a hot standby.
enum Staleness {
    Primary,
    Standby(ReplicaStatus),
    Unknown,
}

/// Where the pages read: a hot standby (`Dashboard::read_from`) says how stale it may be.
async fn staleness(shared: &Shared) -> Staleness {
    match shared.reads.replica_status().await {
        Ok(None) => Staleness::Primary,
        Ok(Some(replica)) => Staleness::Standby(replica),
        Err(_) => Staleness::Unknown,
    }
}

/// A page in the layout that updates itself while it is open (live.js).
async fn layout(
    shared: &Shared,
    headers: &HeaderMap,
    here: &str,
    title: &str,
    body: Markup,
) -> Response {
    let staleness = staleness(shared).await;
    render_page(shared, headers, here, title, body, Some(staleness), true)
}

/// A page in the layout that stays as it was shown: a form the operator fills or confirms (its
/// cutoff is the time it was shown), or what an action did.
async fn still_layout(
    shared: &Shared,
    headers: &HeaderMap,
    here: &str,
    title: &str,
    body: Markup,
) -> Response {
    let staleness = staleness(shared).await;
    render_page(shared, headers, here, title, body, Some(staleness), false)
}

fn render_page(
    shared: &Shared,
    headers: &HeaderMap,
    here: &str,
    title: &str,
    body: Markup,
    staleness: Option<Staleness>,
    live: bool,
) -> Response {
    let live_secs = shared
        .live_every
        .filter(|_| live)
        .map(|every| every.as_secs().max(1));
    let replica = match staleness {
        Some(Staleness::Standby(replica)) => Some(replica.describe()),
        Some(Staleness::Unknown) => Some(
            "whether this server is a standby, and so how current this page is, could not be read"
                .to_string(),
        ),
        Some(Staleness::Primary) | None => None,
    };
    let nav = [
        ("overview", "/", "Overview"),
        ("queues", "/queues", "Queues"),
        ("jobs", "/jobs", "Jobs"),
        ("callbacks", "/callbacks", "Callbacks"),
        ("schedules", "/schedules", "Schedules"),
        ("limits", "/limits", "Limits"),
        ("processes", "/processes", "Processes"),
        ("dlq", "/dlq", "Dead letters"),
        ("archive", "/archive", "Archive"),
        ("storage", "/storage", "Storage"),
    ];
    let mode = match (&shared.actions, shared.may_act(headers)) {
        (super::Actions::ReadOnly, _) => html! { "read-only" },
        (super::Actions::BehindProxy, _) => html! { "actions on (behind your proxy)" },
        (super::Actions::Token(_), true) => html! {
            "signed in · "
            form.inline method="post" action=(shared.href("/logout")) {
                (csrf_field(shared)) button type="submit" { "sign out" }
            }
        },
        (super::Actions::Token(_), false) => html! {
            "signed out · " a href=(shared.href("/login")) { "sign in" }
        },
    };
    Html(
        html! {
            (DOCTYPE)
            html lang="en" {
                head {
                    meta charset="utf-8";
                    meta name="viewport" content="width=device-width, initial-scale=1";
                    title { "ringwork · " (title) }
                    link rel="stylesheet" href=(shared.href("/assets/style.css"));
                    @if live_secs.is_some() {
                        script src=(shared.href("/assets/live.js")) defer {}
                    }
                }
                body {
                    header {
                        span.brand { "ringwork" }
                        nav {
                            @for (id, path, label) in nav {
                                a class=@if id == here { "here" } href=(shared.href(path)) { (label) }
                            }
                        }
                        form.find method="get" action=(shared.href("/jobs/find")) {
                            input type="search" name="id" placeholder="job id" aria-label="job id" inputmode="numeric";
                        }
                        @if live_secs.is_some() {
                            // shown by live.js: without the script the page is as it was read
                            span id="live" hidden { span {} " " button type="button" { "pause" } }
                        }
                        span.mode { "schema " (shared.storage.schema().as_str()) " · " (mode) }
                    }
                    @if let Some(replica) = &replica {
                        p.replica { (replica) }
                    }
                    main data-live=[live_secs] { (body) }
                }
            }
        }
        .into_string(),
    )
    .into_response()
}

fn csrf_field(shared: &Shared) -> Markup {
    html! { input type="hidden" name="csrf" value=(shared.csrf); }
}

/// The jobs page for the jobs of one state that finished within an archive bucket's span (the
/// ring's newer ones of that span too, which is the listing's way: it reads both).
fn bucket_jobs(state: &str, bucket: &crate::storage::ArchiveSpan) -> String {
    const FIELD: &str = "%Y-%m-%dT%H:%M:%S";
    let since = bucket.oldest.format(FIELD);
    // the field keeps whole seconds: the second after the newest includes it
    let before = (bucket.newest + chrono::Duration::seconds(1)).format(FIELD);
    format!("/jobs?state={state}&since={since}&before={before}")
}

fn when(at: DateTime<Utc>) -> String {
    at.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

fn ago(at: DateTime<Utc>) -> String {
    let secs = (Utc::now() - at).num_seconds();
    let (n, unit) = if secs.abs() < 120 {
        (secs, "s")
    } else if secs.abs() < 7200 {
        (secs / 60, "min")
    } else if secs.abs() < 172_800 {
        (secs / 3600, "h")
    } else {
        (secs / 86_400, "d")
    };
    if n < 0 {
        format!("in {}{unit}", -n)
    } else {
        format!("{n}{unit} ago")
    }
}

/// Compact JSON, cut to `max` characters (on a character boundary).
/// How much of a job's arguments its page shows.
const JOB_PAGE_ARGS_CHARS: usize = 65_536;

/// Arguments pretty-printed when they decode, else as stored (cut, or holding what this binary
/// cannot decode, such as a number beyond f64).
fn readable_args(args: &crate::ArgsText) -> String {
    if args.is_cut() {
        return args.text.clone();
    }
    serde_json::from_str::<serde_json::Value>(&args.text)
        .ok()
        .and_then(|value| serde_json::to_string_pretty(&value).ok())
        .unwrap_or_else(|| args.text.clone())
}

fn state_badge(state: &str) -> Markup {
    html! { span class={ "state " (state) } { (state) } }
}

fn jobs_link(shared: &Shared, state: JobStatus, queue: &str) -> String {
    shared.href(&format!(
        "/jobs?{}",
        query(&[("state", state.as_str()), ("queue", queue)])
    ))
}

/// A sparkline of `values` (oldest first) as an inline SVG polyline.
fn sparkline(values: &[f64], bad: bool) -> Markup {
    let (w, h) = (240.0, 36.0);
    let max = values.iter().cloned().fold(0.0_f64, f64::max);
    let points: Vec<String> = values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let x = if values.len() > 1 {
                i as f64 * w / (values.len() - 1) as f64
            } else {
                w
            };
            let y = if max > 0.0 {
                h - 2.0 - v / max * (h - 4.0)
            } else {
                h - 2.0
            };
            format!("{x:.1},{y:.1}")
        })
        .collect();
    html! {
        svg viewBox="0 0 240 36" preserveAspectRatio="none" role="img" {
            polyline class=@if bad { "bad" } points=(points.join(" ")) {}
        }
    }
}

/// How many queues the queues page shows at once.
const QUEUES_PER_PAGE: usize = 50;
/// How many queue cards the overview shows at once: each card costs its count and, when it has
/// available jobs, the probes of the "not worked" mark (at 1,000 queues, 50 cards took 340 ms at
/// p95 on the 2-core machine; 24 stay under 200 ms).
const CARDS_PER_PAGE: usize = 24;

/// Query parameters of the pages that list queues: a page key and a name filter; on the queues
/// page, a count to order by (`sort`) and the page of that order (`page`, from 0).
#[derive(serde::Deserialize, Default)]
pub(crate) struct QueuePageQuery {
    after: Option<String>,
    filter: Option<String>,
    sort: Option<String>,
    page: Option<usize>,
}

/// A count the queues page can order by: its name in the URL, and the count.
type QueueSort = (&'static str, fn(&QueueCounts) -> i64);

/// The counts the queues page can order by, most first.
const QUEUE_SORTS: [QueueSort; 10] = [
    ("available", |q| q.available),
    ("scheduled", |q| q.scheduled),
    ("retryable", |q| q.retryable),
    ("running", |q| q.running),
    ("waiting", |q| q.waiting),
    ("pending", |q| q.pending),
    ("completed", |q| q.completed),
    ("failed", |q| q.failed),
    ("cancelled", |q| q.cancelled),
    ("dead_lettered", |q| q.dead_lettered),
];

/// A page of queues ordered by a count, most first. The order comes from the dashboard's latest
/// sample of every queue's counts (ordering 1,000 queues by their current counts would count all
/// of them on every load); the counts shown are read now, for the page's queues only. `None`
/// before the first sample.
struct SortedPage {
    queues: Vec<QueueCounts>,
    sampled_at: DateTime<Utc>,
    next: Option<String>,
}

async fn sorted_queue_page(
    shared: &Shared,
    params: &QueuePageQuery,
    sort: QueueSort,
) -> crate::Result<Option<SortedPage>> {
    let filter = ListQuery::get(&params.filter);
    let page = params.page.unwrap_or(0);
    let (sampled_at, ranked) = {
        let Ok(history) = shared.history.lock() else {
            return Ok(None);
        };
        let Some(sample) = history.latest() else {
            return Ok(None);
        };
        let mut ranked: Vec<(i64, String)> = sample
            .queues
            .iter()
            .filter(|q| filter.is_none_or(|f| q.queue.contains(f)))
            .map(|q| (sort.1(q), q.queue.clone()))
            .collect();
        ranked.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        (sample.at, ranked)
    };
    let names: Vec<String> = ranked
        .iter()
        .skip(page.saturating_mul(QUEUES_PER_PAGE))
        .take(QUEUES_PER_PAGE)
        .map(|(_, name)| name.clone())
        .collect();
    let mut queues = shared.reads.queue_counts_of(&names).await?;
    // back into the sample's order
    queues.sort_by_key(|q| names.iter().position(|n| *n == q.queue));
    let next = (ranked.len() > (page + 1) * QUEUES_PER_PAGE).then(|| {
        let next_page = (page + 1).to_string();
        let mut pairs = vec![("sort", sort.0), ("page", next_page.as_str())];
        if let Some(filter) = filter {
            pairs.push(("filter", filter));
        }
        format!("{}?{}", shared.href("/queues"), query(&pairs))
    });
    Ok(Some(SortedPage {
        queues,
        sampled_at,
        next,
    }))
}

/// One page of queues with their counts, and the link to the next page.
async fn queue_page(
    shared: &Shared,
    path: &str,
    params: &QueuePageQuery,
    per_page: usize,
) -> crate::Result<(Vec<QueueCounts>, Option<String>)> {
    let filter = ListQuery::get(&params.filter);
    let (queues, next) = shared
        .reads
        .queue_counts_page(ListQuery::get(&params.after), filter, per_page)
        .await?;
    let next = next.map(|after| {
        let mut pairs = vec![("after", after.as_str())];
        if let Some(filter) = filter {
            pairs.push(("filter", filter));
        }
        format!("{}?{}", shared.href(path), query(&pairs))
    });
    Ok((queues, next))
}

/// The name filter of a queue listing.
fn queue_filter(shared: &Shared, path: &str, params: &QueuePageQuery) -> Markup {
    html! {
        form.filters method="get" action=(shared.href(path)) {
            label { "queue name contains"
                input type="search" name="filter" value=(ListQuery::get(&params.filter).unwrap_or("")); }
            @if let Some(sort) = ListQuery::get(&params.sort) { input type="hidden" name="sort" value=(sort); }
            button type="submit" { "Show" }
        }
    }
}

/// How long a queue's available jobs wait, unclaimed, before its card is marked "not worked"
/// (as `ringwork status --unworked-after`'s default).
const UNWORKED_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

pub(crate) async fn overview(
    State(shared): AppState,
    headers: HeaderMap,
    Query(params): Query<QueuePageQuery>,
) -> Response {
    let (queues, next) = match queue_page(&shared, "/", &params, CARDS_PER_PAGE).await {
        Ok(page) => page,
        Err(e) => return failure(e),
    };
    // a queue on this page whose available jobs nobody takes gets a mark (a bounded read: only
    // the page's queues that hold available jobs are probed)
    let mut unworked = Vec::with_capacity(queues.len());
    // on a standby, waits and claim ages are the primary's as of the last replayed commit, read
    // against the standby's clock: they look older by the replay's age, so the bound is that much
    // longer
    let staleness = staleness(&shared).await;
    let behind = match &staleness {
        Staleness::Standby(replica) => {
            std::time::Duration::from_secs_f64(replica.replay_age_secs.unwrap_or(0.0).max(0.0))
        }
        _ => std::time::Duration::ZERO,
    };
    for q in &queues {
        // a probe that fails leaves that card unmarked rather than failing the page
        let found = crate::admin::unworked_queue(&shared.reads, q, UNWORKED_AFTER + behind).await;
        unworked.push(matches!(found, Ok(Some(_))));
    }
    let (since, series): (_, Vec<_>) = match shared.history.lock() {
        Ok(history) => (
            history.first_at(),
            queues.iter().map(|q| history.series(&q.queue)).collect(),
        ),
        Err(_) => (None, queues.iter().map(|_| Vec::new()).collect()),
    };
    let body = html! {
        h1 { "Overview" }
        p.muted {
            "Throughput, failures and depth over the last hour, sampled by this server"
            @if let Some(since) = since { " since " (when(since)) } "."
        }
        (queue_filter(&shared, "/", &params))
        @if queues.is_empty() { p { "No queues yet: a queue appears with its first job." } }
        div.cards {
            @for ((q, points), not_worked) in queues.iter().zip(&series).zip(&unworked) {
                @let completed: Vec<f64> = points.iter().map(|p| p.1).collect();
                @let failures: Vec<f64> = points.iter().map(|p| p.2).collect();
                @let depth: Vec<f64> = points.iter().map(|p| p.3 as f64).collect();
                div.card data-queue=(q.queue) {
                    h3 {
                        a href=(jobs_link(&shared, JobStatus::Available, &q.queue)) { (q.queue) }
                        @if q.paused { " " span class="state paused" { "paused" } }
                        @if *not_worked {
                            " " span class="state unworked"
                                title="available jobs have waited a minute or more and no process claimed from this queue meanwhile: is a worker declaring it running?" { "not worked" }
                        }
                    }
                    div.spark {
                        span { "completed / min" } (sparkline(&completed, false))
                        span.num { (completed.last().map(|v| format!("{v:.0}")).unwrap_or_else(|| "–".into())) }
                        span { "failed / min" } (sparkline(&failures, true))
                        span.num { (failures.last().map(|v| format!("{v:.0}")).unwrap_or_else(|| "–".into())) }
                        span { "available" } (sparkline(&depth, false))
                        span.num.depth { (q.available) }
                    }
                    p.muted {
                        (q.running) " running · " (q.waiting) " waiting for a callback · " (q.scheduled + q.retryable) " waiting for their time · "
                        @if q.pending > 0 { (q.pending) " pending (waiting for the jobs before them) · " }
                        (q.completed) " completed · " (q.failed) " failed · " (q.dead_lettered) " dead-lettered"
                    }
                }
            }
        }
        @if let Some(next) = next { p.pager { a id="next" href=(next) { "Next queues →" } } }
    };
    render_page(
        &shared,
        &headers,
        "overview",
        "Overview",
        body,
        Some(staleness),
        true,
    )
}

fn counts_row(shared: &Shared, q: &QueueCounts, may_act: bool) -> Markup {
    let cell = |state: JobStatus, n: i64| {
        html! { td.num data-state=(state.as_str()) { a href=(jobs_link(shared, state, &q.queue)) { (n) } } }
    };
    html! {
        tr data-queue=(q.queue) {
            td { (q.queue) @if q.paused { " " span class="state paused" { "paused" } } }
            (cell(JobStatus::Available, q.available))
            (cell(JobStatus::Scheduled, q.scheduled))
            (cell(JobStatus::Retryable, q.retryable))
            (cell(JobStatus::Running, q.running))
            (cell(JobStatus::Waiting, q.waiting))
            (cell(JobStatus::Pending, q.pending))
            (cell(JobStatus::Completed, q.completed))
            (cell(JobStatus::Failed, q.failed))
            (cell(JobStatus::Cancelled, q.cancelled))
            (cell(JobStatus::DeadLettered, q.dead_lettered))
            @if may_act {
                td {
                    form.inline method="post"
                        action=(shared.href(if q.paused { "/queues/resume" } else { "/queues/pause" })) {
                        (csrf_field(shared))
                        input type="hidden" name="queue" value=(q.queue);
                        button type="submit" name="do" value=(if q.paused { "resume" } else { "pause" }) {
                            (if q.paused { "Resume" } else { "Pause" })
                        }
                    }
                }
            }
        }
    }
}

pub(crate) async fn queues(
    State(shared): AppState,
    headers: HeaderMap,
    Query(params): Query<QueuePageQuery>,
) -> Response {
    let sort = match ListQuery::get(&params.sort) {
        None => None,
        Some(name) => match QUEUE_SORTS.iter().find(|(n, _)| *n == name) {
            Some(sort) => Some(*sort),
            None => {
                return (
                    StatusCode::BAD_REQUEST,
                    message_page("Error", &format!("cannot order queues by {name:?}")),
                )
                    .into_response()
            }
        },
    };
    let sorted = match sort {
        Some(sort) => match sorted_queue_page(&shared, &params, sort).await {
            Ok(sorted) => sorted,
            Err(e) => return failure(e),
        },
        None => None,
    };
    let (queues, next, order_note) = match sorted {
        Some(page) => (
            page.queues,
            page.next,
            Some(format!(
                "Ordered by {}, most first, as of the dashboard's sample at {} (the counts shown are read now).",
                sort.map_or("", |s| s.0),
                when(page.sampled_at)
            )),
        ),
        None => match queue_page(&shared, "/queues", &params, QUEUES_PER_PAGE).await {
            Ok((queues, next)) => (
                queues,
                next,
                sort.map(|_| "No sample of the counts yet: shown by name.".to_string()),
            ),
            Err(e) => return failure(e),
        },
    };
    let may_act = shared.may_act(&headers);
    let sort_link = |name: &str, label: &str| {
        let mut pairs = vec![("sort", name)];
        if let Some(filter) = ListQuery::get(&params.filter) {
            pairs.push(("filter", filter));
        }
        html! { a href={ (shared.href("/queues")) "?" (query(&pairs)) } title={ "order by " (label) ", most first" } { (label) } }
    };
    let body = html! {
        h1 { "Queues" }
        p.muted { "Exact counts (no estimates). Completed, failed and cancelled are durable totals. A column's name orders the queues by it." }
        (queue_filter(&shared, "/queues", &params))
        @if let Some(note) = &order_note { p.muted id="queue-order" { (note) " " a href=(shared.href("/queues")) { "By name" } } }
        table id="queues" {
            thead { tr {
                th { "queue" }
                // the columns are the counts the page can order by, in counts_row's order
                @for (name, _) in QUEUE_SORTS { th.num { (sort_link(name, &name.replace('_', "-"))) } }
                @if may_act { th { "" } }
            } }
            tbody { @for q in &queues { (counts_row(&shared, q, may_act)) } }
        }
        @if let Some(next) = next { p.pager { a id="next" href=(next) { "Next queues →" } } }
    };
    layout(&shared, &headers, "queues", "Queues", body).await
}

/// A time field of the jobs page (`datetime-local`, read as UTC).
fn time_field(value: Option<&str>) -> Result<Option<DateTime<Utc>>, String> {
    let Some(value) = value else {
        return Ok(None);
    };
    [
        "%Y-%m-%dT%H:%M:%S%.f",
        "%Y-%m-%dT%H:%M",
        "%Y-%m-%d %H:%M:%S%.f",
        "%Y-%m-%d",
    ]
    .iter()
    .find_map(|format| {
        chrono::NaiveDateTime::parse_from_str(value, format)
            .ok()
            .or_else(|| {
                chrono::NaiveDate::parse_from_str(value, format)
                    .ok()
                    .and_then(|d| d.and_hms_opt(0, 0, 0))
            })
    })
    .map(|t| Some(t.and_utc()))
    .ok_or_else(|| format!("{value:?} is not a time: use YYYY-MM-DDTHH:MM[:SS] (UTC)"))
}

/// A listing's time range, `(before, since)`: either end may be open.
type TimeRange = (Option<DateTime<Utc>>, Option<DateTime<Utc>>);

/// A listing's time range from its `before` and `since` fields.
fn time_range(params: &ListQuery) -> Result<TimeRange, String> {
    Ok((
        time_field(ListQuery::get(&params.before))?,
        time_field(ListQuery::get(&params.since))?,
    ))
}

/// How many jobs of a listing one page reads at most when it filters by arguments: a bounded
/// search of what the listing walks anyway, never a scan of a whole state.
const ARGS_SCAN_ROWS: usize = 2_000;

/// A page of the jobs page: the jobs shown, the key to go on from, and how many were read.
struct FilteredPage {
    jobs: Vec<crate::ListedJob>,
    next: Option<String>,
    examined: usize,
}

/// One page of a listing from `start`, keeping the jobs that finished at or after `since` and
/// whose arguments hold `args`: pages of the listing are read until the page is full, the listing
/// (newest first) passes `since`, or `ARGS_SCAN_ROWS` jobs were read.
async fn filtered_page(
    shared: &Shared,
    state: JobStatus,
    queue: Option<&str>,
    kind: Option<&str>,
    start: Option<String>,
    since: Option<DateTime<Utc>>,
    args: Option<&str>,
) -> crate::Result<FilteredPage> {
    let mut kept = Vec::new();
    let mut examined = 0;
    let mut from = start;
    loop {
        let page = shared
            .reads
            .list_jobs(state, queue, kind, from.as_deref(), PAGE_SIZE)
            .await?;
        let mut last_key = None;
        let read = page.jobs.len();
        let mut taken = 0;
        for job in page.jobs {
            examined += 1;
            taken += 1;
            if since.is_some_and(|since| job.at < since) {
                // newest first: everything after this one is older still
                return Ok(FilteredPage {
                    jobs: kept,
                    next: None,
                    examined,
                });
            }
            last_key = Some(job.page_key.clone());
            if args.is_none_or(|a| job.args.contains(a)) {
                kept.push(job);
                if kept.len() == PAGE_SIZE {
                    break;
                }
            }
        }
        let more = page.next.is_some();
        if kept.len() == PAGE_SIZE || !more || args.is_none() || examined >= ARGS_SCAN_ROWS {
            // go on after the last job read; a full page stops at its last kept job, and has a
            // next page only if something is left to read after it
            let next = if kept.len() == PAGE_SIZE {
                (more || taken < read).then(|| kept[PAGE_SIZE - 1].page_key.clone())
            } else if more {
                last_key.or(page.next)
            } else {
                None
            };
            return Ok(FilteredPage {
                jobs: kept,
                next,
                examined,
            });
        }
        from = last_key.or(page.next);
    }
}

/// Up to how many queues the jobs page offers as a pick list.
const QUEUE_PICK_LIST: usize = 200;

pub(crate) async fn jobs(
    State(shared): AppState,
    headers: HeaderMap,
    Query(params): Query<ListQuery>,
) -> Response {
    let state_name = ListQuery::get(&params.state).unwrap_or("available");
    let state: JobStatus = match state_name.parse() {
        Ok(state) => state,
        Err(_) => {
            return (
                StatusCode::BAD_REQUEST,
                message_page("Error", &format!("unknown job state {state_name:?}")),
            )
                .into_response()
        }
    };
    let queue = ListQuery::get(&params.queue);
    let kind = ListQuery::get(&params.kind);
    let bad = |message: String| {
        (StatusCode::BAD_REQUEST, message_page("Error", &message)).into_response()
    };
    let (before, since) = match time_range(&params) {
        Ok(range) => range,
        Err(e) => return bad(e),
    };
    let newest_first = crate::storage::Storage::page_key_before(state, Utc::now()).is_some();
    if (before.is_some() || since.is_some()) && !newest_first {
        return bad(format!(
            "a time range applies to completed, failed, cancelled and dead-lettered jobs, not to {} ones",
            state.as_str()
        ));
    }
    let args_filter = ListQuery::get(&params.args);
    if args_filter.is_some_and(|a| a.chars().count() > 200 || a.contains('\0')) {
        return bad("the arguments filter holds at most 200 characters".into());
    }
    let start = ListQuery::get(&params.after)
        .map(str::to_string)
        .or_else(|| before.and_then(|at| crate::storage::Storage::page_key_before(state, at)));
    let scan = match filtered_page(&shared, state, queue, kind, start, since, args_filter).await {
        Ok(scan) => scan,
        Err(e) => return failure(e),
    };
    let page = crate::JobPage {
        jobs: scan.jobs,
        next: scan.next,
    };
    let queues = shared.reads.queue_names().await.unwrap_or_default();
    let time_label = match state {
        JobStatus::Pending => "added",
        JobStatus::Available | JobStatus::Scheduled | JobStatus::Retryable => "due",
        JobStatus::Running => "claimed",
        JobStatus::Waiting => "times out",
        JobStatus::DeadLettered => "failed",
        _ => "finished",
    };
    let since_text = ListQuery::get(&params.since).unwrap_or("");
    let next = page.next.as_ref().map(|after| {
        let mut pairs = list_pairs(state, queue, kind);
        pairs.push(("after", after.as_str()));
        if since.is_some() {
            pairs.push(("since", since_text));
        }
        if let Some(args) = args_filter {
            pairs.push(("args", args));
        }
        shared.href(&format!("/jobs?{}", query(&pairs)))
    });
    let body = html! {
        h1 { "Jobs" }
        form.filters method="get" action=(shared.href("/jobs")) {
            label { "state"
                select name="state" {
                    @for s in JobStatus::ALL {
                        option value=(s.as_str()) selected[s == state] { (s.as_str()) }
                    }
                }
            }
            label { "queue (empty: any)"
                input type="search" name="queue" list="queue-names" value=(queue.unwrap_or(""));
            }
            // a pick list while it stays short; with many queues, the name is typed
            @if queues.len() <= QUEUE_PICK_LIST {
                datalist id="queue-names" { @for q in &queues { option value=(q) {} } }
            }
            label { "kind" input type="text" name="kind" value=(kind.unwrap_or("")); }
            label title="completed, failed, cancelled and dead-lettered jobs: finished at or after (UTC)" {
                "finished since (UTC)"
                input type="datetime-local" step="1" name="since" value=(since_text);
            }
            label title="completed, failed, cancelled and dead-lettered jobs: finished before (UTC)" {
                "finished before (UTC)"
                input type="datetime-local" step="1" name="before" value=(ListQuery::get(&params.before).unwrap_or(""));
            }
            label title="text in the first 200 characters of the arguments' JSON" {
                "arguments contain"
                input type="search" name="args" value=(args_filter.unwrap_or(""));
            }
            button type="submit" { "Show" }
        }
        @if args_filter.is_some() {
            p.muted id="args-scope" {
                "Arguments are searched in the first 200 characters of each job's JSON, over at most "
                (ARGS_SCAN_ROWS) " jobs of the listing per page"
                @if scan.examined >= ARGS_SCAN_ROWS && page.next.is_some() { ": this page stopped there, the next one goes on" }
                "."
            }
        }
        table id="jobs" {
            thead { tr {
                th { "id" } th { "queue" } th { "kind" } th { "state" } th.num { "attempt" }
                th { (time_label) } th { "args" } th { "detail" }
            } }
            tbody {
                @for job in &page.jobs {
                    tr data-job=(job.job_id) {
                        td { a href=(shared.href(&format!("/jobs/{}", job.job_id))) { (job.job_id) } }
                        td { (job.queue) } td { (job.kind) } td { (state_badge(job.state.as_str())) }
                        td.num { (job.attempt) }
                        td title=(when(job.at)) { (ago(job.at)) }
                        td.args { (job.args) }
                        td.error { (job.detail.as_deref().unwrap_or("")) }
                    }
                }
            }
        }
        @if page.jobs.is_empty() { p.muted { "No " (state.as_str()) " jobs" @if let Some(q) = queue { " in " (q) } "." } }
        @if let Some(next) = next { p.pager { a id="next" href=(next) { "Next page →" } } }
        // bulk actions act on state, queue and kind: not offered under a time or argument
        // filter, whose narrower set they would not respect
        @if shared.may_act(&headers) && !page.jobs.is_empty() && before.is_none() && since.is_none() && args_filter.is_none() {
            @let bulk = BulkAction::ALL.iter().filter(|a| a.applies_to(state)).collect::<Vec<_>>();
            @if !bulk.is_empty() {
                div.actions id="bulk" {
                    @for action in bulk {
                        a.button href=(bulk_href(&shared, *action, state, queue, kind)) id={ "bulk-" (action.as_str()) } {
                            (action.label()) " every " (state.as_str()) " job shown by this filter…"
                        }
                    }
                }
            }
        }
    };
    layout(&shared, &headers, "jobs", "Jobs", body).await
}

/// A bulk action of the jobs page: on every job a filter (state, queue, kind) selects, in the
/// bounded steps of `Admin::bulk_cancel` and `bulk_retry`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum BulkAction {
    Cancel,
    Retry,
}

impl BulkAction {
    pub(crate) const ALL: [BulkAction; 2] = [BulkAction::Cancel, BulkAction::Retry];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Cancel => "cancel",
            Self::Retry => "retry",
        }
    }

    pub(crate) fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.as_str() == name)
    }

    fn label(self) -> &'static str {
        match self {
            Self::Cancel => "Cancel",
            Self::Retry => "Retry",
        }
    }

    /// Whether it acts on jobs of `state` (the bulk API's own lists).
    pub(crate) fn applies_to(self, state: JobStatus) -> bool {
        match self {
            Self::Cancel => crate::storage::BULK_CANCEL_STATES.contains(&state),
            Self::Retry => crate::storage::BULK_RETRY_STATES.contains(&state),
        }
    }
}

/// The query pairs of a jobs list: its state, and its queue and kind when given.
pub(crate) fn list_pairs<'a>(
    state: JobStatus,
    queue: Option<&'a str>,
    kind: Option<&'a str>,
) -> Vec<(&'static str, &'a str)> {
    let mut pairs = vec![("state", state.as_str())];
    pairs.extend(queue.map(|q| ("queue", q)));
    pairs.extend(kind.map(|k| ("kind", k)));
    pairs
}

fn bulk_href(
    shared: &Shared,
    action: BulkAction,
    state: JobStatus,
    queue: Option<&str>,
    kind: Option<&str>,
) -> String {
    let mut pairs = vec![("action", action.as_str())];
    pairs.extend(list_pairs(state, queue, kind));
    shared.href(&format!("/jobs/bulk?{}", query(&pairs)))
}

/// How many jobs of `state` the counts hold, where they count it exactly.
fn state_count(counts: &[QueueCounts], state: JobStatus) -> Option<i64> {
    let of = |q: &QueueCounts| match state {
        JobStatus::Available => Some(q.available),
        JobStatus::Scheduled => Some(q.scheduled),
        JobStatus::Retryable => Some(q.retryable),
        JobStatus::Running => Some(q.running),
        JobStatus::Waiting => Some(q.waiting),
        JobStatus::Pending => Some(q.pending),
        JobStatus::DeadLettered => Some(q.dead_lettered),
        _ => None,
    };
    counts.iter().map(of).sum()
}

#[derive(serde::Deserialize, Default)]
pub(crate) struct FindQuery {
    id: Option<String>,
}

/// The header's search box: a job id goes to that job's page.
pub(crate) async fn find_job(State(shared): AppState, Query(asked): Query<FindQuery>) -> Response {
    let given = asked.id.as_deref().unwrap_or("").trim();
    match given.trim_start_matches('#').parse::<i64>() {
        Ok(id) if id > 0 => super::see_other(shared.href(&format!("/jobs/{id}"))),
        _ => (
            StatusCode::BAD_REQUEST,
            message_page(
                "Error",
                &format!("{given:?} is not a job id: a job id is a positive whole number"),
            ),
        )
            .into_response(),
    }
}

/// Query of the bulk confirmation page.
#[derive(serde::Deserialize, Default)]
pub(crate) struct BulkQuery {
    action: Option<String>,
    state: Option<String>,
    queue: Option<String>,
    kind: Option<String>,
}

/// The confirmation of a bulk action: what it will act on and how many jobs that is now, and the
/// form that does it. Only jobs created (or, dead-lettered, failed) before this page was shown are
/// touched: work that arrives while the operator reads is not what they confirmed.
pub(crate) async fn bulk_confirm(
    State(shared): AppState,
    headers: HeaderMap,
    Query(asked): Query<BulkQuery>,
) -> Response {
    let bad = |message: String| {
        (StatusCode::BAD_REQUEST, message_page("Error", &message)).into_response()
    };
    let Some(action) = asked.action.as_deref().and_then(BulkAction::parse) else {
        return bad("which bulk action? (cancel or retry)".into());
    };
    let state_name = asked.state.as_deref().unwrap_or("");
    let Ok(state) = state_name.parse::<JobStatus>() else {
        return bad(format!("unknown job state {state_name:?}"));
    };
    if !action.applies_to(state) {
        return bad(format!(
            "{} does not apply to {} jobs",
            action.as_str(),
            state.as_str()
        ));
    }
    if !shared.may_act(&headers) {
        return super::refuse(
            StatusCode::FORBIDDEN,
            "bulk actions need actions on and a signed-in browser",
        );
    }
    let queue = ListQuery::get(&asked.queue);
    let kind = ListQuery::get(&asked.kind);
    // the count comes from where the action acts (the primary), not from a standby's replay
    let count = if kind.is_none() {
        match shared.storage.queue_counts(queue).await {
            Ok(counts) => state_count(&counts, state),
            Err(e) => return failure(e),
        }
    } else {
        None
    };
    let scope = format!(
        "every {} job{}{}",
        state.as_str(),
        queue
            .map(|q| format!(" of queue {q}"))
            .unwrap_or_else(|| " of every queue".into()),
        kind.map(|k| format!(", kind {k}")).unwrap_or_default()
    );
    let shown_at = Utc::now().timestamp_millis();
    let back = shared.href(&format!("/jobs?{}", query(&list_pairs(state, queue, kind))));
    let body = html! {
        h1 { (action.label()) " jobs" }
        p id="bulk-scope" {
            (action.label()) " " (scope) ": "
            @match count {
                Some(n) => { b id="bulk-count" { (n) } " job" @if n != 1 { "s" } " now" },
                None => { "how many is not counted per kind; the result says" },
            }
            "."
        }
        p.muted { "Only jobs that were there when this page was shown; in steps of 500, each a short transaction. A job that finishes meanwhile is left as it is." }
        form method="post" action=(shared.href("/jobs/bulk")) {
            (csrf_field(&shared))
            input type="hidden" name="action" value=(action.as_str());
            input type="hidden" name="state" value=(state.as_str());
            @if let Some(queue) = queue { input type="hidden" name="queue" value=(queue); }
            @if let Some(kind) = kind { input type="hidden" name="kind" value=(kind); }
            input type="hidden" name="shown_at" value=(shown_at);
            div.actions {
                button class=@if action == BulkAction::Cancel { "danger" } id="bulk-confirm" type="submit" {
                    (action.label()) " them"
                }
                a href=(back) { "Back to the list" }
            }
        }
    };
    still_layout(&shared, &headers, "jobs", "Bulk action", body).await
}

/// What a bulk action did, with the way back to its list.
pub(crate) async fn bulk_done(
    shared: &Shared,
    headers: &HeaderMap,
    action: BulkAction,
    state: JobStatus,
    back: String,
    outcome: crate::BulkOutcome,
) -> Response {
    let done = match action {
        BulkAction::Cancel => "Cancelled",
        BulkAction::Retry => "Retried",
    };
    let body = html! {
        h1 { (action.label()) " jobs" }
        p id="bulk-result" {
            (done) " " b { (outcome.changed) } " of " (outcome.matched) " matching " (state.as_str()) " jobs"
            " in " (outcome.steps) " step" @if outcome.steps != 1 { "s" } "."
            @if outcome.changed < outcome.matched { " The others finished or changed meanwhile." }
        }
        p { a id="bulk-back" href=(back) { "Back to the list" } }
    };
    still_layout(shared, headers, "jobs", "Bulk action", body).await
}

pub(crate) async fn job(
    State(shared): AppState,
    headers: HeaderMap,
    Path(id): Path<i64>,
) -> Response {
    let record = match shared.reads.load_job(id).await {
        Ok(Some(record)) => record,
        Ok(None) => {
            return (
                StatusCode::NOT_FOUND,
                message_page(
                    "Not found",
                    &format!("job {id} is unknown, or its history has aged out"),
                ),
            )
                .into_response()
        }
        Err(e) => return failure(e),
    };
    let args = match shared.reads.job_args(id, JOB_PAGE_ARGS_CHARS).await {
        Ok(args) => args,
        Err(e) => return failure(e),
    };
    let workflow = match shared.reads.workflow_of(id).await {
        Ok(workflow) => workflow,
        Err(e) => return failure(e),
    };
    let state = record.state.state;
    let retryable = matches!(
        state,
        JobStatus::Scheduled | JobStatus::Retryable | JobStatus::DeadLettered
    );
    let cancellable = matches!(
        state,
        JobStatus::Pending
            | JobStatus::Available
            | JobStatus::Scheduled
            | JobStatus::Retryable
            | JobStatus::Running
    );
    let may_act = shared.may_act(&headers);
    let body = html! {
        h1 { "Job " (id) }
        dl.facts {
            dt { "state" } dd id="state" { (state_badge(state.as_str())) }
            dt { "queue" } dd { (record.state.queue) }
            dt { "kind" } dd { (record.state.kind) }
            dt { "attempt" } dd { (record.state.attempt) }
            @if let Some((workflow_id, step)) = &workflow {
                dt { "workflow" }
                dd { "step " b { (step) } " of "
                     a id="workflow" href=(shared.href(&format!("/workflows/{workflow_id}"))) { "workflow " (workflow_id) } }
            }
            @if let Some(detail) = &record.state.detail { dt { "detail" } dd.error id="detail" { (detail) } }
            @if let Some(progress) = &record.progress {
                dt { "progress" }
                dd { (format!("{:.0}%", progress.progress.percent)) " " (progress.progress.message)
                     span.muted { " (attempt " (progress.run_lease) ", " (ago(progress.recorded_at)) ")" } }
            }
        }
        @if may_act && (retryable || cancellable) {
            div.actions {
                @if retryable {
                    form.inline method="post" action=(shared.href(&format!("/jobs/{id}/retry"))) {
                        (csrf_field(&shared)) button id="retry" type="submit" { "Retry now" }
                    }
                }
                @if cancellable {
                    form.inline method="post" action=(shared.href(&format!("/jobs/{id}/cancel"))) {
                        (csrf_field(&shared)) button.danger id="cancel" type="submit" { "Cancel" }
                    }
                }
            }
        }
        h2 { "Arguments" }
        @match &args {
            Some(args) => {
                pre id="args" { (readable_args(args)) }
                @if args.is_cut() {
                    p.muted { "the first " (args.text.len()) " of " (args.bytes) " bytes" }
                }
            },
            None => p.muted { "not stored any more" },
        }
        h2 { "History" }
        table id="history" {
            thead { tr { th { "attempt lease" } th { "state" } th { "at" } th { "error" } } }
            tbody {
                @for entry in &record.history {
                    tr {
                        td.num { (entry.run_lease) } td { (state_badge(entry.state.as_str())) }
                        td { (when(entry.at)) } td.error { (entry.error.as_deref().unwrap_or("")) }
                    }
                }
            }
        }
        @if record.history.is_empty() {
            p.muted id="history-empty" { "No attempt has ended yet: each is listed here once it does." }
        }
    };
    layout(&shared, &headers, "jobs", &format!("Job {id}"), body).await
}

/// A workflow (or batch, or sequence burst): its steps drawn in columns by depth, each with its
/// state and what it waits for, so what waits on what reads left to right.
pub(crate) async fn workflow(
    State(shared): AppState,
    headers: HeaderMap,
    Path(id): Path<i64>,
) -> Response {
    let status = match shared.reads.workflow_status(id).await {
        Ok(Some(status)) => status,
        Ok(None) => {
            return (
                StatusCode::NOT_FOUND,
                message_page(
                    "Not found",
                    &format!("workflow {id} is unknown, or it finished and expired"),
                ),
            )
                .into_response()
        }
        Err(e) => return failure(e),
    };
    let sequence = match shared.reads.sequence_key_of(id).await {
        Ok(key) => key,
        Err(e) => return failure(e),
    };
    let columns = workflow_columns(&status.steps);
    let counts: Vec<String> = JobStatus::ALL
        .iter()
        .map(|state| (state, status.count(*state)))
        .filter(|(_, n)| *n > 0)
        .map(|(state, n)| format!("{n} {state}"))
        .collect();
    let may_act = shared.may_act(&headers);
    let body = html! {
        h1 { "Workflow " (id) }
        dl.facts {
            dt { "state" } dd id="workflow-state" { (state_badge(status.state.as_str())) }
            dt { "steps" } dd id="workflow-counts" { (counts.join(", ")) }
            @if status.cancelled { dt { "cancelled" } dd { "by an operator: nothing more is released" } }
            @if let Some(key) = &sequence {
                dt { "sequence" }
                dd { "a burst of the sequence "
                     a id="sequence" href=(shared.href(&format!("/sequences?{}", query(&[("key", key.as_str())])))) { (key) } }
            }
        }
        @if may_act && status.state == crate::WorkflowState::Running && !status.cancelled {
            div.actions {
                form.inline method="post" action=(shared.href(&format!("/workflows/{id}/cancel"))) {
                    (csrf_field(&shared)) button.danger id="cancel-workflow" type="submit" { "Cancel workflow" }
                }
            }
        }
        div.graph id="steps" {
            @for (depth, column) in columns.iter().enumerate() {
                div.column {
                    div.muted { @if depth == 0 { "first" } @else { "after " (depth) } }
                    @for step in column {
                        div class={ "step " (step.state.as_str()) } id={ "step-" (step.job_id) } {
                            a href=(shared.href(&format!("/jobs/{}", step.job_id))) { b { (step.step) } }
                            " " (state_badge(step.state.as_str()))
                            div.muted { (step.kind) " · " (step.queue) }
                            @if !step.depends_on.is_empty() {
                                div.waits { "waits for " (step.depends_on.join(", "))
                                    @if step.on_dependency_failure != crate::DependencyFailure::Cancel {
                                        " (" (step.on_dependency_failure.as_str()) " on failure)"
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    layout(&shared, &headers, "jobs", &format!("Workflow {id}"), body).await
}

/// How many of a sequence key's bursts its page shows.
const SEQUENCE_BURSTS: usize = 20;

#[derive(serde::Deserialize, Default)]
pub(crate) struct SequenceQuery {
    key: Option<String>,
}

/// A sequence key: its head (the job that runs, or runs next, in order) and its newest bursts,
/// each with its steps per state and a link to its workflow page.
pub(crate) async fn sequence(
    State(shared): AppState,
    headers: HeaderMap,
    Query(asked): Query<SequenceQuery>,
) -> Response {
    let key = ListQuery::get(&asked.key);
    let mut bursts = Vec::new();
    if let Some(key) = key {
        let ids = match shared.reads.sequence_bursts(key, SEQUENCE_BURSTS).await {
            Ok(ids) => ids,
            Err(e) => return failure(e),
        };
        for id in ids {
            match shared.reads.workflow_status(id).await {
                Ok(Some(status)) => bursts.push(status),
                // expired between the two reads
                Ok(None) => {}
                Err(e) => return failure(e),
            }
        }
    }
    let is_final = |s: JobStatus| {
        matches!(
            s,
            JobStatus::Completed
                | JobStatus::Failed
                | JobStatus::Cancelled
                | JobStatus::DeadLettered
        )
    };
    // the head: the first step not final, in the oldest burst that has one (bursts are newest first)
    let head = bursts.iter().rev().find_map(|b| {
        b.steps
            .iter()
            .find(|s| !is_final(s.state))
            .map(|s| (b.workflow_id, s))
    });
    let body = html! {
        h1 { "Sequence" @if let Some(key) = key { " " (key) } }
        form.filters method="get" action=(shared.href("/sequences")) {
            label { "sequence key" input type="search" name="key" value=(key.unwrap_or("")) required; }
            button type="submit" { "Show" }
        }
        @if let Some(key) = key {
            p id="head" {
                @match head {
                    Some((workflow_id, step)) => {
                        "Head: job " a href=(shared.href(&format!("/jobs/{}", step.job_id))) { (step.job_id) }
                        " " (state_badge(step.state.as_str())) " (" (step.kind) " in " (step.queue)
                        ", burst " a href=(shared.href(&format!("/workflows/{workflow_id}"))) { (workflow_id) } ")"
                        @if step.state == JobStatus::Pending { ": it runs when the job before it is final" }
                    },
                    None if bursts.is_empty() => { "No job of the sequence " (key) " is kept: none was enqueued, or every burst finished and expired." },
                    None => { "Every job of the sequence is final: the next one enqueued runs at once." },
                }
            }
            @if !bursts.is_empty() {
                table id="bursts" {
                    thead { tr { th { "burst" } th { "state" } th.num { "jobs" } th { "steps by state" } th { "first / last job" } } }
                    tbody {
                        @for b in &bursts {
                            @let counts: Vec<String> = JobStatus::ALL.iter().map(|s| (s, b.count(*s))).filter(|(_, n)| *n > 0).map(|(s, n)| format!("{n} {s}")).collect();
                            tr data-workflow=(b.workflow_id) {
                                td { a href=(shared.href(&format!("/workflows/{}", b.workflow_id))) { (b.workflow_id) } }
                                td { (state_badge(b.state.as_str())) }
                                td.num { (b.steps.len()) }
                                td { (counts.join(", ")) }
                                td { @if let (Some(first), Some(last)) = (b.steps.first(), b.steps.last()) { (first.job_id) " … " (last.job_id) } }
                            }
                        }
                    }
                }
                p.muted { "The newest " (SEQUENCE_BURSTS) " bursts at most. A key's jobs run one at a time in enqueue order; a burst ends when it has nothing left to run, and the next job starts a new one." }
            }
        }
    };
    layout(&shared, &headers, "jobs", "Sequence", body).await
}

/// The steps in columns by depth: a step sits one column right of its deepest dependency.
fn workflow_columns(steps: &[crate::StepStatus]) -> Vec<Vec<&crate::StepStatus>> {
    let index: std::collections::HashMap<&str, usize> = steps
        .iter()
        .enumerate()
        .map(|(i, s)| (s.step.as_str(), i))
        .collect();
    let mut depth = vec![0usize; steps.len()];
    // one call may add a step before the steps it depends on: relax until nothing moves (a
    // workflow has no cycle, so at most one pass per step)
    for _ in 0..steps.len() {
        let mut moved = false;
        for (i, step) in steps.iter().enumerate() {
            let d = step
                .depends_on
                .iter()
                .filter_map(|d| index.get(d.as_str()))
                .map(|&j| depth[j] + 1)
                .max()
                .unwrap_or(0);
            if d != depth[i] {
                depth[i] = d;
                moved = true;
            }
        }
        if !moved {
            break;
        }
    }
    let mut columns: Vec<Vec<&crate::StepStatus>> =
        vec![Vec::new(); depth.iter().max().map_or(0, |d| d + 1)];
    for (i, step) in steps.iter().enumerate() {
        columns[depth[i]].push(step);
    }
    columns
}

/// One page of a state's jobs, of one queue or all, for a page at `path` that lists that state
/// only, and the link to its next page.
async fn queue_state_page(
    shared: &Shared,
    path: &str,
    state: JobStatus,
    queue: Option<&str>,
    params: &ListQuery,
) -> crate::Result<(crate::JobPage, Option<String>)> {
    let page = shared
        .reads
        .list_jobs(state, queue, None, ListQuery::get(&params.after), PAGE_SIZE)
        .await?;
    let next = page.next.as_ref().map(|after| {
        let mut pairs = vec![("after", after.as_str())];
        if let Some(queue) = queue {
            pairs.push(("queue", queue));
        }
        shared.href(&format!("{path}?{}", query(&pairs)))
    });
    Ok((page, next))
}

pub(crate) async fn dead_letters(
    State(shared): AppState,
    headers: HeaderMap,
    Query(params): Query<ListQuery>,
) -> Response {
    let queue = ListQuery::get(&params.queue);
    // by queue only: the bulk forms below act on a queue, so the list shows what they act on
    let (page, next) =
        match queue_state_page(&shared, "/dlq", JobStatus::DeadLettered, queue, &params).await {
            Ok(page) => page,
            Err(e) => return failure(e),
        };
    let queues = shared.reads.dead_letter_counts().await.unwrap_or_default();
    let may_act = shared.may_act(&headers);
    // the cutoff of the "all" actions: what the operator saw, not what fails after; on a standby,
    // no later than the last commit it replayed (what failed since is not on the page)
    let staleness = staleness(&shared).await;
    let shown_at = match &staleness {
        Staleness::Primary => Utc::now(),
        Staleness::Standby(replica) => replica.last_replay_at.unwrap_or_default().min(Utc::now()),
        // where the page read is unknown: nothing is known to be on it that failed after now
        Staleness::Unknown => Utc::now(),
    }
    .timestamp_millis();
    let scope = queue
        .map(|q| format!("in {q}"))
        .unwrap_or_else(|| "in every queue".into());
    let dead_table = html! {
        table id="dead" {
            thead { tr {
                @if may_act { th { "" } }
                th { "id" } th { "queue" } th { "kind" } th.num { "attempts" } th { "failed" } th { "args" } th { "error" }
            } }
            tbody {
                @for job in &page.jobs {
                    tr data-job=(job.job_id) {
                        @if may_act { td { input type="checkbox" name="job" value=(job.job_id); } }
                        td { a href=(shared.href(&format!("/jobs/{}", job.job_id))) { (job.job_id) } }
                        td { (job.queue) } td { (job.kind) } td.num { (job.attempt) }
                        td title=(when(job.at)) { (ago(job.at)) }
                        td.args { (job.args) }
                        td.error { (job.detail.as_deref().unwrap_or("")) }
                    }
                }
            }
        }
    };
    let body = html! {
        h1 { "Dead letters" }
        form.filters method="get" action=(shared.href("/dlq")) {
            label { "queue"
                select name="queue" {
                    option value="" { "any" }
                    @for (name, count) in &queues {
                        option value=(name) selected[Some(name.as_str()) == queue] {
                            (name) " (" (count) ")"
                        }
                    }
                    @if let Some(queue) = queue.filter(|q| !queues.iter().any(|(name, _)| name == q)) {
                        option value=(queue) selected { (queue) " (0)" }
                    }
                }
            }
            button type="submit" { "Show" }
        }
        @if may_act {
            form id="dlq" method="post" {
                (csrf_field(&shared))
                @if let Some(queue) = queue { input type="hidden" name="queue" value=(queue); }
                div.actions {
                    button id="retry-selected" type="submit" name="scope" value="selected" formaction=(shared.href("/dlq/retry")) { "Retry selected" }
                    button.danger id="purge-selected" type="submit" name="scope" value="selected" formaction=(shared.href("/dlq/purge")) { "Purge selected" }
                }
                (dead_table)
            }
        } @else {
            (dead_table)
        }
        @if page.jobs.is_empty() { p.muted { "No dead-lettered jobs " (scope) "." } }
        @if let Some(next) = next { p.pager { a id="next" href=(next) { "Next page →" } } }
        @if may_act && !page.jobs.is_empty() {
            h2 { "Everything " (scope) }
            p.muted { "Only jobs dead-lettered before this page was shown: any that fail after it are left." }
            div.actions {
                form.inline method="post" action=(shared.href("/dlq/retry")) {
                    (csrf_field(&shared))
                    @if let Some(queue) = queue { input type="hidden" name="queue" value=(queue); }
                    input type="hidden" name="shown_at" value=(shown_at);
                    button id="retry-all" type="submit" name="scope" value="all" { "Retry all " (scope) }
                }
                form.inline method="post" action=(shared.href("/dlq/purge")) {
                    (csrf_field(&shared))
                    @if let Some(queue) = queue { input type="hidden" name="queue" value=(queue); }
                    input type="hidden" name="shown_at" value=(shown_at);
                    button.danger id="purge-all" type="submit" name="scope" value="all" { "Purge all " (scope) }
                }
            }
        }
    };
    render_page(
        &shared,
        &headers,
        "dlq",
        "Dead letters",
        body,
        Some(staleness),
        true,
    )
}

/// Jobs waiting for an external callback (`JobContext::await_callback`), by job id, each with when
/// it times out: what an operator looks for when a partner system stops answering.
pub(crate) async fn callbacks(
    State(shared): AppState,
    headers: HeaderMap,
    Query(params): Query<ListQuery>,
) -> Response {
    let queue = ListQuery::get(&params.queue);
    let (page, next) =
        match queue_state_page(&shared, "/callbacks", JobStatus::Waiting, queue, &params).await {
            Ok(page) => page,
            Err(e) => return failure(e),
        };
    let body = html! {
        h1 { "Callbacks" }
        p.muted { "Jobs whose handler waits for an external system to answer (ringwork callback resolve, Admin::resolve_callback). One that times out fails its attempt and is retried." }
        table id="callbacks" {
            thead { tr { th { "id" } th { "queue" } th { "kind" } th.num { "attempt" } th { "times out" } th { "args" } } }
            tbody {
                @for job in &page.jobs {
                    tr data-job=(job.job_id) {
                        td { a href=(shared.href(&format!("/jobs/{}", job.job_id))) { (job.job_id) } }
                        td { (job.queue) } td { (job.kind) } td.num { (job.attempt) }
                        td title=(when(job.at)) { (ago(job.at)) }
                        td.args { (job.args) }
                    }
                }
            }
        }
        @if page.jobs.is_empty() { p.muted id="no-callbacks" { "No job waits for a callback" @if let Some(q) = queue { " in " (q) } "." } }
        @if let Some(next) = next { p.pager { a id="next" href=(next) { "Next page →" } } }
    };
    layout(&shared, &headers, "callbacks", "Callbacks", body).await
}

/// Periodic schedules: when each last fired and its job, paused or not; pause, resume and "fire
/// now" for those who may act. A schedule's times are declared by the processes that run it, so
/// the page knows the fires the fleet made, not the next one.
pub(crate) async fn schedules(State(shared): AppState, headers: HeaderMap) -> Response {
    let schedules = match shared.reads.schedules().await {
        Ok(schedules) => schedules,
        Err(e) => return failure(e),
    };
    let may_act = shared.may_act(&headers);
    let action = |schedule: &str, path: &str, label: &str, id: &str, danger: bool| {
        html! {
            form.inline method="post" action=(shared.href(path)) {
                (csrf_field(&shared))
                input type="hidden" name="schedule" value=(schedule);
                button class=@if danger { "danger" } id={ (id) "-" (schedule) } type="submit" { (label) }
            }
        }
    };
    let body = html! {
        h1 { "Schedules" }
        p.muted { "Periodic schedules that are declared by a process, fired in about the last week, or are paused. A schedule fires only while a process that declares it runs. A paused schedule fires only when triggered; its missed fires follow its missed-fire policy when it is resumed." }
        table id="schedules" {
            thead { tr {
                th { "schedule" } th { "defined as" } th { "state" } th { "next fire" } th { "last fire" } th { "its job" } th.num { "fires kept" }
                @if may_act { th { "" } }
            } }
            tbody {
                @for s in &schedules {
                    tr data-schedule=(s.schedule) {
                        td { (s.schedule) }
                        td { @if let Some(definition) = &s.definition { code { (definition) } } @else { span.muted { "not declared" } } }
                        td { @if s.paused { span class="state paused" { "paused" } } @else { span class="state running" { "active" } } }
                        td.next-fire {
                            @if let Some(at) = s.next_fire_at { span title=(when(at)) { (ago(at)) } } @else { "–" }
                            @if let Some(due) = s.overdue_since {
                                " " span class="state unworked" title={ "due " (when(due)) ": is a process that declares it running?" } { "overdue" }
                            }
                        }
                        td { @if let Some(at) = s.last_fire_at { span title=(when(at)) { (ago(at)) } } @else { "–" } }
                        td { @if let Some(id) = s.last_job_id { a href=(shared.href(&format!("/jobs/{id}"))) { (id) } } @else { "–" } }
                        td.num { (s.fires) }
                        @if may_act {
                            td {
                                @if s.paused {
                                    (action(&s.schedule, "/schedules/resume", "Resume", "resume", false))
                                } @else {
                                    (action(&s.schedule, "/schedules/pause", "Pause", "pause", false))
                                }
                                " " (action(&s.schedule, "/schedules/trigger", "Fire now", "trigger", false))
                            }
                        }
                    }
                }
            }
        }
        @if schedules.is_empty() { p.muted id="no-schedules" { "No schedule is declared, has fired or is paused." } }
    };
    layout(&shared, &headers, "schedules", "Schedules", body).await
}

/// How many of a per-key limit's keys the limits page shows.
const TOP_KEYS: usize = 10;

/// "used / limit" with a bar, for the limits page.
fn usage(used: i64, limit: Option<i32>) -> Markup {
    match limit {
        None => html! { span.muted { "no limit" } },
        Some(limit) => {
            let pct = if limit > 0 {
                (used as f64 / limit as f64 * 100.0).clamp(0.0, 100.0)
            } else {
                100.0
            };
            html! {
                span.usage { (used) " / " (limit) }
                " " meter min="0" max=(limit) value=(used.min(limit as i64)) title=(format!("{pct:.0}%")) {}
            }
        }
    }
}

fn period(period: Option<std::time::Duration>) -> String {
    let Some(p) = period else {
        return String::new();
    };
    let secs = p.as_secs_f64();
    match secs {
        s if s >= 3600.0 && s % 3600.0 == 0.0 => format!("per {} h", s / 3600.0),
        s if s >= 60.0 && s % 60.0 == 0.0 => format!("per {} min", s / 60.0),
        s => format!("per {s} s"),
    }
}

/// Queue and key limits against what each queue uses of them now.
pub(crate) async fn limits(State(shared): AppState, headers: HeaderMap) -> Response {
    let limits = match shared.reads.queue_limits_in_use(TOP_KEYS).await {
        Ok(limits) => limits,
        Err(e) => return failure(e),
    };
    let body = html! {
        h1 { "Limits" }
        p.muted { "Fleet-wide limits (Admin::set_queue_limits) and what each queue uses of them now: attempts open against its running limit, claims in the current window against its rate. Jobs of a key at its limit wait out of the ring (held) until the key has room." }
        @if limits.is_empty() { p.muted id="no-limits" { "No queue has limits." } }
        @for l in &limits {
            section.limits data-queue=(l.queue) {
                h2 { a href=(jobs_link(&shared, JobStatus::Running, &l.queue)) { (l.queue) } }
                table {
                    thead { tr { th { "limit" } th { "in use" } th { "window" } } }
                    tbody {
                        tr.running { td { "running" } td { (usage(l.running, l.max_running)) } td {} }
                        tr.rate { td { "claims" } td { (usage(l.rate_used, l.rate_limit)) } td { (period(l.rate_period)) } }
                        @if let Some(path) = &l.key_path {
                            tr.keys {
                                td { "per key " code { (path.join(".")) } }
                                td {
                                    @if let Some(max) = l.key_max_running { (max) " running" }
                                    @if l.key_max_running.is_some() && l.key_rate_limit.is_some() { " · " }
                                    @if let Some(rate) = l.key_rate_limit { (rate) " claims " (period(l.key_rate_period)) }
                                }
                                td { span.held { (l.held) } " held" }
                            }
                        }
                    }
                }
                @if l.key_path.is_some() {
                    @if l.top_keys.is_empty() { p.muted { "No key runs or was claimed in its window." } } @else {
                        table.keys {
                            thead { tr { th { "key" } th { "running" } th { "claims in window" } } }
                            tbody {
                                @for k in &l.top_keys {
                                    tr data-key=(k.key) {
                                        td { (k.key) }
                                        td.running { (usage(k.running, l.key_max_running)) }
                                        td.claims { (usage(k.claims, l.key_rate_limit)) }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    layout(&shared, &headers, "limits", "Limits", body).await
}

/// The processes working the schema (their LISTEN sessions, named with host and pid) and which
/// backend leads maintenance, from `pg_stat_activity`.
pub(crate) async fn processes(State(shared): AppState, headers: HeaderMap) -> Response {
    // the leader's lock and the sessions are the primary's: a standby's pg_stat_activity has
    // neither
    let sessions = match shared.storage.processes().await {
        Ok(sessions) => sessions,
        Err(e) => return failure(e),
    };
    let leader = sessions.iter().find(|s| s.leader);
    let body = html! {
        h1 { "Processes" }
        p.muted { "Each process that works this schema keeps one session for LISTEN, named ringwork:<schema> pid <pid> <host> (pg_stat_activity.application_name) unless its pool names its sessions itself; the maintenance leader holds the schema's leader lock on a session of its own, named ringwork:<schema> leader pid <pid> <host>. Read from the server's activity view: a process that stops drops out at once." }
        p id="leader" {
            @match leader {
                Some(l) => { "Maintenance is led by the backend " b { (l.pid) } " from " (l.client)
                    @if let Some(at) = l.state_since { ", " (l.state.as_deref().unwrap_or("")) " since " span title=(when(at)) { (ago(at)) } } "." },
                None => { span.error { "No process leads maintenance" } ": nothing rotates, prunes, rescues or promotes until one does (a process with maintenance on takes the lead within a tick)." },
            }
        }
        table id="processes" {
            thead { tr { th { "session" } th.num { "backend pid" } th { "client" } th { "connected" } th { "state" } th { "" } } }
            tbody {
                @for s in &sessions {
                    tr data-pid=(s.pid) {
                        td { (s.application) }
                        td.num { (s.pid) }
                        td { (s.client) }
                        td { @if let Some(at) = s.connected_at { span title=(when(at)) { (ago(at)) } } }
                        td { (s.state.as_deref().unwrap_or("")) @if let Some(at) = s.state_since { span.muted { " " (ago(at)) } } }
                        td { @if s.leader { span class="state running" { "leader" } } }
                    }
                }
            }
        }
        @if sessions.is_empty() { p.muted id="no-processes" { "No process is connected to this schema." } }
    };
    layout(&shared, &headers, "processes", "Processes", body).await
}

pub(crate) async fn storage(State(shared): AppState, headers: HeaderMap) -> Response {
    let storage = &shared.reads;
    let (rings, blockers, tables, holders, archive) = match tokio::try_join!(
        storage.ring_slots(),
        storage.prune_blockers(),
        storage.table_health(),
        storage.horizon_holders(shared.horizon_min_age),
        storage.archive_spans(),
    ) {
        Ok(all) => all,
        Err(e) => return failure(e),
    };
    let opt = |v: &Option<String>| v.clone().unwrap_or_default();
    let body = html! {
        h1 { "Storage" }
        h2 { "Rings" }
        table id="rings" {
            thead { tr { th { "ring" } th.num { "slot" } th.num { "generation" } th { "state" } th { "since" } th { "not prunable because" } } }
            tbody {
                @for slot in &rings {
                    tr {
                        td { (slot.ring) } td.num { (slot.slot) } td.num { (slot.generation) } td { (slot.state) }
                        td { (slot.state_since.map(ago).unwrap_or_default()) }
                        td { (opt(&slot.blocker)) }
                    }
                }
            }
        }
        h2 { "Prune blockers" }
        @if blockers.is_empty() { p.muted id="no-blockers" { "No backend holds a lock a prune needs." } } @else {
            table id="blockers" {
                thead { tr { th { "ring" } th.num { "slot" } th.num { "pid" } th { "application" } th { "state" } th.num { "transaction age (s)" } th { "locks" } th { "query" } } }
                tbody { @for b in &blockers { tr {
                    td { (b.ring) } td.num { (b.slot) } td.num { (b.pid) } td { (opt(&b.application)) }
                    td { (opt(&b.backend_state)) } td.num { (b.xact_age_secs.map(|s| format!("{s:.0}")).unwrap_or_default()) }
                    td { (b.lock_modes) } td.args { (opt(&b.query)) }
                } } }
            }
        }
        h2 { "Archive" }
        p.muted id="archive-span" {
            (archive_span_line(&archive)) " "
            a href=(shared.href("/archive")) { "Its buckets and its search →" }
        }
        h2 { "Tables" }
        table id="tables" {
            thead { tr { th { "table" } th.num { "live tuples" } th.num { "dead tuples" } th.num { "size (kB)" } } }
            tbody { @for t in &tables { tr {
                td { (t.table_name) } td.num { (t.live_tuples) } td.num { (t.dead_tuples) } td.num { (t.total_bytes / 1024) }
            } } }
        }
        h2 { "Horizon holders" }
        p.muted { "Sessions, replication slots and prepared transactions that keep vacuum from reclaiming dead rows in the rest of the database (ringwork's own rings do not depend on vacuum)." }
        @if holders.is_empty() { p.muted id="no-holders" { "Nothing holds the horizon back." } } @else {
            table id="holders" {
                thead { tr { th { "kind" } th { "holder" } th { "user" } th { "application" } th { "client" } th { "state" } th { "since" } th.num { "xmin age" } th { "query" } } }
                tbody { @for h in &holders { tr {
                    td { (h.kind) } td { (h.holder) } td { (opt(&h.usename)) } td { (opt(&h.application)) }
                    td { (opt(&h.client)) } td { (opt(&h.backend_state)) }
                    td { (h.held_since.map(ago).unwrap_or_default()) }
                    td.num { (h.xmin_age.map(|a| a.to_string()).unwrap_or_default()) }
                    td.args { (opt(&h.query)) }
                } } }
            }
        }
    };
    layout(&shared, &headers, "storage", "Storage", body).await
}

/// The archive's span in a sentence: how far back history goes and what it costs on disk.
fn archive_span_line(archive: &[crate::storage::ArchiveSpan]) -> String {
    match (archive.first(), archive.iter().map(|a| a.newest).max()) {
        (Some(first), Some(newest)) => format!(
            "History from {} to {}, {} buckets, {} kB.",
            when(first.oldest),
            when(newest),
            archive.len(),
            archive.iter().map(|a| a.total_bytes).sum::<i64>() / 1024
        ),
        _ => "The archive holds no history yet: finished jobs are archived when their queue slot \
              is pruned."
            .to_string(),
    }
}

/// How many jobs an archive search page lists.
const ARCHIVE_PAGE_SIZE: usize = 50;

/// The archive: its time buckets (each linking to the jobs that finished within it) and archive
/// search, by what finished jobs' arguments contain, through its index.
pub(crate) async fn archive(
    State(shared): AppState,
    headers: HeaderMap,
    Query(params): Query<ListQuery>,
) -> Response {
    let bad = |message: String| {
        (StatusCode::BAD_REQUEST, message_page("Error", &message)).into_response()
    };
    let state = match ListQuery::get(&params.state) {
        None => None,
        Some(name) => match name.parse::<JobStatus>() {
            Ok(state @ (JobStatus::Completed | JobStatus::Failed | JobStatus::Cancelled)) => {
                Some(state)
            }
            _ => {
                return bad(format!(
                    "the archive holds completed, failed and cancelled jobs, not {name:?} ones"
                ))
            }
        },
    };
    let (until, since) = match time_range(&params) {
        Ok(range) => range,
        Err(e) => return bad(e),
    };
    let args_text = ListQuery::get(&params.args);
    let searched = match args_text {
        None => None,
        Some(text) => match serde_json::from_str::<serde_json::Value>(text) {
            Ok(args) => Some(crate::ArchiveSearch {
                args,
                queue: ListQuery::get(&params.queue).map(str::to_string),
                kind: ListQuery::get(&params.kind).map(str::to_string),
                state,
                since,
                until,
            }),
            Err(e) => {
                return bad(format!(
                    "the arguments to search for are JSON, such as {{\"customer\": 42}}: {e}"
                ))
            }
        },
    };
    let archive = match shared.reads.archive_spans().await {
        Ok(archive) => archive,
        Err(e) => return failure(e),
    };
    let found = match &searched {
        None => None,
        Some(search) => match shared
            .reads
            .search_archive(search, ListQuery::get(&params.after), ARCHIVE_PAGE_SIZE)
            .await
        {
            Ok(page) => Some(page),
            Err(e @ (crate::Error::InvalidName { .. } | crate::Error::InvalidArgs { .. })) => {
                return bad(e.to_string())
            }
            Err(e) => return failure(e),
        },
    };
    let next = found
        .as_ref()
        .and_then(|page| page.next.as_ref())
        .map(|after| {
            let mut pairs = vec![("args", args_text.unwrap_or("{}"))];
            for (name, value) in [
                ("queue", &params.queue),
                ("kind", &params.kind),
                ("state", &params.state),
                ("since", &params.since),
                ("before", &params.before),
            ] {
                pairs.extend(ListQuery::get(value).map(|v| (name, v)));
            }
            pairs.push(("after", after.as_str()));
            shared.href(&format!("/archive?{}", query(&pairs)))
        });
    let field = |value: &Option<String>| ListQuery::get(value).unwrap_or("").to_string();
    let body = html! {
        h1 { "Archive" }
        p.muted id="archive-span" { (archive_span_line(&archive)) }
        h2 { "Search" }
        form.filters method="get" action=(shared.href("/archive")) {
            label title="JSON the arguments contain: an object matches arguments holding at least its keys with those values" {
                "arguments contain (JSON)"
                input type="search" name="args" placeholder="{\"customer\": 42}" value=(field(&params.args)) required;
            }
            label { "queue" input type="search" name="queue" value=(field(&params.queue)); }
            label { "kind" input type="text" name="kind" value=(field(&params.kind)); }
            label { "state"
                select name="state" {
                    option value="" { "any" }
                    @for s in [JobStatus::Completed, JobStatus::Failed, JobStatus::Cancelled] {
                        option value=(s.as_str()) selected[state == Some(s)] { (s.as_str()) }
                    }
                }
            }
            label { "finished since (UTC)" input type="datetime-local" step="1" name="since" value=(field(&params.since)); }
            label { "finished before (UTC)" input type="datetime-local" step="1" name="before" value=(field(&params.before)); }
            button type="submit" { "Search" }
        }
        @if let Some(page) = &found {
            @if !page.enabled {
                p.muted id="search-off" {
                    "Archive search is off, so jobs archived from now on are not indexed. An operator turns it on with "
                    code { "SELECT " (shared.reads.schema().as_str()) ".set_setting('archive_search', 1)" }
                    "; it costs each archived job an index entry per argument value (docs/operations.md)."
                }
            }
            @if page.too_wide {
                p id="too-wide" {
                    "More than " (crate::ARCHIVE_SEARCH_CAP) " archived jobs match, too many to list newest first: "
                    "narrow the search (more keys, a queue, a kind, a state or a time range)."
                }
            } @else if page.jobs.is_empty() {
                p.muted id="no-matches" { "No archived job matches." }
            } @else {
                table id="found" {
                    thead { tr {
                        th { "id" } th { "queue" } th { "kind" } th { "state" } th.num { "attempt" }
                        th { "finished" } th { "args" }
                    } }
                    tbody {
                        @for job in &page.jobs {
                            tr data-job=(job.job_id) {
                                td { a href=(shared.href(&format!("/jobs/{}", job.job_id))) { (job.job_id) } }
                                td { (job.queue) } td { (job.kind) } td { (state_badge(job.state.as_str())) }
                                td.num { (job.attempt) }
                                td title=(when(job.at)) { (ago(job.at)) }
                                td.args { (job.args) }
                            }
                        }
                    }
                }
                @if let Some(next) = next { p.pager { a id="next" href=(next) { "Next page →" } } }
            }
        }
        h2 { "Buckets" }
        @if !archive.is_empty() {
            table id="archive" {
                thead { tr { th.num { "bucket" } th { "oldest" } th { "newest" } th.num { "completion batches (est.)" } th.num { "job rows (est.)" } th.num { "size (kB)" } th { "its jobs" } } }
                tbody { @for a in &archive { tr {
                    td.num { (a.bucket) } td { (when(a.oldest)) } td { (when(a.newest)) }
                    td.num { (a.batches_estimate) } td.num { (a.rows_estimate) } td.num { (a.total_bytes / 1024) }
                    td.bucket-jobs {
                        @for (i, state) in ["completed", "failed", "cancelled"].iter().enumerate() {
                            @if i > 0 { " · " }
                            a href=(shared.href(&bucket_jobs(state, a))) { (state) }
                        }
                    }
                } } }
            }
        }
    };
    layout(&shared, &headers, "archive", "Archive", body).await
}

#[derive(serde::Deserialize, Default)]
pub(crate) struct LoginQuery {
    next: Option<String>,
}

pub(crate) async fn login(
    State(shared): AppState,
    headers: HeaderMap,
    Query(asked): Query<LoginQuery>,
) -> Response {
    let body = match shared.token_hash {
        None => html! { h1 { "Sign in" } p { "This dashboard has no token: its actions are "
        @if matches!(shared.actions, super::Actions::BehindProxy) { "on for everyone your proxy lets in." } @else { "off." } } },
        Some(_) => html! {
            h1 { "Sign in" }
            p.muted { "Actions (pause, retry, cancel, purge) need the token the dashboard was started with." }
            form method="post" action=(shared.href("/login")) {
                input id="token" type="password" name="token" autocomplete="current-password" required;
                @if let Some(next) = &asked.next { input type="hidden" name="next" value=(next); }
                " " button id="sign-in" type="submit" { "Sign in" }
            }
        },
    };
    still_layout(&shared, &headers, "", "Sign in", body).await
}
