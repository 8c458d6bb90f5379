//! The writer: two threads that take a stopped capture from the engine thread and put it on
//! disk. The finalizer runs the backend's expensive half of stopping (Kineto must finish one
//! session before the next can start, so it never waits behind a save); the saver serializes,
//! compresses and renames the trace into place, then writes what the backend adds beside it.
//!
//! For each capture, in the settings' directory:
//! - `{worker}.{time_ns}.pt.trace.json.gz` (or `.json`): torch's tensorboard naming, or
//!   `{name}.trace.json.gz` for a named capture (`WorkerProfiler::set_trace_name`). The
//!   serializer writes the JSON under a hidden temporary name; with gzip, a serializer that
//!   writes through `{path}.tmp` (Kineto) writes into a FIFO placed there and a second thread
//!   compresses as it writes; the final name only ever holds a complete trace;
//! - what the backend's [`Trace::write_extras`] adds (torch: `{stem}.profiler_out.txt`);
//! - `{stem}.stepscope.json`: the manifest, written `"writing"` when the job begins and
//!   `"complete"` or `"failed"` (with the error) when it ends. A job still running when the
//!   writer is dropped and the flush timeout passes is marked `"unfinished"`.

use std::fs::{self, File};
use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;

use super::annotate::RequestArgs;
use super::in_flight::{in_flight_begin, in_flight_end, publish_in_flight};
use super::pump::{check_complete, compress, stream_gzip};
use super::summarize::summarize_file;
use super::PendingWrites;
use crate::error::{panic_message, Error, Result};
use crate::files::{is_regular_file, suffixed, temp_path, Synced, TempFile};
use crate::manifest::{manifest_name, trace_names, Manifest, Status, MANIFEST_VERSION};
use crate::trace::Summary;

/// A stopped capture on its way to disk: what a backend hands the writer. `finalize` runs on
/// the finalizer thread.
pub(crate) trait Capture: Send {
    /// Finishes the capture (Kineto: the expensive half of `disableProfiler`); the error says
    /// what failed.
    fn finalize(self: Box<Self>) -> Result<Box<dyn Trace>>;
}

/// A finalized capture, written by the saver thread and dropped there.
///
/// `save` and `side_file` run at once, on two threads (the saver's and one of its own): a
/// capture is `Sync` for that, and each reads what the other never writes.
pub(crate) trait Trace: Send + Sync {
    /// Serializes the trace as JSON to `path` (it may write through `{path}.tmp` and rename
    /// that to `path`, as Kineto does: the writer then streams it through a FIFO). Called once.
    fn save(&self, path: &str) -> Result<()>;

    /// The file that belongs beside the trace (named from `stem` in `dir`: the op table),
    /// made while the trace is serialized and left whole in its temporary; the writer renames
    /// it into place once the trace is, or drops it (and its temporary) if the trace failed.
    /// What only it reads may be freed here too, beside the save.
    fn side_file(&self, _dir: &Path, _stem: &str) -> Result<Option<Synced>> {
        Ok(None)
    }

    /// Called once the writer will call `save` no more: it returned, or the trace failed
    /// before it was called (its directory could not take the file, say). A `side_file` that
    /// waits on something the save gives is let go here.
    fn save_over(&self) {}

    /// Moves what the serializer left for later beside the trace once it is in place (Kineto's
    /// own JSON, for a comparison).
    fn write_extras(&mut self, _dir: &Path, _stem: &str) -> Result<()> {
        Ok(())
    }
}

/// How traces are written; fixed for the backend's life.
pub(crate) struct Settings {
    pub dir: PathBuf,
    /// The gzip level (`stepscope.gzip_level`) of a `.json.gz` trace; `None`: plain JSON.
    pub gzip: Option<u32>,
    pub flush_timeout: Duration,
}

/// One stopped session, on its way to disk.
pub(crate) struct Job {
    /// Detached from the engine thread; the finalizer thread finalizes it.
    pub session: Box<dyn Capture>,
    /// The trace's time stamp (the stop), in the file names.
    pub time_ns: u128,
    pub queued: Instant,
    pub manifest: Manifest,
    /// What the capture is projected to hold in memory at its peak until it is written (the
    /// process's growth over its window times the writer's expansion); 0 when not measured.
    pub held_bytes: u64,
    /// How its files are written.
    pub how: HowToWrite,
}

/// How one job's files are written, beside what its manifest says.
#[derive(Debug, Clone, Default)]
pub(crate) struct HowToWrite {
    /// Write the manifest's `steps` (the requests) into the annotations' args as the trace
    /// streams through (the serializer leaves them out: Kineto without shapes recorded).
    pub requests_into_args: bool,
    /// The exact file stem the engine asked for (`set_trace_name`), in place of
    /// `{worker}.{time_ns}.pt`.
    pub trace_name: Option<String>,
    /// Hand the heap's free pages back to the kernel once the capture is freed
    /// ([`crate::sys::return_freed_memory`]): where the memory budget
    /// (`stepscope.max_capture_mb`) is on, which reads resident memory.
    pub return_freed_memory: bool,
}

/// A finalized capture, ready to save.
struct Finalized {
    result: Box<dyn Trace>,
    /// The job's `seq` ([`PendingWrites::begin_trace`]): its entry in [`Jobs`].
    seq: u64,
    manifest_path: PathBuf,
    manifest: Manifest,
    queued: Instant,
    held_bytes: u64,
    how: HowToWrite,
}

/// The jobs the writer has not finished, by manifest path. The engine thread takes its lock
/// to queue a job, so it is never held across a write (see [`ManifestWrites`]).
/// Each job by its `seq` (two jobs may share a manifest path: a name the engine set twice).
#[derive(Default)]
struct Jobs {
    /// Being written: each one ends by leaving this list, in `conclude` (or `submit`, where it
    /// could not be queued).
    listed: Vec<(u64, PathBuf, Manifest)>,
    /// Those a drop gave up on (and counted out of the process's traces in flight), to be
    /// marked `unfinished` unless their own final manifest is written first.
    given_up: Vec<(u64, PathBuf, Manifest)>,
}

impl Jobs {
    /// Takes job `seq` out of whichever list holds it; whether it was still listed (not given
    /// up on).
    fn leave(&mut self, seq: u64) -> bool {
        let take = |list: &mut Vec<(u64, PathBuf, Manifest)>| {
            let at = list.iter().position(|(s, _, _)| *s == seq);
            at.map(|at| list.remove(at)).is_some()
        };
        let listed = take(&mut self.listed);
        if !listed {
            take(&mut self.given_up);
        }
        listed
    }

    /// Job `seq`'s manifest path and its `writing` manifest, while it is listed.
    fn writing(&self, seq: u64) -> Option<(PathBuf, Manifest)> {
        let (_, path, manifest) = self.listed.iter().find(|(s, _, _)| *s == seq)?;
        Some((path.clone(), manifest.clone()))
    }
}

