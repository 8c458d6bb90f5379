//! The safe wrappers over the glue's functions: the glue ready ([`Kineto`]), a session taken
//! off the engine thread ([`Detached`]), its result ([`TraceResult`]) and the iteration
//! annotation ([`Range`]); each owned handle frees what it owns once.

use std::ffi::{c_char, c_int, c_void};
use std::ptr::{self, NonNull};

use crossbeam_channel::Sender;

use super::glue::{
    self, call, failed, Api, Options, RawDetached, RawEvent, RawRange, RawResult, RawRow,
    RowsReady, SERIALIZER_KINETO, SERIALIZER_STEPSCOPE,
};
use super::provider::provider;
use crate::backend::torch::op_table::OpEvent;
use crate::error::Result;
use stepscope_format::hash::FastMap;

/// A finished session's events as the op table reads them: each distinct name once, and each
/// event's fields with its name's index (`OpEvent::name` empty until [`EventRows::events`]
/// lends it). Names repeat across a capture's events (an op, a Python frame, once per call).
#[derive(Default)]
pub(crate) struct EventRows {
    names: Vec<Box<str>>,
    rows: Vec<(u32, OpEvent<'static>)>,
}

impl EventRows {
    /// The events, in the session's order, each with its name.
    pub(crate) fn events(&self) -> impl Iterator<Item = OpEvent<'_>> {
        self.rows.iter().map(|(name, e)| OpEvent {
            name: self.names.get(*name as usize).map_or("", |n| n),
            ..*e
        })
    }
}

/// The glue, ready: the only way to the functions above.
#[derive(Clone, Copy)]
pub(crate) struct Kineto {
    api: &'static Api,
}

impl Kineto {
    /// The glue, linked or loaded (loading happens once per process, at the first call).
    pub(crate) fn get() -> Result<Kineto> {
        provider().map(|(api, _)| Kineto { api })
    }

    pub(crate) fn cuda_available(self) -> bool {
        // SAFETY: a glue function without arguments; it catches every exception.
        unsafe { (self.api.cuda_available)() != 0 }
    }

    /// Whether this torch has `trace_only` (2.13 and later); the glue ignores it before.
    pub(crate) fn has_trace_only(self) -> bool {
        glue::has_trace_only(self.api)
    }

    /// Whether stepscope's serializer writes the Python parents `trace_only` leaves out.
    pub(crate) fn writes_python_parents(self) -> bool {
        glue::writes_python_parents(self.api)
    }

    pub(crate) fn prepare(self, o: &Options) -> Result<()> {
        // SAFETY: o outlives the call; the buffer is call()'s.
        call("prepareProfiler", |err, len| unsafe {
            (self.api.prepare)(o, err, len)
        })
    }

    pub(crate) fn enable(self, o: &Options) -> Result<usize> {
        let mut session = 0usize;
        // SAFETY: o and session outlive the call.
        call("enableProfiler", |err, len| unsafe {
            (self.api.enable)(o, &mut session, err, len)
        })?;
        Ok(session)
    }

    pub(crate) fn detach(self, session: usize) -> Result<Detached> {
        let mut out = ptr::null_mut();
        // SAFETY: out outlives the call; the glue checks the session against this thread's.
        call("disableProfiler", |err, len| unsafe {
            (self.api.detach)(session, &mut out, err, len)
        })?;
        NonNull::new(out)
            .map(|ptr| Detached { api: self.api, ptr })
            .ok_or_else(|| failed("disableProfiler", "the glue returned no session"))
    }

    pub(crate) fn toggle(self, enable: bool, o: &Options) -> Result<()> {
        // SAFETY: o outlives the call.
        call("toggleCollectionDynamic", |err, len| unsafe {
            (self.api.toggle)(c_int::from(enable), o, err, len)
        })
    }

    pub(crate) fn add_metadata(self, key: &str, json: &str) -> Result<()> {
        // SAFETY: (pointer, length) pairs of live strings.
        call("addMetadataJson", |err, len| unsafe {
            (self.api.add_metadata)(
                key.as_ptr().cast(),
                key.len(),
                json.as_ptr().cast(),
                json.len(),
                err,
                len,
            )
        })
    }

    pub(crate) fn new_range(self) -> Result<Range> {
        let mut out = ptr::null_mut();
        // SAFETY: out outlives the call.
        call("RecordFunction", |err, len| unsafe {
            (self.api.range_new)(&mut out, err, len)
        })?;
        NonNull::new(out)
            .map(|ptr| Range {
                api: self.api,
                ptr,
                id_ptrs: Vec::new(),
                id_lens: Vec::new(),
            })
            .ok_or_else(|| failed("RecordFunction", "the glue returned no range"))
    }
}

