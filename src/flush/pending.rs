//! Tracking of background trace writes, so callers can wait for them without holding any lock
//! the engine thread needs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

/// A count of writes in flight, shared between a backend's writer and whoever waits.
///
/// Cloning is cheap (one `Arc`). A backend hands a clone to the profiler through
/// [`crate::backend::Backend::pending_writes`]; `WorkerProfiler::flush` waits on it after
/// releasing the profiler's lock, so a long wait never blocks the engine's `step()`.
#[derive(Debug, Clone, Default)]
pub struct PendingWrites {
    inner: Arc<(Mutex<usize>, Condvar)>,
}

impl PendingWrites {
    /// A write was queued.
    pub fn begin(&self) {
        *self.inner.0.lock() += 1;
    }

    /// A queued write finished (successfully or not).
    pub fn finish(&self) {
        let (count, cv) = &*self.inner;
        let mut n = count.lock();
        *n = n.saturating_sub(1);
        if *n == 0 {
            cv.notify_all();
        }
    }

    /// Writes still in flight.
    pub fn count(&self) -> usize {
        *self.inner.0.lock()
    }

    /// Waits until no write is in flight, at most `timeout`. `true` when none is.
    pub fn wait(&self, timeout: Duration) -> bool {
        let (count, cv) = &*self.inner;
        let deadline = Instant::now().checked_add(timeout);
        let mut n = count.lock();
        while *n > 0 {
            match deadline {
                Some(d) => {
                    if cv.wait_until(&mut n, d).timed_out() {
                        return *n == 0;
                    }
                }
                None => cv.wait(&mut n),
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
}