type InFlight = Arc<Mutex<Jobs>>;

/// Taken around every manifest write of a writer's jobs, so that a drop's `unfinished` and a
/// job's own manifests never interleave: held across the write and its fsync, which the
/// in-flight list's lock must not be (a stop queuing its job on the engine thread would wait
/// behind another job's write, as long as a slow disk makes it).
type ManifestWrites = Arc<Mutex<()>>;

/// What the jobs not yet written hold in memory, bytes (the sum of their `held_bytes`).
type Held = Arc<AtomicU64>;

/// The sessions stopped and not yet finalized in this process, by any writer. Kineto is one
/// profiler per process: a session begun while another profiler's stopped session is being
/// finalized takes that session's buffers (Kineto's state is global), and saving the other
/// trace then dereferences null inside Kineto (a crash of the host process, seen with two
/// SGLang scheduler profilers one after the other). A start waits on this count, not on its
/// own writer's.
fn sessions_finalizing() -> &'static PendingWrites {
    static FINALIZING: OnceLock<PendingWrites> = OnceLock::new();
    FINALIZING.get_or_init(PendingWrites::default)
}

/// Two threads: the finalizer runs the expensive half of `disableProfiler` (Kineto must finish
/// one session before the next can start, so it never waits behind a save), the saver writes
/// files.
pub(crate) struct Writer {
    settings: Arc<Settings>,
    tx: Option<Senders>,
    threads: Vec<JoinHandle<()>>,
    /// Jobs not yet written (finalizing, queued or saving).
    pending: PendingWrites,
    /// Sessions not yet finalized, of every writer in the process ([`sessions_finalizing`]).
    finalizing: PendingWrites,
    in_flight: InFlight,
    writes: ManifestWrites,
    held: Held,
}

impl Writer {
    pub fn new(settings: Settings) -> Self {
        Writer {
            settings: Arc::new(settings),
            tx: None,
            threads: Vec::new(),
            pending: PendingWrites::default(),
            finalizing: sessions_finalizing().clone(),
            in_flight: InFlight::default(),
            writes: ManifestWrites::default(),
            held: Held::default(),
        }
    }

    /// What the captures not yet written are projected to hold in memory, bytes (as measured
    /// when each window ended): what a backend refuses a new window over.
    pub fn held_bytes(&self) -> u64 {
        self.held.load(Relaxed)
    }

    /// The directory traces are written to.
    pub fn dir(&self) -> &Path {
        &self.settings.dir
    }

    pub fn pending(&self) -> PendingWrites {
        self.pending.clone()
    }

    /// Waits (up to the flush timeout) until no session of this process is being finalized,
    /// whichever profiler stopped it.
    pub fn wait_finalized(&self) -> Result<()> {
        if self.finalizing.count() == 0 {
            return Ok(());
        }
        log::info!("stepscope: waiting for the previous torch session to be finalized");
        if self.finalizing.wait(self.settings.flush_timeout) {
            Ok(())
        } else {
            Err(Error::Timeout {
                what: "the previous torch profiling session to be finalized".into(),
            })
        }
    }

    /// What a writer thread updates when a job ends.
    fn done(&self) -> Done {
        Done {
            pending: self.pending.clone(),
            in_flight: Arc::clone(&self.in_flight),
            writes: Arc::clone(&self.writes),
            held: Arc::clone(&self.held),
        }
    }

    fn spawn(&mut self) -> Result<Senders> {
        let spawn_err =
            |e: io::Error| Error::backend("torch", format!("cannot start the trace writer: {e}"));
        let (tx, rx) = crossbeam_channel::unbounded::<(u64, PathBuf, Job)>();
        let (begun_tx, begun_rx) = crossbeam_channel::unbounded::<u64>();
        let (save_tx, save_rx) = crossbeam_channel::unbounded::<Finalized>();
        // Spawned from the engine thread: its CPUs are the ones to keep clear.
        let cpus = OffEngineCpus::of_this_thread();
        let done = self.done();
        let settings = Arc::clone(&self.settings);
        let saver = thread::Builder::new()
            .name("stepscope-writer".into())
            .spawn(move || {
                cpus.apply();
                save_loop(&settings, &save_rx, &done)
            })
            .map_err(spawn_err)?;
        self.threads.push(saver);
        let done = self.done();
        let finalizing = self.finalizing.clone();
        let finalizer = thread::Builder::new()
            .name("stepscope-finalize".into())
            .spawn(move || {
                cpus.apply();
                finalize_loop(&rx, &save_tx, &done, &finalizing)
            })
            .map_err(spawn_err)?;
        self.threads.push(finalizer);
        // Each job's `writing` manifest, written (and fsynced) as the job is queued, behind no
        // finalize or save: on the finalizer, before its finalize, that write was on the stop's
        // path (the finalize began 0.9-2.5 ms after the stop queued its job in the capture
        // `make bench-vllm` makes, once 30 ms, once 0.21 s while the machine was loaded); on
        // the saver, a job's manifest waited for the save before it.
        let done = self.done();
        let begun = thread::Builder::new()
            .name("stepscope-begun".into())
            .spawn(move || {
                cpus.apply();
                for seq in begun_rx.iter() {
                    write_begun(seq, &done);
                }
            })
            .map_err(spawn_err)?;
        self.threads.push(begun);
        Ok(Senders {
            begun: begun_tx,
            jobs: tx,
        })
    }

    /// Queues a session for writing. Costs two channel sends (the threads start with the first
    /// job); never blocks on Kineto or I/O.
    pub fn submit(&mut self, mut job: Job) -> Result<()> {
        let s = &self.settings;
        let (stem, trace_file) = trace_names(
            &job.manifest.captured.worker_name,
            job.time_ns,
            job.how.trace_name.as_deref(),
            s.gzip.is_some(),
        );
        job.manifest.manifest_version = MANIFEST_VERSION;
        job.manifest.stepscope_version = crate::VERSION.into();
        job.manifest.backend = "torch".into();
        job.manifest.status = Status::Writing;
        job.manifest.pid = std::process::id();
        job.manifest.trace_file = trace_file;
        let manifest_path = s.dir.join(manifest_name(&stem));
        let trace_path = s.dir.join(&job.manifest.trace_file);
        if self.tx.is_none() {
            self.tx = Some(self.spawn()?);
        }
        let seq = self.pending.begin_trace(trace_path, manifest_path.clone());
        self.in_flight
            .lock()
            .listed
            .push((seq, manifest_path.clone(), job.manifest.clone()));
        self.finalizing.begin();
        let held_bytes = job.held_bytes;
        self.held.fetch_add(held_bytes, Relaxed);
        in_flight_begin(self.settings.flush_timeout);
        let sent = self.tx.as_ref().is_some_and(|tx| {
            let sent = tx.jobs.send((seq, manifest_path.clone(), job)).is_ok();
            // Its `writing` manifest once it is queued (a job not queued must have none; one
            // queued without it is still written).
            if sent {
                let _ = tx.begun.send(seq);
            }
            sent
        });
        if !sent {
            let why = "the trace writer has stopped";
            self.pending
                .finish_trace(&manifest_path, Status::Failed, Some(why.into()));
            self.finalizing.finish();
            self.held.fetch_sub(held_bytes, Relaxed);
            in_flight_end(1);
            self.in_flight.lock().leave(seq);
            return Err(Error::backend("torch", why));
        }
        Ok(())
    }
}