/// A profiling session taken off the engine thread: no longer recording, not yet finalized.
pub(crate) struct Detached {
    api: &'static Api,
    ptr: NonNull<RawDetached>,
}

// SAFETY: a detached session is no longer reachable from the engine thread (its state was
// popped from that thread and its callback removed); the finalizer thread owns it alone.
unsafe impl Send for Detached {}

impl Detached {
    /// The expensive half of disableProfiler (Kineto's stopTrace), on the calling thread.
    pub(crate) fn finalize(&mut self) -> Result<TraceResult> {
        const WHAT: &str = "finalizing the session (disableProfiler)";
        let mut out = ptr::null_mut();
        // SAFETY: ptr is live until drop; the glue refuses a session finalized before.
        call(WHAT, |err, len| unsafe {
            (self.api.finalize)(self.ptr.as_ptr(), &mut out, err, len)
        })?;
        NonNull::new(out)
            .map(|ptr| TraceResult { api: self.api, ptr })
            .ok_or_else(|| failed(WHAT, "the glue returned no result"))
    }
}

impl Drop for Detached {
    fn drop(&mut self) {
        // SAFETY: ptr came from detach and is freed once, here.
        unsafe { (self.api.detached_free)(self.ptr.as_ptr()) }
    }
}

/// A finished session's events and trace, owned until saved.
pub(crate) struct TraceResult {
    api: &'static Api,
    ptr: NonNull<RawResult>,
}

// SAFETY: a result is plain data once the session is disabled (Kineto's events and activity
// buffers, owned by it alone); the writer thread is its only user, and it is dropped there.
unsafe impl Send for TraceResult {}

// SAFETY: two threads use a result at once, the saver's `save` and the op table's
// `take_events`, and they touch disjoint data. `save` (torch's `ProfilerResult::save`, once:
// torch refuses a second) replays Kineto's activity buffers and trace metadata into the
// serializer, and consumes those buffers. `take_events` reads torch's event list
// (`KinetoEvent`s, their `Result`s, immutable once finalized; the links between them are
// `shared_ptr`/`weak_ptr`s, whose counts are atomic), then frees that list and torch's event
// tree, none of which the save reads (the `Result`s point into Kineto's buffers, never the other
// way). `take_events` is called from one thread at a time (`&self`, but the writer calls it once,
// from the op table's thread). Dropping takes `&mut`, after both.
unsafe impl Sync for TraceResult {}

impl TraceResult {
    /// Writes the trace JSON (to `{path}.tmp`, then renamed to `path`): Kineto's own writer,
    /// or stepscope's (`cpp/kineto_writer.h`); with a `reference`, Kineto's own writer also
    /// writes the same capture there. With `rows` (stepscope's writer), the save keeps the op
    /// table's rows from the activities it writes and sends on `rows` once they are all kept,
    /// before the file is written ([`TraceResult::take_rows`] reads them from then on).
    /// Called once; `take_events` may run beside it on another thread.
    pub(crate) fn save(
        &self,
        path: &str,
        ours: bool,
        reference: Option<&str>,
        rows: Option<&Sender<()>>,
    ) -> Result<()> {
        let serializer = if ours {
            SERIALIZER_STEPSCOPE
        } else {
            SERIALIZER_KINETO
        };
        let reference = reference.unwrap_or("");
        let (ready, user): (Option<RowsReady>, *mut c_void) = match rows {
            Some(tx) => (Some(rows_ready), ptr::from_ref(tx).cast_mut().cast()),
            None => (None, ptr::null_mut()),
        };
        // SAFETY: ptr is live; path and reference are live (pointer, length) pairs; `user`,
        // when given, is the `&Sender` that outlives the call, which is all rows_ready needs.
        call(&format!("saving the trace to {path}"), |err, len| unsafe {
            (self.api.save)(
                self.ptr.as_ptr(),
                path.as_ptr().cast(),
                path.len(),
                serializer,
                reference.as_ptr().cast(),
                reference.len(),
                ready,
                user,
                err,
                len,
            )
        })
    }

