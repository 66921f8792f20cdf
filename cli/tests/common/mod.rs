#![allow(dead_code)] // each test binary uses a part of it
//! Shared by the CLI's tests: `ringwork serve` as a child process.

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::Child;

/// Start `ringwork serve --listen 127.0.0.1:0` with `args` (database, schema, options) and wait for
/// the address it prints. The process is killed when the returned child is dropped.
pub async fn spawn_serve(args: &[&str]) -> (Child, SocketAddr) {
    let mut serve = tokio::process::Command::new(env!("CARGO_BIN_EXE_ringwork"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start ringwork serve");
    let mut stdout = BufReader::new(serve.stdout.take().expect("serve's stdout"));
    let mut first = String::new();
    tokio::time::timeout(Duration::from_secs(20), stdout.read_line(&mut first))
        .await
        .expect("serve printed its address")
        .expect("serve's first line");
    let addr = first
        .trim()
        .strip_prefix("listening on http://")
        .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
        .parse()
        .expect("an address");
    (serve, addr)
}

/// One HTTP/1.1 POST: (status, body).
pub async fn post(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    content_type: &str,
    body: &str,
) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    stream
        .write_all(
            format!(
                "POST {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
                 Content-Type: {content_type}\r\nContent-Length: {}\r\n{extra}\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .await
        .expect("send");
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.expect("read");
    let text = String::from_utf8_lossy(&response).to_string();
    let status = text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// One HTTP/1.1 exchange whose request line and headers the caller writes in full (`Host`
/// included, so a test can send any): (status, response head, body).
pub async fn exchange(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let mut request = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    if method == "POST" {
        request.push_str(&format!(
            "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.expect("read");
    let text = String::from_utf8_lossy(&response).to_string();
    let status = text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (status, head.to_string(), body.to_string())
}

/// The value of a response header (the first one of that name).
pub fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.eq_ignore_ascii_case(name).then(|| value.trim())
    })
}

/// The attribute value that follows `prefix` (which ends with its opening quote) in a page.
pub fn value_after(body: &str, prefix: &str) -> String {
    let at = body
        .find(prefix)
        .unwrap_or_else(|| panic!("no {prefix} in the page"))
        + prefix.len();
    body[at..].split('"').next().unwrap().to_string()
}

/// The CSRF field of a dashboard page's forms.
pub fn csrf_of(body: &str) -> String {
    value_after(body, "name=\"csrf\" value=\"")
}