/// How long a drop that gave up on its traces waits for their `unfinished` marks: they are
/// written on a thread of their own, after any manifest write under way (a disk that stopped
/// answering holds both), and what is not marked by then is marked by the next start in the
/// directory once this process has ended ([`super::stale`]).
const MARK_UNFINISHED_WAIT: Duration = Duration::from_secs(5);

impl Drop for Writer {
    /// Waits up to the flush timeout for queued traces; what is still unwritten then is marked
    /// `unfinished` in its manifest (waited for up to [`MARK_UNFINISHED_WAIT`] more) and left to
    /// the (detached) threads.
    fn drop(&mut self) {
        drop(self.tx.take());
        if self.pending.wait(self.settings.flush_timeout) {
            for t in self.threads.drain(..) {
                let _ = t.join();
            }
            return;
        }
        // Given up on, and counted out below, in the list's lock: a job ending from now on
        // finds itself no longer listed.
        let n = {
            let mut jobs = self.in_flight.lock();
            let listed = std::mem::take(&mut jobs.listed);
            let n = listed.len();
            jobs.given_up.extend(listed);
            n
        };
        log::error!(
            "stepscope: {n} trace(s) still being written after {:?}; marking them unfinished",
            self.settings.flush_timeout
        );
        let error = format!(
            "the profiler was dropped before this trace was written (waited {:?}, \
             stepscope.flush_timeout_s)",
            self.settings.flush_timeout
        );
        let writes = Arc::clone(&self.writes);
        let in_flight = Arc::clone(&self.in_flight);
        let (marked_tx, marked) = crossbeam_channel::bounded::<()>(1);
        let marker = thread::Builder::new()
            .name("stepscope-mark".into())
            .spawn(move || {
                // Under the writes' lock, what is still given up on: a job whose final manifest
                // was written first (in `conclude`, under the same lock) has left the list.
                let _writes = writes.lock();
                let given_up = std::mem::take(&mut in_flight.lock().given_up);
                for (_, path, mut manifest) in given_up {
                    manifest.status = Status::Unfinished;
                    manifest.error = Some(error.clone());
                    write_manifest(&path, &manifest);
                }
                let _ = marked_tx.send(());
            });
        let waited = match marker {
            Ok(_) => marked.recv_timeout(MARK_UNFINISHED_WAIT).is_ok(),
            Err(e) => {
                log::error!("stepscope: cannot start the thread that marks them: {e}");
                false
            }
        };
        if !waited {
            log::error!(
                "stepscope: {n} trace(s) not marked unfinished within {MARK_UNFINISHED_WAIT:?} \
                 (a manifest write has not returned); the next start in the directory marks \
                 them once this process has ended"
            );
        }
        // Nobody waits for them any longer: no parent should either.
        in_flight_end(n);
    }
}

/// The CPUs a writer thread may use besides the engine thread's, when the engine thread is
/// pinned (vLLM's CPU backend binds each worker to its cores; threads inherit the binding):
/// finalizing and compressing a trace there would take the engine's own core from it, the
/// stall the writer thread exists to avoid. `None` (keep the inherited CPUs) when the engine
/// may run anywhere or the mask cannot be read.
#[derive(Clone, Copy)]
struct OffEngineCpus(Option<libc::cpu_set_t>);

impl OffEngineCpus {
    fn of_this_thread() -> Self {
        // SAFETY: cpu_set_t is plain data (all-zero is the empty set); sched_getaffinity writes
        // at most size_of::<cpu_set_t>() bytes into it.
        let mut engine: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: as above; 0 is the calling thread.
        let rc = unsafe {
            libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut engine)
        };
        if rc != 0 {
            return OffEngineCpus(None);
        }
        // SAFETY: sysconf has no memory effects.
        let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(0) as usize;
        let online = online.min(libc::CPU_SETSIZE as usize);
        // SAFETY: as above.
        let mut others: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        let mut pinned = 0;
        let mut free = 0;
        for cpu in 0..online {
            // SAFETY: cpu < CPU_SETSIZE, in range for both sets.
            if unsafe { libc::CPU_ISSET(cpu, &engine) } {
                pinned += 1;
            } else {
                // SAFETY: as above.
                unsafe { libc::CPU_SET(cpu, &mut others) };
                free += 1;
            }
        }
        // The engine may use every CPU (not pinned), or there is no other CPU.
        OffEngineCpus((free > 0 && pinned < online).then_some(others))
    }

    /// Moves the calling thread off the engine's CPUs. A cpuset that allows none of them
    /// refuses it: the thread then keeps the engine's CPUs, as before.
    fn apply(self) {
        let Some(set) = self.0 else { return };
        // SAFETY: `set` is a valid cpu_set_t of the size passed; 0 is the calling thread.
        let rc =
            unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
        if rc != 0 {
            log::debug!(
                "stepscope: the trace writer stays on the engine's CPUs: {}",
                io::Error::last_os_error()
            );
        }
    }
}

/// Writes a manifest; failures are logged, since the manifest is what would have reported
/// them.
fn write_manifest(path: &Path, manifest: &Manifest) {
    if let Err(e) = manifest.write(path) {
        log::error!("stepscope: cannot write the manifest: {e}");
    }
}

/// Where `submit` hands a job: its `writing` manifest to the thread that writes those, the job
/// to the finalizer.
struct Senders {
    /// The job's `seq`: the thread takes its manifest from [`Jobs::listed`].
    begun: Sender<u64>,
    jobs: Sender<(u64, PathBuf, Job)>,
}

/// What the writer threads update when a job ends.
struct Done {
    pending: PendingWrites,
    in_flight: InFlight,
    writes: ManifestWrites,
    held: Held,
}

/// Records a job's end: its final manifest, then its place in the pending count and in what
/// the queue holds (its buffers are freed by then).
fn conclude(seq: u64, manifest_path: &Path, manifest: &Manifest, held_bytes: u64, done: &Done) {
    // Leave the in-flight lists first, and write under the writes' lock, so a concurrent drop
    // cannot mark this job unfinished after its final manifest is written.
    let writes = done.writes.lock();
    let listed = done.in_flight.lock().leave(seq);
    write_manifest(manifest_path, manifest);
    drop(writes);
    done.held.fetch_sub(held_bytes, Relaxed);
    done.pending
        .finish_trace(manifest_path, manifest.status, manifest.error.clone());
    // A job a drop gave up on was already taken off the process's count.
    if listed {
        in_flight_end(1);
    }
}

