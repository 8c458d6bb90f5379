//! The torch backend's captures as the flush layer writes them: a detached Kineto session to
//! finalize, its result to save, and the op table (`{stem}.profiler_out.txt`) beside the trace.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;

use super::kineto::{Detached, EventRows, TraceResult};
use super::op_table::{self, SortBy};
use crate::config::Serializer;
use crate::error::{Error, Result};
use crate::files::{write_synced, Synced, TempFile};
use crate::flush::{self, Trace};

/// A stopped Kineto session, with whether its op table is wanted and who writes its JSON.
pub(super) struct KinetoCapture {
    pub session: Detached,
    pub table: Option<SortBy>,
    /// The op table (there is one) is made from the rows stepscope's serializer keeps of the
    /// activities it writes, not from torch's event list (the finalize built none:
    /// `SessionOptions::table_from_activities`).
    pub table_from_activities: bool,
    pub serializer: Serializer,
    /// When the capture stopped (the trace header's `stop_unix_ns`): the op table leaves out
    /// what began after it.
    pub stop_unix_ns: Option<u64>,
}

impl flush::Capture for KinetoCapture {
    fn finalize(mut self: Box<Self>) -> Result<Box<dyn Trace>> {
        let result = self.session.finalize()?;
        let rows = self.table_from_activities.then(|| {
            let (tx, rx) = crossbeam_channel::bounded(1);
            RowsHandOff {
                tx: Mutex::new(Some(tx)),
                rx,
            }
        });
        Ok(Box::new(KinetoTrace {
            result,
            table: self.table,
            rows,
            serializer: self.serializer,
            reference: OnceLock::new(),
            stop_unix_ns: self.stop_unix_ns,
        }))
    }
}

/// The save's word that the op table's rows are kept: sent by the saver thread from within the
/// save, awaited by the op table's thread. The sender is dropped when the save returns, or when
/// the writer says there will be none (`save_over`), so a save that kept none (it failed, never
/// ran, or Kineto's own writer wrote the trace) ends the wait.
struct RowsHandOff {
    tx: Mutex<Option<Sender<()>>>,
    rx: Receiver<()>,
}

impl RowsHandOff {
    /// The sender, for the save (or to drop it: no save to come); `None` once taken.
    fn take_sender(&self) -> Option<Sender<()>> {
        self.tx.lock().take()
    }
}

struct KinetoTrace {
    result: TraceResult,
    table: Option<SortBy>,
    /// Where the table's events come from the save (`table_from_activities`).
    rows: Option<RowsHandOff>,
    serializer: Serializer,
    /// Kineto's own JSON of the capture (`Serializer::Compare`), until moved beside the trace.
    reference: OnceLock<TempFile>,
    stop_unix_ns: Option<u64>,
}

impl Trace for KinetoTrace {
    fn save(&self, path: &str) -> Result<()> {
        // Taken for the save and dropped after it, kept rows or not.
        let tx = self.rows.as_ref().and_then(RowsHandOff::take_sender);
        match self.serializer {
            Serializer::Kineto => self.result.save(path, false, None, None),
            Serializer::Stepscope => self.result.save(path, true, None, tx.as_ref()),
            Serializer::Compare => {
                let reference = self
                    .reference
                    .get_or_init(|| TempFile::new(PathBuf::from(format!("{path}.kineto.json"))));
                let at = reference.path().to_string_lossy().into_owned();
                self.result.save(path, true, Some(&at), None)
            }
        }
    }

    fn save_over(&self) {
        // A save that never ran keeps no rows: the op table's wait ends.
        drop(self.rows.as_ref().and_then(RowsHandOff::take_sender));
    }

    fn side_file(&self, dir: &Path, stem: &str) -> Result<Option<Synced>> {
        match self.table {
            Some(sort) => match self.table_events(stem)? {
                Some(rows) => {
                    write_table(dir, &self.result, rows, stem, sort, self.stop_unix_ns).map(Some)
                }
                None => Ok(None),
            },
            None => {
                // Nothing reads torch's event list: freed now, beside the save.
                self.result.release_events();
                Ok(None)
            }
        }
    }

    fn write_extras(&mut self, dir: &Path, stem: &str) -> Result<()> {
        if let Some(reference) = self.reference.take() {
            let to = dir.join(format!("{stem}.kineto.json"));
            if reference.path().exists() {
                std::fs::rename(reference.path(), &to).map_err(|e| {
                    Error::io(&to, format!("cannot move Kineto's trace here: {e}"), e)
                })?;
                reference.keep();
            } else {
                // The glue wrote the trace with Kineto's own writer (its libtorch lacks what
                // stepscope's needs): the trace is Kineto's, and nothing to compare it with.
                log::warn!(
                    "stepscope: no {} beside the trace: Kineto's own writer wrote it (this \
                     torch's Kineto does not offer what stepscope's serializer needs)",
                    to.display()
                );
            }
        }
        Ok(())
    }
}

impl KinetoTrace {
    /// The op table's events: torch's event list, or the rows the save kept once it says it
    /// has kept them all; `None` where it kept none.
    fn table_events(&self, stem: &str) -> Result<Option<EventRows>> {
        let Some(hand_off) = &self.rows else {
            return self.result.take_events().map(Some);
        };
        if hand_off.rx.recv().is_ok() {
            return Ok(Some(self.result.take_rows()));
        }
        // The save kept no rows: it failed or never ran (its error is the trace's), or a
        // logger other than Kineto's file logger wrote the trace.
        log::warn!(
            "stepscope: no {} for {stem}: the trace's save kept no events for it (it failed \
             or never ran, or another logger than Kineto's file logger wrote the trace)",
            crate::manifest::op_table_name(stem)
        );
        Ok(None)
    }
}

/// `{stem}.profiler_out.txt`: the top ops by self device (or CPU) time, in torch's layout, of
/// the events the capture's window holds; whole in its temporary, for the writer to rename once
/// the trace is in place.
///
/// It runs while the trace is saved, on another thread: it reads torch's event list, which the
/// save never touches (`TraceResult`'s `Sync`), then frees it with torch's event tree; or,
/// where the finalize built no list, the rows the save kept of the activities it wrote, from the
/// moment it has kept them all (before it writes the file).
///
/// The engine thread only detaches the session at the stop (it never waits), and Kineto
/// records until the writer's finalize stops it (torch's Python tracer is taken off the thread
/// that stops by the Python binding's stop; other threads' frames are still recorded): the CPU
/// events (ops, annotations, Python frames) that began after `stop_unix_ns` are the next
/// steps', not the window's, and are left out, as the trace's summary leaves out what was launched after the stop. torch's own stop
/// (vLLM's table) ends the recording at once. Device events are kept: a kernel launched before
/// the stop may run after it, and which call launched one takes correlation ids this table is
/// not given (the summary reads them from the trace).
fn write_table(
    dir: &Path,
    result: &TraceResult,
    rows: EventRows,
    stem: &str,
    sort: SortBy,
    stop_unix_ns: Option<u64>,
) -> Result<Synced> {
    let in_window =
        |e: &op_table::OpEvent<'_>| e.device || stop_unix_ns.is_none_or(|stop| e.start_ns <= stop);
    let events: Vec<op_table::OpEvent<'_>> = rows.events().filter(in_window).collect();
    // Kineto's device activity here is CUDA's (the backend records no other device's).
    let table = op_table::render(
        &events,
        sort,
        sort.row_limit(),
        "CUDA",
        &result.torch_version(),
    );
    // vLLM writes the table with print(): one more newline.
    write_synced(
        &dir.join(crate::manifest::op_table_name(stem)),
        (table + "\n").as_bytes(),
    )
}
