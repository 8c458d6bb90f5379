//! The flushing marker: this process's traces in flight, shown to a parent process.

use std::fs;
use std::path::PathBuf;
use std::time::Duration;

use parking_lot::Mutex;

/// This process's traces in flight, across every writer, and the flushing marker that shows
/// them to a parent process: `$TMPDIR/stepscope-flushing-{pid}` (TMPDIR unset: `/tmp`),
/// holding the longest flush timeout of the writers with work, in seconds, then the process's
/// start time (Linux's clock ticks since boot, `/proc/{pid}/stat`'s 22nd field). It exists
/// while a trace is being finalized or written. A process manager that would kill this process
/// after a short grace period (vLLM's, through the stepscope plugin) waits while it is there,
/// up to that many seconds. The start time tells the marker of a process killed with traces
/// in flight from one of a later process given the same pid (pids are reused, within minutes
/// where `pid_max` is 32768): only the process that wrote a marker is waited for.
static IN_FLIGHT: Mutex<InFlightCount> = Mutex::new(InFlightCount {
    count: 0,
    longest: 0.0,
    written: None,
});

struct InFlightCount {
    count: usize,
    /// The longest flush timeout among the writers with work, seconds.
    longest: f64,
    /// What the marker file holds, once written.
    written: Option<f64>,
}

const MARKER_PREFIX: &str = "stepscope-flushing-";

/// The flushing marker of process `pid`: `$TMPDIR/stepscope-flushing-{pid}` (TMPDIR unset:
/// `/tmp`). It holds the longest flush timeout of the process's writers with work, in seconds,
/// and exists while a trace of the process is being finalized or written.
pub fn flushing_marker_of(pid: u32) -> PathBuf {
    std::env::temp_dir().join(format!("{MARKER_PREFIX}{pid}"))
}

fn flushing_marker() -> PathBuf {
    flushing_marker_of(std::process::id())
}

/// What a flushing marker says: the flush timeout (seconds; 0 when unreadable) and the start
/// time of the process that wrote it (absent in an earlier stepscope's markers, or where
/// `/proc` cannot be read).
struct Marker {
    pid: u32,
    timeout: f64,
    started: Option<u64>,
}

impl Marker {
    fn parse(pid: u32, text: &str) -> Marker {
        let mut fields = text.split_whitespace();
        let timeout = fields.next().and_then(|t| t.parse().ok()).unwrap_or(0.0);
        let started = fields.next().and_then(|t| t.parse().ok());
        Marker {
            pid,
            timeout,
            started,
        }
    }

    /// Whether the process that wrote the marker still runs: its pid is alive and, where the
    /// marker says when it started, the process with that pid started then.
    fn writer_alive(&self) -> bool {
        if !crate::files::process_alive(self.pid) {
            return false;
        }
        match (self.started, process_start(self.pid)) {
            (Some(written), Some(now)) => written == now,
            _ => true,
        }
    }
}

/// When process `pid` started, in clock ticks since boot (`/proc/{pid}/stat`, field 22); None
/// where it cannot be read.
fn process_start(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // pid (comm) state ppid ...: comm may hold spaces and parentheses; field 3 follows ") ".
    let after_comm = stat.get(stat.rfind(')')? + 2..)?;
    after_comm.split_whitespace().nth(22 - 3)?.parse().ok()
}

/// Every flushing marker in the directory, whoever wrote it.
fn all_markers() -> Vec<Marker> {
    let Ok(entries) = fs::read_dir(std::env::temp_dir()) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name();
            let pid = name.to_str()?.strip_prefix(MARKER_PREFIX)?.parse().ok()?;
            // A marker is a plain file; reading anything else (a FIFO) could block.
            if !crate::files::is_regular_file(&entry.path()) {
                return None;
            }
            let text = fs::read_to_string(entry.path()).unwrap_or_default();
            Some(Marker::parse(pid, &text))
        })
        .collect()
}

/// The flushing markers of processes that still run: each one's pid and the flush timeout its
/// marker holds, seconds (0 when it cannot be read). A marker left by a process that died with
/// traces in flight is not listed, nor is it when a later process has taken its pid.
pub fn flushing_markers() -> Vec<(u32, f64)> {
    all_markers()
        .into_iter()
        .filter(Marker::writer_alive)
        .map(|m| (m.pid, m.timeout))
        .collect()
}