fn finalize_loop(
    rx: &Receiver<(u64, PathBuf, Job)>,
    save_tx: &Sender<Finalized>,
    done: &Done,
    finalizing: &PendingWrites,
) {
    for (seq, manifest_path, job) in rx.iter() {
        publish_in_flight();
        let began = Instant::now();
        let outcome =
            catch_unwind(AssertUnwindSafe(|| job.session.finalize())).unwrap_or_else(|p| {
                let message = format!("finalizing panicked: {}", panic_message(&*p));
                Err(Error::backend("torch", message))
            });
        finalizing.finish();
        let mut manifest = job.manifest;
        manifest.finalize_seconds = Some(began.elapsed().as_secs_f64());
        match outcome {
            Ok(result) => {
                let next = Finalized {
                    result,
                    seq,
                    manifest_path,
                    manifest,
                    queued: job.queued,
                    held_bytes: job.held_bytes,
                    how: job.how,
                };
                if let Err(crossbeam_channel::SendError(f)) = save_tx.send(next) {
                    let mut manifest = f.manifest;
                    manifest.status = Status::Failed;
                    manifest.error = Some("the trace writer has stopped".into());
                    conclude(f.seq, &f.manifest_path, &manifest, f.held_bytes, done);
                }
            }
            Err(e) => {
                log::error!("stepscope: {} failed: {e}", manifest.trace_file);
                manifest.status = Status::Failed;
                manifest.error = Some(e.to_string());
                // The session is freed by now (`finalize` took it), as a written one is.
                if job.how.return_freed_memory {
                    return_freed_memory();
                }
                conclude(seq, &manifest_path, &manifest, job.held_bytes, done);
            }
        }
    }
}

/// A job's `writing` manifest, only while still listed: a job that has ended (its final
/// manifest written) or that a drop gave up on (marked unfinished) is not, and "writing" must
/// not overwrite what they wrote.
fn write_begun(seq: u64, done: &Done) {
    let _writes = done.writes.lock();
    let listed = done.in_flight.lock().writing(seq);
    if let Some((manifest_path, manifest)) = listed {
        write_manifest(&manifest_path, &manifest);
    }
}

fn save_loop(settings: &Settings, rx: &Receiver<Finalized>, done: &Done) {
    for mut job in rx.iter() {
        let began = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            write_job(settings, &mut job.result, &job.manifest, &job.how)
        }))
        .unwrap_or_else(|p| {
            let message = format!("the writer panicked: {}", panic_message(&*p));
            Err(Error::write(
                settings.dir.join(&job.manifest.trace_file),
                message,
            ))
        });
        let manifest = &mut job.manifest;
        match outcome {
            Ok(written) => {
                manifest.status = Status::Complete;
                manifest.trace_bytes = Some(written.trace_bytes);
                manifest.json_bytes = Some(written.json_bytes);
                manifest.op_table_file = written.op_table_file;
                manifest.op_table_seconds = written.op_table_seconds;
                manifest.op_table_wait_seconds = written.op_table_wait_seconds;
                manifest.summary = written.summary;
                manifest.writer_seconds =
                    Some(written.renamed.duration_since(job.queued).as_secs_f64());
                manifest.write_seconds = Some(written.renamed.duration_since(began).as_secs_f64());
                log::info!(
                    "stepscope: wrote {} ({} bytes)",
                    settings.dir.join(&manifest.trace_file).display(),
                    written.trace_bytes
                );
            }
            Err(e) => {
                log::error!("stepscope: writing {} failed: {e}", manifest.trace_file);
                manifest.status = Status::Failed;
                manifest.error = Some(e.to_string());
            }
        }
        // The trace (Kineto's buffers) is freed here, on this thread, before the stop's waiters
        // go on: a window begun at once takes the process's memory as its budget's baseline,
        // and buffers still being freed then would hide that much of its growth (tried: a
        // window cut at 13 MB of growth held 2 GB of JSON).
        // Its CPU time is torch's cost, recorded apart (`free_seconds`) as Kineto's finalize is.
        let cpu = crate::sys::thread_cpu();
        drop(job.result);
        job.manifest.free_seconds = cpu
            .zip(crate::sys::thread_cpu())
            .map(|(before, after)| after.saturating_sub(before).as_secs_f64());
        // What glibc keeps of it is handed back to the kernel at once: kept, the next window
        // would reuse it unseen by its budget, which reads resident memory (measured: three
        // stack windows of one process cut 32, 64 and 96 steps in, each over the last one's
        // leftovers; handed back, 32 each, 2.1-2.9 ms a trim).
        if job.how.return_freed_memory {
            return_freed_memory();
        }
        conclude(
            job.seq,
            &job.manifest_path,
            &job.manifest,
            job.held_bytes,
            done,
        );
    }
}

/// [`crate::sys::return_freed_memory`], timed into the debug log.
fn return_freed_memory() {
    let trim = Instant::now();
    crate::sys::return_freed_memory();
    log::debug!(
        "stepscope: freed heap handed back in {:.1} ms",
        trim.elapsed().as_secs_f64() * 1e3
    );
}

/// Where a trace's summary comes from.
enum SummaryFrom<'a> {
    /// Made as the trace streamed through the gzip pump (`None`: it could not be).
    Streamed(Option<Box<Summary>>),
    /// To read from this plain JSON file.
    File(&'a Path),
}

struct Written {
    trace_bytes: u64,
    json_bytes: u64,
    op_table_file: Option<String>,
    /// What making it took, on its own thread beside the serializer.
    op_table_seconds: Option<f64>,
    /// What the writer waited for it once the trace was in place.
    op_table_wait_seconds: Option<f64>,
    summary: Option<Summary>,
    renamed: Instant,
}

