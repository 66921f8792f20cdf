//! CPU time from `/proc`: the PostgreSQL server's (when it runs on this host), the worker
//! processes', and the host's busy share. Linux only; elsewhere every reading is `None`.

use std::fs;

/// Clock ticks per second of the `/proc` CPU counters.
fn ticks_per_second() -> f64 {
    // SAFETY: sysconf only reads a configuration value.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 {
        hz as f64
    } else {
        100.0
    }
}

/// (parent pid, [utime, stime, cutime, cstime]) of a process, in clock ticks.
fn stat(pid: u32) -> Option<(u32, [u64; 4])> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // the command name is in parentheses and may hold spaces: the fields start after the last ')'
    let fields: Vec<&str> = text.get(text.rfind(')')? + 2..)?.split(' ').collect();
    let number = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    let ppid = u32::try_from(number(1)?).ok()?;
    Some((ppid, [number(11)?, number(12)?, number(13)?, number(14)?]))
}

/// The live children of `parent`, each with its CPU times (`stat`).
fn children(parent: u32) -> Option<Vec<(u32, [u64; 4])>> {
    Some(
        fs::read_dir("/proc")
            .ok()?
            .flatten()
            .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
            .filter_map(|pid| stat(pid).map(|(ppid, times)| (pid, ppid, times)))
            .filter(|&(_, ppid, _)| ppid == parent)
            .map(|(pid, _, times)| (pid, times))
            .collect(),
    )
}

/// The postmaster of the backend `backend_pid`, if that backend runs on this host.
pub(crate) fn postmaster_of(backend_pid: u32) -> Option<u32> {
    let (ppid, _) = stat(backend_pid)?;
    let comm = fs::read_to_string(format!("/proc/{ppid}/comm")).ok()?;
    matches!(comm.trim(), "postgres" | "postmaster").then_some(ppid)
}

/// CPU milliseconds the server has used since it started: its live processes, plus the exited
/// backends the postmaster has reaped (counted in its children's times).
pub(crate) fn server_ms(postmaster: u32) -> Option<f64> {
    let (_, [utime, stime, cutime, cstime]) = stat(postmaster)?;
    let mut ticks = utime + stime + cutime + cstime;
    for (_, [utime, stime, ..]) in children(postmaster)? {
        ticks += utime + stime;
    }
    Some(ticks as f64 * 1000.0 / ticks_per_second())
}

/// CPU milliseconds the processes `pids` have used (user and system, their reaped children too).
pub(crate) fn processes_ms(pids: impl IntoIterator<Item = u32>) -> Option<f64> {
    let mut ticks = 0;
    for pid in pids {
        let (_, times) = stat(pid)?;
        ticks += times.iter().sum::<u64>();
    }
    Some(ticks as f64 * 1000.0 / ticks_per_second())
}

/// A `kB` field of `/proc/<pid>/status` (`VmRSS`, `RssAnon`).
fn status_kb(pid: u32, field: &str) -> Option<u64> {
    let text = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
}

/// Resident memory (kB) of the processes `pids` together.
pub(crate) fn processes_rss_kb(pids: impl IntoIterator<Item = u32>) -> Option<u64> {
    pids.into_iter().map(|pid| status_kb(pid, "VmRSS")).sum()
}

/// Private resident memory (kB) of the server: the postmaster and every process it started,
/// without shared memory (each backend maps the shared buffers it touched, which is not growth).
pub(crate) fn server_private_kb(postmaster: u32) -> Option<u64> {
    let mut kb = status_kb(postmaster, "RssAnon")?;
    for (pid, _) in children(postmaster)? {
        kb += status_kb(pid, "RssAnon").unwrap_or(0);
    }
    Some(kb)
}

/// (busy, total) clock ticks of the whole host since boot.
pub(crate) fn host_ticks() -> Option<(u64, u64)> {
    let text = fs::read_to_string("/proc/stat").ok()?;
    let line = text.lines().next()?.strip_prefix("cpu ")?;
    let values: Vec<u64> = line
        .split_whitespace()
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal ...: idle and iowait are not busy
    let total: u64 = values.iter().take(8).sum();
    let idle = values.get(3)? + values.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_a_cpu_reading_and_the_host_is_busy_some_of_the_time() {
        let me = std::process::id();
        let mut spin = 0u64;
        for i in 0..5_000_000u64 {
            spin = spin.wrapping_add(i * i);
        }
        assert!(spin > 0);
        assert!(processes_ms([me]).is_some_and(|ms| ms >= 0.0));
        let (busy, total) = host_ticks().expect("/proc/stat");
        assert!(busy > 0 && busy <= total);
        assert!(processes_rss_kb([me]).is_some_and(|kb| kb > 0));
        assert!(status_kb(me, "RssAnon").is_some_and(|kb| kb > 0));
        assert_eq!(
            postmaster_of(me),
            None,
            "this test is not a PostgreSQL backend"
        );
    }
}