/// Removes the flushing markers of processes that died with traces in flight (killed), even
/// where a later process has their pid: no parent waits on a dead process. Markers of
/// processes that still run are left alone.
pub(super) fn clean_stale_markers() {
    for marker in all_markers() {
        if marker.writer_alive() {
            continue;
        }
        let pid = marker.pid;
        let path = flushing_marker_of(pid);
        if fs::remove_file(&path).is_ok() {
            log::info!(
                "stepscope: removed {} (process {pid} ended with traces in flight)",
                path.display()
            );
        }
    }
}

/// One more trace in flight in this process, whose writer waits up to `timeout` at exit.
/// Counts only (it runs in `stop()`, on the engine thread); [`publish_in_flight`] writes the
/// marker, off it.
pub(super) fn in_flight_begin(timeout: Duration) {
    let mut g = IN_FLIGHT.lock();
    let secs = timeout.as_secs_f64();
    g.longest = if g.count == 0 {
        secs
    } else {
        g.longest.max(secs)
    };
    g.count += 1;
}

/// Writes the marker if traces are in flight and it does not say so yet (writer threads). The
/// write happens outside the count's lock: `stop()` takes that lock on the engine thread
/// ([`in_flight_begin`]), and a slow temporary directory must never hold it up.
pub(super) fn publish_in_flight() {
    let longest = {
        let g = IN_FLIGHT.lock();
        if g.count == 0 || g.written == Some(g.longest) {
            return;
        }
        g.longest
    };
    let path = flushing_marker();
    let started = process_start(std::process::id()).map_or(String::new(), |t| format!(" {t}"));
    if let Err(e) = fs::write(&path, format!("{longest}{started}\n")) {
        log::debug!("stepscope: cannot write {}: {e}", path.display());
        return;
    }
    let mut g = IN_FLIGHT.lock();
    if g.count == 0 {
        // Every trace ended while the marker was being written.
        let _ = fs::remove_file(&path);
    } else {
        g.written = Some(longest);
    }
}

/// `n` traces of this process are no longer in flight.
pub(super) fn in_flight_end(n: usize) {
    let mut g = IN_FLIGHT.lock();
    g.count = g.count.saturating_sub(n);
    if g.count == 0 && g.written.take().is_some() {
        let _ = fs::remove_file(flushing_marker());
    }
}

/// Held by the unit tests that put traces in flight: the count and the marker are the test
/// process's, and tests run side by side (a writer's test once wrote the marker in the middle
/// of the marker's test).
#[cfg(test)]
pub(crate) static IN_FLIGHT_TESTS: Mutex<()> = Mutex::new(());

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flushing_marker_exists_while_traces_are_in_flight() {
        let _alone = IN_FLIGHT_TESTS.lock();
        let marker = flushing_marker();
        in_flight_begin(Duration::from_secs(5));
        in_flight_begin(Duration::from_secs(30));
        assert!(
            !marker.exists(),
            "written by the writer threads, not in stop()"
        );
        publish_in_flight();
        let started = process_start(std::process::id()).expect("Linux's /proc");
        assert_eq!(
            fs::read_to_string(&marker).unwrap(),
            format!("30 {started}\n")
        );
        assert!(flushing_markers().contains(&(std::process::id(), 30.0)));
        in_flight_end(1);
        assert!(marker.exists(), "one trace is still in flight");
        in_flight_end(1);
        assert!(!marker.exists());
    }

    #[test]
    fn a_marker_whose_pid_another_process_has_taken_is_stale() {
        // A live process of our own stands for the later process that got the dead one's pid.
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .expect("sleep");
        let pid = child.id();
        let started = process_start(pid).expect("Linux's /proc");
        let marker = flushing_marker_of(pid);
        let listed = || flushing_markers().iter().any(|(p, _)| *p == pid);

        fs::write(&marker, format!("600 {}\n", started + 1)).unwrap();
        assert!(!listed(), "written by another process that had this pid");
        clean_stale_markers();
        assert!(!marker.exists(), "removed though the pid is alive");

        fs::write(&marker, format!("600 {started}\n")).unwrap();
        assert!(listed(), "written by this very process");
        fs::write(&marker, "600\n").unwrap();
        assert!(listed(), "an older stepscope's marker: the pid alone");
        clean_stale_markers();
        assert!(marker.exists(), "the writer still runs");

        child.kill().unwrap();
        child.wait().unwrap();
        clean_stale_markers();
        assert!(!marker.exists(), "the writer has died");
    }
}
