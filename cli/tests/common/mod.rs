//! Shared by the CLI's tests: `ringwork serve` as a child process.

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
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
