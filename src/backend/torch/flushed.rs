//! The torch backend's captures as the flush layer writes them: a detached Kineto session to
//! finalize, its result to save, and the op table (`{stem}.profiler_out.txt`) beside the trace.

use std::path::Path;

use super::kineto::{Detached, TraceResult};
use super::op_table::{self, SortBy};
use crate::error::Result;
use crate::files::write_atomic;
use crate::flush::{self, Trace};

/// A stopped Kineto session, with whether its op table is wanted.
pub(super) struct KinetoCapture {
    pub session: Detached,
    pub table: Option<SortBy>,
}

impl flush::Capture for KinetoCapture {
    fn finalize(mut self: Box<Self>) -> Result<Box<dyn Trace>> {
        let result = self.session.finalize()?;
        Ok(Box::new(KinetoTrace {
            result,
            table: self.table,
        }))
    }
}

struct KinetoTrace {
    result: TraceResult,
    table: Option<SortBy>,
}

impl Trace for KinetoTrace {
    fn save(&mut self, path: &str) -> Result<()> {
        self.result.save(path)
    }

    fn write_extras(&mut self, dir: &Path, stem: &str) -> Result<Option<String>> {
        match self.table {
            Some(sort) => write_table(dir, &self.result, stem, sort).map(Some),
            None => Ok(None),
        }
    }
}

/// `{stem}.profiler_out.txt`: the top ops by self device (or CPU) time, in torch's layout.
fn write_table(dir: &Path, result: &TraceResult, stem: &str, sort: SortBy) -> Result<String> {
    let rows = result.events()?;
    let events: Vec<op_table::OpEvent<'_>> = rows
        .iter()
        .map(|r| op_table::OpEvent {
            name: &r.name,
            thread: r.thread,
            start_ns: r.start_ns,
            duration_ns: r.duration_ns,
            device: r.device,
            is_async: r.is_async,
        })
        .collect();
    let stats = op_table::op_totals(&events);
    // Kineto's device activity here is CUDA's (the backend records no other device's).
    let device = "CUDA";
    let limit = match sort {
        SortBy::SelfDevice => 100,
        SortBy::SelfCpu => 50,
    };
    let table = op_table::table(&stats, sort, limit, device);
    let name = format!("{stem}.profiler_out.txt");
    // vLLM writes the table with print(): one more newline.
    write_atomic(&dir.join(&name), (table + "\n").as_bytes())?;
    Ok(name)
}