    /// The op table's rows a save kept (`save`'s `rows`), read once it has said they are all
    /// kept (never before: the save writes them until then); none where it kept none.
    pub(crate) fn take_rows(&self) -> EventRows {
        let mut count = 0usize;
        // SAFETY: ptr is live; the rows are no longer written once the save said so, and live
        // with the result.
        let rows = unsafe { (self.api.rows)(self.ptr.as_ptr(), &mut count) };
        let rows: &[RawRow] = if rows.is_null() || count == 0 {
            &[]
        } else {
            // SAFETY: the glue's vector of `count` rows, unchanged from now on (above).
            unsafe { std::slice::from_raw_parts(rows, count) }
        };
        // SAFETY: as above.
        let n_names = unsafe { (self.api.row_name_count)(self.ptr.as_ptr()) };
        let names = (0..n_names)
            .map(|i| {
                let mut len = 0usize;
                // SAFETY: i is below the count; the name lives with the result.
                let p = unsafe { (self.api.row_name)(self.ptr.as_ptr(), i, &mut len) };
                if p.is_null() {
                    return Box::from("");
                }
                // SAFETY: `len` bytes at `p`, alive with the result.
                let bytes = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) };
                String::from_utf8_lossy(bytes).into_owned().into_boxed_str()
            })
            .collect();
        let as_ns = |v: i64| u64::try_from(v).unwrap_or(0);
        let rows = rows
            .iter()
            .map(|r| {
                let thread = as_ns(r.thread);
                (
                    r.name,
                    OpEvent {
                        name: "",
                        thread,
                        end_thread: thread,
                        start_ns: as_ns(r.start_ns),
                        duration_ns: as_ns(r.duration_ns),
                        correlation: as_ns(r.correlation),
                        user_annotation: r.user_annotation != 0,
                        python_function: r.python_function != 0,
                        ..OpEvent::default()
                    },
                )
            })
            .collect();
        EventRows { names, rows }
    }

    /// The version of the torch the glue was built for (`2.13.0`).
    pub(crate) fn torch_version(&self) -> String {
        glue::built_for(self.api)
    }

    /// torch's event list, read, then freed with torch's event tree (the bulk of what freeing
    /// a capture costs): a second call finds none. `save` may run beside it on another thread.
    pub(crate) fn take_events(&self) -> Result<EventRows> {
        let rows = self.read_events();
        self.release_events();
        rows
    }

    /// Frees torch's event list and event tree, unread (what `take_events` reads). `save` may
    /// run beside it on another thread.
    pub(crate) fn release_events(&self) {
        // SAFETY: ptr is live; no other thread reads the event list (see `Sync` above).
        unsafe { (self.api.release_events)(self.ptr.as_ptr()) };
    }

    fn read_events(&self) -> Result<EventRows> {
        // SAFETY: ptr is live.
        let n = unsafe { (self.api.event_count)(self.ptr.as_ptr()) };
        let mut read = EventRows {
            names: Vec::new(),
            rows: Vec::with_capacity(n),
        };
        let mut ids: FastMap<Box<[u8]>, u32> = FastMap::default();
        let mut name = vec![0u8; 256];
        for i in 0..n {
            let mut raw = RawEvent::default();
            loop {
                // SAFETY: raw and name outlive the call; name's capacity is passed.
                call("reading the session's events", |err, len| unsafe {
                    (self.api.event_at)(
                        self.ptr.as_ptr(),
                        i,
                        &mut raw,
                        name.as_mut_ptr().cast(),
                        name.len(),
                        err,
                        len,
                    )
                })?;
                if raw.name_len <= name.len() {
                    break;
                }
                name.resize(raw.name_len, 0);
            }
            let bytes = &name[..raw.name_len];
            let id = match ids.get(bytes) {
                Some(&id) => id,
                None => {
                    let id = u32::try_from(read.names.len()).unwrap_or(u32::MAX);
                    read.names
                        .push(String::from_utf8_lossy(bytes).into_owned().into_boxed_str());
                    ids.insert(bytes.into(), id);
                    id
                }
            };
            read.rows.push((
                id,
                OpEvent {
                    name: "",
                    thread: raw.thread,
                    end_thread: raw.end_thread,
                    start_ns: raw.start_ns,
                    duration_ns: raw.duration_ns,
                    correlation: raw.correlation,
                    linked_correlation: raw.linked_correlation,
                    device: raw.device != 0,
                    is_async: raw.is_async != 0,
                    hidden: raw.hidden != 0,
                    user_annotation: raw.user_annotation != 0,
                    python_function: raw.python_function != 0,
                    overhead: raw.overhead != 0,
                },
            ));
        }
        Ok(read)
    }
}

/// `rows_ready` for `save`: `user` is the `&Sender<()>` the save was given.
unsafe extern "C" fn rows_ready(user: *mut c_void) {
    // SAFETY: save passes the `&Sender<()>` it was given, alive for the whole save.
    let tx = unsafe { &*user.cast::<Sender<()>>() };
    // The receiver may be gone (the table's thread ended): nothing to tell then.
    let _ = tx.send(());
}

impl Drop for TraceResult {
    fn drop(&mut self) {
        // SAFETY: ptr came from finalize and is freed once, here.
        unsafe { (self.api.result_free)(self.ptr.as_ptr()) }
    }
}

