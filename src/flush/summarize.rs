//! The summary each manifest carries (`"summary"`): computed from the trace's JSON as it
//! streams to disk, on a thread of its own beside the gzip pump, so the writer's time to a
//! complete trace does not grow with it. `stepscope analyze DIR` reads these instead of the
//! traces (see `stepscope::trace::Summary`).

use std::fs::File;
use std::io::BufReader;
use std::path::Path;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::thread::{Scope, ScopedJoinHandle};

use crate::trace::{EventStream, Summarizer, Summary, CHUNK_HEADROOM};

/// Kernel and operator names a manifest's summary keeps.
pub(crate) const SUMMARY_TOP: usize = 20;

/// Chunks queued for the summarizing thread: a slow summary makes the pump wait, never grow
/// a queue.
const QUEUE: usize = 4;

/// The summarizing thread, fed copies of what the pump writes.
pub(super) struct SummaryThread<'scope> {
    tx: Option<SyncSender<Vec<u8>>>,
    /// Emptied chunk buffers coming back for reuse.
    spent: Receiver<Vec<u8>>,
    handle: ScopedJoinHandle<'scope, Option<Summary>>,
}

impl<'scope> SummaryThread<'scope> {
    /// Starts the thread; `None` if it cannot be started (the trace is written without a
    /// summary).
    pub(super) fn spawn<'env>(scope: &'scope Scope<'scope, 'env>) -> Option<Self> {
        let (tx, rx) = sync_channel::<Vec<u8>>(QUEUE);
        let (back, spent) = sync_channel::<Vec<u8>>(QUEUE + 2);
        let handle = std::thread::Builder::new()
            .name("stepscope-summary".into())
            .spawn_scoped(scope, move || summarize_chunks(rx, back))
            .map_err(|e| log::debug!("stepscope: no trace summary: cannot start its thread: {e}"))
            .ok()?;
        Some(SummaryThread {
            tx: Some(tx),
            spent,
            handle,
        })
    }

    /// Queues a copy of `bytes`, after [`CHUNK_HEADROOM`] bytes of room for an event the last
    /// chunk cut: the thread reads the copy where it lies (`EventStream::feed_chunk`), not
    /// copied a second time into the stream's buffer (14% of the thread's samples in `perf`
    /// of the writer bench).
    pub(super) fn feed(&mut self, bytes: &[u8]) {
        let Some(tx) = &self.tx else { return };
        let mut chunk = self.spent.try_recv().unwrap_or_default();
        chunk.resize(CHUNK_HEADROOM, 0);
        chunk.extend_from_slice(bytes);
        if tx.send(chunk).is_err() {
            // The thread gave up (malformed JSON): stop copying.
            self.tx = None;
        }
    }

    /// The summary, once the thread has read everything queued.
    pub(super) fn finish(mut self) -> Option<Summary> {
        self.tx = None;
        self.handle.join().ok().flatten()
    }
}

fn summarize_chunks(rx: Receiver<Vec<u8>>, back: SyncSender<Vec<u8>>) -> Option<Summary> {
    let mut sink = Summarizer::new();
    let mut stream = EventStream::new();
    for chunk in rx {
        match stream.feed_chunk(chunk, &mut sink) {
            // The buffer the stream let go of (the chunk before, once read) goes back for reuse.
            Ok(spent) => {
                let _ = back.try_send(spent);
            }
            Err(e) => {
                log::debug!("stepscope: no trace summary: {e}");
                return None;
            }
        }
    }
    match stream.finish(&mut sink) {
        Ok(meta) => Some(sink.finish(meta, SUMMARY_TOP)),
        Err(e) => {
            log::debug!("stepscope: no trace summary: {e}");
            None
        }
    }
}

/// The summary of a JSON trace on disk (the serializer wrote it there itself).
pub(super) fn summarize_file(path: &Path) -> Option<Summary> {
    let file = File::open(path)
        .map_err(|e| log::debug!("stepscope: no trace summary: {}: {e}", path.display()))
        .ok()?;
    let mut sink = Summarizer::new();
    match EventStream::new().read_all(BufReader::with_capacity(1 << 20, file), &mut sink) {
        Ok(meta) => Some(sink.finish(meta, SUMMARY_TOP)),
        Err(e) => {
            log::debug!("stepscope: no trace summary of {}: {e}", path.display());
            None
        }
    }
}
