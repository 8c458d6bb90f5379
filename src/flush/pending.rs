//! Tracking of background trace writes, so callers can wait for them without holding any lock
//! the engine thread needs, and learn where each trace went and how its write ended.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::manifest::Status;

/// One trace handed to a writer: where its files go and how its write stands.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct TraceWrite {
    /// Its place in the order this writer was handed traces, from 1 (see
    /// [`PendingWrites::ticket`]).
    pub seq: u64,
    /// The trace file, where it is (or will be) when written.
    pub trace_file: PathBuf,
    /// Its manifest.
    pub manifest_file: PathBuf,
    /// `writing` until the write ends, then `complete` or `failed`.
    pub status: Status,
    /// Why it failed.
    pub error: Option<String>,
}

/// Of the traces whose write has ended, the newest this many are kept (the ones still being
/// written always are): what a caller waiting on a stop reads back.
const KEPT: usize = 64;

#[derive(Debug, Default)]
struct State {
    /// Writes in flight.
    count: usize,
    /// The last `seq` given.
    last_seq: u64,
    /// The traces, oldest first.
    traces: VecDeque<TraceWrite>,
}

/// A count of writes in flight, shared between a backend's writer and whoever waits, with
/// each trace's outcome.
///
/// Cloning is cheap (one `Arc`). A backend hands a clone to the profiler through
/// [`crate::backend::Backend::pending_writes`]; `WorkerProfiler::flush` waits on it after
/// releasing the profiler's lock, so a long wait never blocks the engine's `step()`.
#[derive(Debug, Clone, Default)]
pub struct PendingWrites {
    inner: Arc<(Mutex<State>, Condvar)>,
}

impl PendingWrites {
    /// A write was queued (one that no caller will ask about by name).
    pub fn begin(&self) {
        self.inner.0.lock().count += 1;
    }

    /// A queued write finished (successfully or not).
    pub fn finish(&self) {
        let (state, cv) = &*self.inner;
        let mut s = state.lock();
        s.count = s.count.saturating_sub(1);
        if s.count == 0 {
            cv.notify_all();
        }
    }

    /// A trace was queued for writing to `trace_file`, with its manifest at `manifest_file`;
    /// returns its `seq`. [`PendingWrites::finish_trace`] ends it.
    pub fn begin_trace(&self, trace_file: PathBuf, manifest_file: PathBuf) -> u64 {
        let mut s = self.inner.0.lock();
        s.count += 1;
        s.last_seq += 1;
        let seq = s.last_seq;
        s.traces.push_back(TraceWrite {
            seq,
            trace_file,
            manifest_file,
            status: Status::Writing,
            error: None,
        });
        seq
    }

    /// The write of the trace whose manifest is `manifest_file` ended so.
    pub fn finish_trace(
        &self,
        manifest_file: &std::path::Path,
        status: Status,
        error: Option<String>,
    ) {
        {
            let mut s = self.inner.0.lock();
            if let Some(t) = s
                .traces
                .iter_mut()
                .rev()
                .find(|t| t.manifest_file == manifest_file && t.status == Status::Writing)
            {
                t.status = status;
                t.error = error;
            }
            let ended = s
                .traces
                .iter()
                .filter(|t| t.status != Status::Writing)
                .count();
            if ended > KEPT {
                if let Some(at) = s.traces.iter().position(|t| t.status != Status::Writing) {
                    s.traces.remove(at);
                }
            }
        }
        self.finish();
    }

    /// Writes still in flight.
    pub fn count(&self) -> usize {
        self.inner.0.lock().count
    }

    /// A mark to read outcomes from: the `seq` of the oldest trace still being written, else
    /// the next one to be given. Taken before a stop, [`PendingWrites::traces_since`] with it
    /// returns every trace that was unwritten then or queued since.
    pub fn ticket(&self) -> u64 {
        let s = self.inner.0.lock();
        s.traces
            .iter()
            .find(|t| t.status == Status::Writing)
            .map_or(s.last_seq + 1, |t| t.seq)
    }

    /// The traces with `seq >= ticket` still kept, oldest first.
    pub fn traces_since(&self, ticket: u64) -> Vec<TraceWrite> {
        let s = self.inner.0.lock();
        s.traces
            .iter()
            .filter(|t| t.seq >= ticket)
            .cloned()
            .collect()
    }

    /// The last `n` traces kept, oldest first.
    pub fn last_traces(&self, n: usize) -> Vec<TraceWrite> {
        let s = self.inner.0.lock();
        s.traces
            .iter()
            .skip(s.traces.len().saturating_sub(n))
            .cloned()
            .collect()
    }

    /// Waits until no write is in flight, at most `timeout`. `true` when none is.
    pub fn wait(&self, timeout: Duration) -> bool {
        let (state, cv) = &*self.inner;
        let deadline = Instant::now().checked_add(timeout);
        let mut s = state.lock();
        while s.count > 0 {
            match deadline {
                Some(d) => {
                    if cv.wait_until(&mut s, d).timed_out() {
                        return s.count == 0;
                    }
                }
                None => cv.wait(&mut s),
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_returns_when_the_last_write_finishes() {
        let p = PendingWrites::default();
        p.begin();
        assert!(!p.wait(Duration::from_millis(1)));
        let q = p.clone();
        let t = std::thread::spawn(move || q.finish());
        assert!(p.wait(Duration::from_secs(60)));
        t.join().unwrap();
        assert_eq!(p.count(), 0);
    }

    #[test]
    fn a_ticket_reads_the_traces_unwritten_then_and_queued_since() {
        let p = PendingWrites::default();
        let m = |n: u32| PathBuf::from(format!("m{n}"));
        assert_eq!(p.ticket(), 1);
        assert_eq!(p.begin_trace("t1".into(), m(1)), 1);
        p.finish_trace(&m(1), Status::Complete, None);
        assert_eq!(p.begin_trace("t2".into(), m(2)), 2);
        // t2 is still being written: a ticket now reads it, not t1.
        let ticket = p.ticket();
        assert_eq!(ticket, 2);
        p.begin_trace("t3".into(), m(3));
        p.finish_trace(&m(3), Status::Failed, Some("disk full".into()));
        let since: Vec<_> = p
            .traces_since(ticket)
            .into_iter()
            .map(|t| (t.seq, t.status))
            .collect();
        assert_eq!(since, [(2, Status::Writing), (3, Status::Failed)]);
        assert_eq!(p.count(), 1);
        p.finish_trace(&m(2), Status::Complete, None);
        assert_eq!(p.count(), 0);
        assert_eq!(p.ticket(), 4);
        assert_eq!(
            p.traces_since(ticket)[1].error.as_deref(),
            Some("disk full")
        );
    }

    #[test]
    fn ended_traces_are_kept_up_to_a_bound_and_unended_ones_always() {
        let p = PendingWrites::default();
        p.begin_trace("first".into(), "m0".into());
        for n in 1..=(KEPT as u64 + 10) {
            let m = PathBuf::from(format!("m{n}"));
            p.begin_trace("t".into(), m.clone());
            p.finish_trace(&m, Status::Complete, None);
        }
        let kept = p.traces_since(0);
        assert_eq!(kept.len(), KEPT + 1, "the bound, and the one still writing");
        assert_eq!(kept[0].seq, 1);
        assert_eq!(kept[0].status, Status::Writing);
        assert_eq!(p.last_traces(2).len(), 2);
    }
}