/// A reusable `USER_SCOPE` `RecordFunction` range: one iteration's annotation at a time.
pub(crate) struct Range {
    api: &'static Api,
    ptr: NonNull<RawRange>,
    /// The (pointer, length) pairs of the request ids passed to the glue, reused so that
    /// captured iterations allocate no new arrays for them; empty between calls.
    id_ptrs: Vec<*const c_char>,
    id_lens: Vec<usize>,
}

// SAFETY: the range is only begun and ended on the engine thread (the profiler's thread rules);
// the backend that owns it may be moved between threads only while no range is open.
unsafe impl Send for Range {}

impl Range {
    /// Opens the annotation `name` of step `step`, with the ids of the requests it serves.
    pub(crate) fn begin(&mut self, name: &str, step: u64, requests: &[String]) -> Result<()> {
        self.id_ptrs
            .extend(requests.iter().map(|r| r.as_ptr().cast::<c_char>()));
        self.id_lens.extend(requests.iter().map(String::len));
        let (ptrs, lens) = (&self.id_ptrs, &self.id_lens);
        // SAFETY: ptr is live; name is a live (pointer, length) pair; `ptrs` and `lens` hold
        // `requests.len()` (pointer, length) pairs of strings alive for the call.
        let result = call("RecordFunction begin", |err, len| unsafe {
            (self.api.range_begin)(
                self.ptr.as_ptr(),
                name.as_ptr().cast(),
                name.len(),
                step,
                ptrs.as_ptr(),
                lens.as_ptr(),
                requests.len(),
                err,
                len,
            )
        });
        // No pointer outlives the call.
        self.id_ptrs.clear();
        self.id_lens.clear();
        result
    }

    pub(crate) fn end(&mut self) -> Result<()> {
        // SAFETY: ptr is live.
        call("RecordFunction end", |err, len| unsafe {
            (self.api.range_end)(self.ptr.as_ptr(), err, len)
        })
    }
}

impl Drop for Range {
    fn drop(&mut self) {
        // SAFETY: ptr came from range_new and is freed once, here.
        unsafe { (self.api.range_free)(self.ptr.as_ptr()) }
    }
}

#[cfg(all(test, feature = "torch"))]
mod tests {
    use super::*;

    /// torch's profiler is the process's: one test's session at a time (two at once crashed
    /// the test process in libtorch).
    static ONE_SESSION: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

    /// The result of a session of three steps annotated `name`, finalized with or without
    /// torch's `trace_only`. The caller holds [`ONE_SESSION`] until it is done with it.
    fn three_steps(name: &str, trace_only: bool) -> TraceResult {
        let kineto = Kineto::get().expect("the linked glue");
        let options = Options {
            cpu: true,
            trace_only,
            ..Options::default()
        };
        kineto.prepare(&options).expect("prepareProfiler");
        let session = kineto.enable(&options).expect("enableProfiler");
        let mut range = kineto.new_range().expect("a range");
        for step in 1..=3 {
            range.begin(name, step, &[]).expect("begin");
            range.end().expect("end");
        }
        drop(range);
        let mut detached = kineto.detach(session).expect("detach");
        detached.finalize().expect("finalize")
    }

    /// The events a session of three annotated steps leaves in its result (the list the op
    /// table reads), finalized with or without torch's `trace_only`.
    fn events_kept(trace_only: bool) -> usize {
        let _alone = ONE_SESSION.lock();
        let result = three_steps("step", trace_only);
        result
            .take_events()
            .expect("the event list")
            .events()
            .count()
    }

    #[test]
    fn the_event_list_once_taken_is_freed_and_the_trace_still_saves_whole() {
        let _alone = ONE_SESSION.lock();
        let result = three_steps("stepscope_taken", false);
        let rows = result.take_events().expect("the event list");
        let named = |rows: &EventRows| {
            rows.events()
                .filter(|e| e.name == "stepscope_taken")
                .count()
        };
        assert_eq!(named(&rows), 3);
        assert_eq!(
            result
                .take_events()
                .expect("the list, freed")
                .events()
                .count(),
            0
        );
        // The trace is Kineto's buffers, not the list: still whole.
        let dir = stepscope_test_doubles::Scratch::empty("kineto-taken");
        let path = dir.join("t.json");
        result
            .save(path.to_str().expect("a UTF-8 path"), true, None, None)
            .expect("save");
        let json = std::fs::read_to_string(&path).expect("the trace");
        assert_eq!(json.matches("\"stepscope_taken\"").count(), 3, "{json}");
    }

    #[test]
    fn torch_builds_the_event_list_in_a_full_finalize_and_not_in_a_trace_only_one() {
        // libtorch as linked here (the project's torch 2.13) has the switch.
        assert!(Kineto::get().expect("the linked glue").has_trace_only());
        assert!(events_kept(false) >= 3);
        assert_eq!(events_kept(true), 0);
    }
}