/// The trace in place, with its side file (the op table) made beside its serialization on a
/// thread of its own and renamed into place after it, then what else the serializer left.
fn write_job(
    settings: &Settings,
    trace: &mut Box<dyn Trace>,
    manifest: &Manifest,
    how: &HowToWrite,
) -> Result<Written> {
    let dir = &settings.dir;
    let stem = how
        .trace_name
        .as_deref()
        .unwrap_or(&manifest.captured.worker_name);
    let shared: &dyn Trace = &**trace;
    let side_file = move || {
        let began = Instant::now();
        shared
            .side_file(dir, stem)
            .map(|f| f.map(|f| (f, began.elapsed())))
    };
    let (placed, side, waiting) = thread::scope(|scope| {
        let beside = thread::Builder::new()
            .name("stepscope-table".into())
            .spawn_scoped(scope, side_file);
        let placed = {
            // `save_over` when place_trace ends, whichever way (a panic included): the side
            // file's thread is joined by the scope either way.
            let _over = SaveOver(shared);
            place_trace(settings, shared, manifest, how)
        };
        let waiting = Instant::now();
        let side = match beside {
            Ok(handle) => handle.join().unwrap_or_else(|p| {
                let message = format!("the op table's thread panicked: {}", panic_message(&*p));
                Err(Error::write(dir.join(stem), message))
            }),
            // No thread for it: made now, after the trace (when there is one).
            Err(_) if placed.is_ok() => side_file(),
            Err(_) => Ok(None),
        };
        (placed, side, waiting)
    });
    // A failed trace drops its side file's temporary with it.
    let placed = placed?;
    let (op_table_file, op_table_seconds, op_table_wait_seconds) = match side? {
        Some((file, took)) => {
            let name = file.file_name();
            file.rename()?;
            let waited = waiting.elapsed();
            (
                Some(name),
                Some(took.as_secs_f64()),
                Some(waited.as_secs_f64()),
            )
        }
        None => (None, None, None),
    };
    trace.write_extras(dir, stem)?;
    Ok(Written {
        trace_bytes: placed.trace_bytes,
        json_bytes: placed.json_bytes,
        op_table_file,
        op_table_seconds,
        op_table_wait_seconds,
        summary: placed.summary,
        renamed: placed.renamed,
    })
}

/// Tells the trace its save is over when dropped (`Trace::save_over`).
struct SaveOver<'a>(&'a dyn Trace);

impl Drop for SaveOver<'_> {
    fn drop(&mut self) {
        self.0.save_over();
    }
}

/// A trace in place under its final name.
struct Placed {
    trace_bytes: u64,
    json_bytes: u64,
    summary: Option<Summary>,
    renamed: Instant,
}

