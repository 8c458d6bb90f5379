//! The flushing marker: this process's traces in flight, shown to a parent process.

use std::fs;
use std::path::PathBuf;
use std::time::Duration;

use parking_lot::Mutex;

/// This process's traces in flight, across every writer, and the flushing marker that shows
/// them to a parent process: `$TMPDIR/stepscope-flushing-{pid}` (TMPDIR unset: `/tmp`),
/// holding the longest flush timeout of the writers with work, in seconds. It exists while a
/// trace is being finalized or written. A process manager that would kill this process after
/// a short grace period (vLLM's, through the stepscope plugin) waits while it is there, up to
/// that many seconds.
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

/// The flushing markers there are, of live processes and dead ones: each process's pid and the
/// flush timeout its marker holds, seconds (0 when it cannot be read).
pub fn flushing_markers() -> Vec<(u32, f64)> {
    let Ok(entries) = fs::read_dir(std::env::temp_dir()) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name();
            let pid = name.to_str()?.strip_prefix(MARKER_PREFIX)?.parse().ok()?;
            let timeout = fs::read_to_string(entry.path())
                .ok()
                .and_then(|t| t.trim().parse().ok())
                .unwrap_or(0.0);
            Some((pid, timeout))
        })
        .collect()
}

/// Removes the flushing markers of processes that died with traces in flight (killed): no
/// parent waits on a dead process. Markers of live processes are left alone.
pub(super) fn clean_stale_markers() {
    for (pid, _) in flushing_markers() {
        if crate::files::process_alive(pid) {
            continue;
        }
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

/// Writes the marker if traces are in flight and it does not say so yet (writer threads).
pub(super) fn publish_in_flight() {
    let mut g = IN_FLIGHT.lock();
    if g.count == 0 || g.written == Some(g.longest) {
        return;
    }
    let path = flushing_marker();
    match fs::write(&path, format!("{}\n", g.longest)) {
        Ok(()) => g.written = Some(g.longest),
        Err(e) => log::debug!("stepscope: cannot write {}: {e}", path.display()),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flushing_marker_exists_while_traces_are_in_flight() {
        let marker = flushing_marker();
        in_flight_begin(Duration::from_secs(5));
        in_flight_begin(Duration::from_secs(30));
        assert!(
            !marker.exists(),
            "written by the writer threads, not in stop()"
        );
        publish_in_flight();
        assert_eq!(fs::read_to_string(&marker).unwrap(), "30\n");
        in_flight_end(1);
        assert!(marker.exists(), "one trace is still in flight");
        in_flight_end(1);
        assert!(!marker.exists());
    }
}