/// Serializes the trace (through the gzip pump, or as plain JSON) and renames it into place.
fn place_trace(
    settings: &Settings,
    trace: &dyn Trace,
    manifest: &Manifest,
    how: &HowToWrite,
) -> Result<Placed> {
    let dir = &settings.dir;
    let final_name = &manifest.trace_file;
    let final_path = dir.join(final_name);
    // A serializer like Kineto saves to `{json_path}.tmp`, then renames that to `json_path`.
    let json_path = temp_path(dir, final_name, ".json");
    let serializer_tmp = TempFile::new(suffixed(&json_path, ".tmp"));
    let json_tmp = TempFile::new(json_path.clone());
    let io_err = |what: &str, path: &Path, e: io::Error| Error::io(path, format!("{what}: {e}"), e);

    let json_str = json_path
        .to_str()
        .ok_or_else(|| Error::write(&json_path, "the path is not valid UTF-8"))?
        .to_string();
    let save = || trace.save(&json_str);

    let (json_bytes, summary) = if let Some(level) = settings.gzip {
        let gz_tmp = TempFile::new(temp_path(dir, final_name, ""));
        let requests = manifest
            .steps
            .as_deref()
            .filter(|_| how.requests_into_args)
            .and_then(RequestArgs::new);
        let pumped = stream_gzip(serializer_tmp.path(), gz_tmp.path(), level, requests, save)?;
        let (json_bytes, summary) = match pumped {
            Some(streamed) => (
                streamed.json_bytes,
                SummaryFrom::Streamed(streamed.summary.map(Box::new)),
            ),
            None if !is_regular_file(json_tmp.path()) => {
                return Err(Error::write(
                    json_tmp.path(),
                    "no trace was written (the write failed)",
                ))
            }
            // This serializer wrote the file itself, not through its `.tmp` (our FIFO):
            // compress the file it wrote (summarized once the trace is in place).
            None => {
                let tail = check_complete(json_tmp.path())?;
                compress(json_tmp.path(), gz_tmp.path(), level)
                    .map_err(|e| io_err("compressing the trace", gz_tmp.path(), e))?;
                (tail, SummaryFrom::File(json_tmp.path()))
            }
        };
        fs::rename(gz_tmp.path(), &final_path)
            .map_err(|e| io_err("renaming the trace into place", &final_path, e))?;
        gz_tmp.keep();
        (json_bytes, summary)
    } else {
        save()?;
        let json_bytes = check_complete(json_tmp.path())?;
        File::open(json_tmp.path())
            .and_then(|f| f.sync_all())
            .map_err(|e| io_err("syncing", json_tmp.path(), e))?;
        fs::rename(json_tmp.path(), &final_path)
            .map_err(|e| io_err("renaming the trace into place", &final_path, e))?;
        json_tmp.keep();
        (json_bytes, SummaryFrom::File(&final_path))
    };
    // The FIFO (or the serializer's leftovers) go now; a plain JSON trace was renamed into place.
    drop(serializer_tmp);
    let renamed = Instant::now();
    let trace_bytes = fs::metadata(&final_path)
        .map_err(|e| io_err("reading its size", &final_path, e))?
        .len();
    // A trace that did not stream through the pump is read back for its summary, after it is
    // in place: it never delays the trace.
    let summary = match summary {
        SummaryFrom::Streamed(summary) => summary.map(|s| *s),
        SummaryFrom::File(json) => summarize_file(json),
    };
    Ok(Placed {
        trace_bytes,
        json_bytes,
        summary,
        renamed,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};

    use stepscope_test_doubles::Scratch;

    use super::*;
    use crate::manifest::is_manifest_name;

    /// A capture whose trace is written straight to the path (as a serializer that does not go
    /// through `{path}.tmp`: the pump, never opened, must be let go), and that says when it is
    /// dropped.
    struct Fake(Arc<AtomicBool>);
    struct FakeTrace(Arc<AtomicBool>);

    impl Capture for Fake {
        fn finalize(self: Box<Self>) -> Result<Box<dyn Trace>> {
            Ok(Box::new(FakeTrace(Arc::clone(&self.0))))
        }
    }

    impl Trace for FakeTrace {
        fn save(&self, path: &str) -> Result<()> {
            fs::write(path, br#"{"traceEvents": []}"#).map_err(|e| Error::io(path, "writing", e))
        }
    }

    impl Drop for FakeTrace {
        fn drop(&mut self) {
            // Work, as freeing a capture's buffers is: its CPU time is the manifest's
            // `free_seconds`.
            let mut x = 0u64;
            for i in 0..1_000_000u64 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
            }
            self.0.store(true, SeqCst);
        }
    }

    /// A capture with a side file, whose save waits until the side file is begun (on another
    /// thread: made after the save, the save would give up) and then writes or fails.
    struct Beside {
        fail: bool,
        begun: (crossbeam_channel::Sender<()>, Receiver<()>),
    }

    impl Capture for Beside {
        fn finalize(self: Box<Self>) -> Result<Box<dyn Trace>> {
            Ok(self)
        }
    }

    impl Trace for Beside {
        fn save(&self, path: &str) -> Result<()> {
            let waited = self.begun.1.recv_timeout(Duration::from_secs(60));
            if waited.is_err() {
                return Err(Error::write(
                    path,
                    "the side file was not begun during the save",
                ));
            }
            if self.fail {
                return Err(Error::write(path, "failed on purpose"));
            }
            fs::write(path, br#"{"traceEvents": []}"#).map_err(|e| Error::io(path, "writing", e))
        }

        fn side_file(&self, dir: &Path, stem: &str) -> Result<Option<Synced>> {
            let _ = self.begun.0.send(());
            let path = dir.join(crate::manifest::op_table_name(stem));
            crate::files::write_synced(&path, b"table").map(Some)
        }
    }

    /// A capture whose side file waits on its save's word (as the op table made from the rows
    /// Kineto's save keeps: `backend::torch::flushed`), and says whether the wait ended only by
    /// giving up.
    struct WaitsOnSave {
        word: Mutex<Option<crossbeam_channel::Sender<()>>>,
        heard: Receiver<()>,
        gave_up: Arc<AtomicBool>,
    }

    impl Capture for WaitsOnSave {
        fn finalize(self: Box<Self>) -> Result<Box<dyn Trace>> {
            Ok(self)
        }
    }

    impl Trace for WaitsOnSave {
        fn save(&self, path: &str) -> Result<()> {
            if let Some(word) = self.word.lock().take() {
                let _ = word.send(());
            }
            fs::write(path, br#"{"traceEvents": []}"#).map_err(|e| Error::io(path, "writing", e))
        }

        fn side_file(&self, _dir: &Path, _stem: &str) -> Result<Option<Synced>> {
            // A deadlock's watchdog, not a speed: the wait ends at once when the save is over.
            let waited = self.heard.recv_timeout(Duration::from_secs(60));
            self.gave_up.store(
                waited == Err(crossbeam_channel::RecvTimeoutError::Timeout),
                SeqCst,
            );
            Ok(None)
        }

        fn save_over(&self) {
            self.word.lock().take();
        }
    }

    #[test]
    fn a_side_file_waiting_on_a_save_that_never_runs_is_let_go() {
        let _alone = crate::flush::in_flight::IN_FLIGHT_TESTS.lock();
        let scratch = Scratch::empty("writer-never-saved");
        // The directory is a file: the trace fails before its save is called.
        let not_a_dir = scratch.join("traces");
        fs::write(&not_a_dir, b"").expect("a file");
        let mut writer = Writer::new(Settings {
            dir: not_a_dir,
            gzip: Some(1),
            flush_timeout: Duration::from_secs(120),
        });
        let gave_up = Arc::new(AtomicBool::new(true));
        let (word, heard) = crossbeam_channel::bounded(1);
        let trace = WaitsOnSave {
            word: Mutex::new(Some(word)),
            heard,
            gave_up: Arc::clone(&gave_up),
        };
        write_one(&mut writer, "w", Box::new(trace), 1);
        assert!(
            !gave_up.load(SeqCst),
            "the side file waited for a save never made"
        );
        let written = writer.pending().traces_since(0);
        assert_eq!(written.last().map(|t| t.status), Some(Status::Failed));
    }

    /// Submits one capture of `worker` to `writer` and waits until it is written.
    fn write_one(writer: &mut Writer, worker: &str, session: Box<dyn Capture>, time_ns: u128) {
        let mut job = job_of(session, time_ns, HowToWrite::default());
        job.manifest.captured.worker_name = worker.into();
        writer.submit(job).expect("submit");
        assert!(
            writer.pending().wait(Duration::from_secs(120)),
            "not written"
        );
    }

    /// The manifests in `dir`.
    fn manifests_in(dir: &Path) -> Vec<Manifest> {
        fs::read_dir(dir)
            .expect("the directory")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| is_manifest_name(&n.to_string_lossy()))
            })
            .map(|p| Manifest::read(&p).expect("a manifest"))
            .collect()
    }

    #[test]
    fn the_side_file_is_made_during_the_save_and_placed_only_with_the_trace() {
        let _alone = crate::flush::in_flight::IN_FLIGHT_TESTS.lock();
        let dir = Scratch::empty("writer-side-file");
        let mut writer = Writer::new(Settings {
            dir: dir.to_path_buf(),
            gzip: Some(1),
            flush_timeout: Duration::from_secs(120),
        });
        for (worker, fail) in [("w", false), ("v", true)] {
            let begun = crossbeam_channel::bounded(1);
            write_one(&mut writer, worker, Box::new(Beside { fail, begun }), 1);
        }
        let manifests = manifests_in(&dir);
        let of = |w: &str| {
            manifests
                .iter()
                .find(|m| m.captured.worker_name == w)
                .expect("its manifest")
        };
        let written = of("w");
        assert_eq!(written.status, Status::Complete, "{:?}", written.error);
        assert_eq!(written.op_table_file.as_deref(), Some("w.profiler_out.txt"));
        assert!(written.op_table_seconds.is_some() && written.op_table_wait_seconds.is_some());
        assert_eq!(
            fs::read(dir.join("w.profiler_out.txt")).expect("in place"),
            b"table"
        );
        // The failed trace's side file is gone with it, temporary and all.
        let failed = of("v");
        assert_eq!(failed.status, Status::Failed);
        assert!(
            failed
                .error
                .as_deref()
                .is_some_and(|e| e.contains("failed on purpose")),
            "{:?}",
            failed.error
        );
        assert_eq!(failed.op_table_file, None);
        let left: Vec<String> = fs::read_dir(&dir)
            .expect("the directory")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains("profiler_out") || n.contains("partial"))
            .collect();
        assert_eq!(left, ["w.profiler_out.txt"]);
    }

    /// A capture whose finalize waits for word (a deadlock's watchdog of a minute), then says
    /// it ran: held, its job writes no manifest but the `writing` one.
    struct Gated {
        word: Receiver<()>,
        said: crossbeam_channel::Sender<()>,
    }

    impl Capture for Gated {
        fn finalize(self: Box<Self>) -> Result<Box<dyn Trace>> {
            let _ = self.word.recv_timeout(Duration::from_secs(60));
            let _ = self.said.send(());
            Ok(Box::new(FakeTrace(Arc::new(AtomicBool::new(false)))))
        }
    }

    /// A gated capture, its word and what it says.
    fn gated() -> (Box<Gated>, crossbeam_channel::Sender<()>, Receiver<()>) {
        let (word_tx, word) = crossbeam_channel::bounded(1);
        let (said, said_rx) = crossbeam_channel::bounded(1);
        (Box::new(Gated { word, said }), word_tx, said_rx)
    }

    /// A capture whose save waits for word (a deadlock's watchdog of two minutes: longer than
    /// any of these tests' waits for something else).
    struct SavesOnWord(Receiver<()>);

    impl Capture for SavesOnWord {
        fn finalize(self: Box<Self>) -> Result<Box<dyn Trace>> {
            Ok(self)
        }
    }

    impl Trace for SavesOnWord {
        fn save(&self, path: &str) -> Result<()> {
            let _ = self.0.recv_timeout(Duration::from_secs(120));
            fs::write(path, br#"{"traceEvents": []}"#).map_err(|e| Error::io(path, "writing", e))
        }
    }

    /// A writer into `dir` that waits `flush_timeout` for its traces when dropped.
    fn writer_into(dir: &Path, flush_timeout: Duration) -> Writer {
        Writer::new(Settings {
            dir: dir.to_path_buf(),
            gzip: Some(1),
            flush_timeout,
        })
    }

    /// A job of worker `w`'s capture stopped at `time_ns`, written as `how` says.
    fn job_of(session: Box<dyn Capture>, time_ns: u128, how: HowToWrite) -> Job {
        let mut manifest = Manifest::default();
        manifest.captured.worker_name = "w".into();
        Job {
            session,
            time_ns,
            queued: Instant::now(),
            manifest,
            held_bytes: 0,
            how,
        }
    }

    /// A FIFO where the writer's first write of the manifest of worker `w`'s trace stopped at
    /// `time_ns` goes (the temporary it writes through): that write's open hangs until a
    /// reader comes, as on a disk that stopped answering. [`let_go`] is the reader.
    fn fifo_at_manifest(dir: &Path, time_ns: u128) -> PathBuf {
        let (stem, _) = trace_names("w", time_ns, None, true);
        let fifo = temp_path(dir, &manifest_name(&stem), "");
        let path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("a path");
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0, "mkfifo");
        fifo
    }

    /// Reads what the hung write at `fifo` writes, letting it go (its fsync then fails, a FIFO
    /// cannot be fsynced, and its job goes on).
    fn let_go(fifo: &Path) -> Vec<u8> {
        let mut held = Vec::new();
        io::Read::read_to_end(&mut File::open(fifo).expect("the FIFO"), &mut held)
            .expect("the held manifest");
        held
    }

    /// Waits for what `pending` counts, then requires `n` manifests in `dir`, each `complete`.
    fn assert_written(pending: &PendingWrites, dir: &Path, n: usize) {
        assert!(pending.wait(Duration::from_secs(120)), "not written");
        let manifests = manifests_in(dir);
        assert_eq!(manifests.len(), n);
        for m in manifests {
            assert_eq!(m.status, Status::Complete, "{:?}", m.error);
        }
    }

    /// Whether this process's thread named `name` (as `/proc` holds it: 15 bytes at most)
    /// comes to be blocked in `openat` (its `/proc` syscall entry says so) within a minute: a
    /// watchdog, not a speed.
    fn blocked_in_open(name: &str) -> bool {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            let tasks = fs::read_dir("/proc/self/task")
                .into_iter()
                .flatten()
                .flatten();
            for task in tasks {
                let task = task.path();
                let named = fs::read_to_string(task.join("comm")).is_ok_and(|c| c.trim() == name);
                let call = fs::read_to_string(task.join("syscall")).unwrap_or_default();
                let nr = call
                    .split_whitespace()
                    .next()
                    .and_then(|n| n.parse::<i64>().ok());
                if named && nr == Some(libc::SYS_openat) {
                    return true;
                }
            }
            thread::sleep(Duration::from_millis(5));
        }
        false
    }

    /// Submits a job to `writer` whose `writing` manifest's write hangs at a FIFO (its
    /// finalize held until then: no later write of the job may take that write's place), and
    /// returns the FIFO once the manifest's thread is seen blocked there, with what the
    /// finalize says when it runs.
    fn submit_with_manifest_write_hung(writer: &mut Writer, dir: &Path) -> (PathBuf, Receiver<()>) {
        let fifo = fifo_at_manifest(dir, 1);
        let (session, word, finalized) = gated();
        writer
            .submit(job_of(session, 1, HowToWrite::default()))
            .expect("submit");
        let hung = blocked_in_open("stepscope-begun");
        let _ = word.send(());
        assert!(hung, "the manifest's thread never reached its write");
        (fifo, finalized)
    }

    #[test]
    fn the_finalize_does_not_wait_for_the_writing_manifest() {
        // The `writing` manifest's write (and its fsync) is a thread's of its own, made as the
        // job is queued: here it hangs, and the finalize must run all the same.
        let _alone = crate::flush::in_flight::IN_FLIGHT_TESTS.lock();
        let dir = Scratch::empty("writer-begun-beside");
        let mut writer = writer_into(&dir, Duration::from_secs(120));
        let (fifo, finalized) = submit_with_manifest_write_hung(&mut writer, &dir);
        // A deadlock's watchdog, not a speed: the finalize runs at once, or never while the
        // manifest's write hangs.
        let ran = finalized.recv_timeout(Duration::from_secs(60)).is_ok();
        let held = let_go(&fifo);
        assert!(
            ran,
            "the finalize waited for the `writing` manifest's write"
        );
        let held = Manifest::from_slice(&held, &fifo).expect("the held manifest");
        assert_eq!(held.status, Status::Writing);
        assert_written(&writer.pending(), &dir, 1);
        assert!(!fifo.exists(), "the FIFO was left behind");
    }

    #[test]
    fn a_stop_queues_its_job_while_another_manifest_write_hangs() {
        // A stop queues its capture on the engine thread, which must not wait for the writer
        // threads' disk: here the first job's `writing` manifest hangs, and a second job is
        // queued meanwhile.
        let _alone = crate::flush::in_flight::IN_FLIGHT_TESTS.lock();
        let dir = Scratch::empty("writer-queue-beside-write");
        let mut writer = writer_into(&dir, Duration::from_secs(120));
        let (fifo, _) = submit_with_manifest_write_hung(&mut writer, &dir);
        let (queued_tx, queued) = crossbeam_channel::bounded(1);
        let second = Box::new(Fake(Arc::new(AtomicBool::new(false))));
        let (ok, at_once) = thread::scope(|scope| {
            let writer = &mut writer;
            scope.spawn(move || {
                let queued = writer.submit(job_of(second, 2, HowToWrite::default()));
                let _ = queued_tx.send(queued.is_ok());
            });
            // A deadlock's watchdog, not a speed: the second submit returns at once, or only
            // once the hung write is let go below.
            let at_once = queued.recv_timeout(Duration::from_secs(60)).ok();
            let_go(&fifo);
            (at_once.or_else(|| queued.recv().ok()), at_once.is_some())
        });
        assert_eq!(ok, Some(true), "the second job was not queued");
        assert!(
            at_once,
            "queuing a job waited for another job's manifest write"
        );
        assert_written(&writer.pending(), &dir, 2);
    }

    #[test]
    fn a_drop_giving_up_returns_while_a_manifest_write_hangs() {
        // At exit, a writer whose traces outlast the flush timeout marks them unfinished and
        // lets go: here a job's `writing` manifest hangs, and the drop must return all the
        // same, its traces no longer counted in flight (the flushing marker gone).
        let _alone = crate::flush::in_flight::IN_FLIGHT_TESTS.lock();
        let dir = Scratch::empty("writer-drop-beside-write");
        let mut writer = writer_into(&dir, Duration::ZERO);
        let (fifo, _) = submit_with_manifest_write_hung(&mut writer, &dir);
        let pending = writer.pending();
        let (dropped_tx, dropped) = crossbeam_channel::bounded(1);
        let dropping = thread::spawn(move || {
            drop(writer);
            let _ = dropped_tx.send(());
        });
        // A deadlock's watchdog, not a speed: the drop waits for the marks at most
        // MARK_UNFINISHED_WAIT, then returns.
        let returned = dropped.recv_timeout(Duration::from_secs(60)).is_ok();
        let marker_gone = !super::super::in_flight::flushing_marker_of(std::process::id()).exists();
        let_go(&fifo);
        let _ = dropping.join();
        // The detached threads end their job before the directory goes.
        assert_written(&pending, &dir, 1);
        assert!(
            returned,
            "the drop waited for a manifest write that did not return"
        );
        assert!(marker_gone, "the drop left its traces counted in flight");
    }

    #[test]
    fn a_stops_manifest_says_writing_while_another_trace_is_saved() {
        // `stepscope wait DIR` waits while a manifest says `writing`: a job queued while the
        // writer still saves another trace has one a moment after its stop, not once that save
        // ends.
        let _alone = crate::flush::in_flight::IN_FLIGHT_TESTS.lock();
        let dir = Scratch::empty("writer-begun-during-save");
        let mut writer = writer_into(&dir, Duration::from_secs(120));
        let (word, heard) = crossbeam_channel::bounded(1);
        let saving = Box::new(SavesOnWord(heard));
        writer
            .submit(job_of(saving, 1, HowToWrite::default()))
            .expect("submit");
        let second = Box::new(Fake(Arc::new(AtomicBool::new(false))));
        writer
            .submit(job_of(second, 2, HowToWrite::default()))
            .expect("submit");
        let (second, _) = trace_names("w", 2, None, true);
        let second = dir.join(manifest_name(&second));
        // A watchdog, not a speed: the manifest comes at once, or only after the save below.
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut says = None;
        while says.is_none() && Instant::now() < deadline {
            says = Manifest::read(&second).ok().map(|m| m.status);
            thread::sleep(Duration::from_millis(5));
        }
        let _ = word.send(());
        assert_written(&writer.pending(), &dir, 2);
        assert_eq!(
            says,
            Some(Status::Writing),
            "no manifest while another trace was saved"
        );
    }

    #[test]
    fn a_drop_giving_up_marks_its_traces_unfinished() {
        let _alone = crate::flush::in_flight::IN_FLIGHT_TESTS.lock();
        let dir = Scratch::empty("writer-drop-marks");
        let mut writer = writer_into(&dir, Duration::ZERO);
        let (session, word, _) = gated();
        writer
            .submit(job_of(session, 1, HowToWrite::default()))
            .expect("submit");
        drop(writer);
        // When the drop returns, the manifest says why the trace is not there.
        let marked = manifests_in(&dir);
        // The finalize goes on (detached), and writes the trace after all.
        let _ = word.send(());
        let deadline = Instant::now() + Duration::from_secs(60);
        while manifests_in(&dir)
            .first()
            .is_none_or(|m| m.status != Status::Complete)
        {
            assert!(Instant::now() < deadline, "the detached job never ended");
            thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(marked.len(), 1);
        assert_eq!(marked[0].status, Status::Unfinished);
        assert!(
            marked[0]
                .error
                .as_deref()
                .is_some_and(|e| e.contains("dropped before this trace was written")),
            "{:?}",
            marked[0].error
        );
    }

    #[test]
    fn two_jobs_of_one_name_each_end_in_flight() {
        // The engine may name two captures alike (`set_trace_name`) while the first is still
        // being written: each job leaves the count of traces in flight once, so the flushing
        // marker a parent waits on at exit goes when both are written.
        let _alone = crate::flush::in_flight::IN_FLIGHT_TESTS.lock();
        let dir = Scratch::empty("writer-same-name");
        let mut writer = writer_into(&dir, Duration::from_secs(120));
        let same = || HowToWrite {
            trace_name: Some("same".into()),
            ..HowToWrite::default()
        };
        let (word, heard) = crossbeam_channel::bounded(1);
        writer
            .submit(job_of(Box::new(SavesOnWord(heard)), 1, same()))
            .expect("submit");
        let second = Box::new(Fake(Arc::new(AtomicBool::new(false))));
        writer.submit(job_of(second, 1, same())).expect("submit");
        let _ = word.send(());
        assert_written(&writer.pending(), &dir, 1);
        let marker = super::super::in_flight::flushing_marker_of(std::process::id());
        assert!(!marker.exists(), "a trace still counted in flight");
    }

    #[test]
    fn a_trace_is_freed_before_its_waiters_go_on() {
        // A window begun as soon as a stop's wait returns takes the process's memory as its
        // budget's baseline: the stopped capture's buffers must be gone by then.
        let _alone = crate::flush::in_flight::IN_FLIGHT_TESTS.lock();
        let dir = Scratch::empty("writer-freed");
        let mut writer = Writer::new(Settings {
            dir: dir.to_path_buf(),
            gzip: Some(1),
            flush_timeout: Duration::from_secs(120),
        });
        for time_ns in 1..=3 {
            let dropped = Arc::new(AtomicBool::new(false));
            write_one(
                &mut writer,
                "w",
                Box::new(Fake(Arc::clone(&dropped))),
                time_ns,
            );
            assert!(dropped.load(SeqCst), "the trace outlived its write's end");
            let written = writer.pending().traces_since(0);
            assert_eq!(written.last().map(|t| t.status), Some(Status::Complete));
        }
        // Each manifest says what the free cost the writer's thread.
        let manifests = manifests_in(&dir);
        assert_eq!(manifests.len(), 3);
        for m in manifests {
            assert_eq!(m.status, Status::Complete);
            assert!(
                m.free_seconds.is_some_and(|s| s > 0.0),
                "{:?}",
                m.free_seconds
            );
        }
    }
}
