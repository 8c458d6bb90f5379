//! The torch backend's writer thread: serializes each finished session off the engine thread.
//!
//! For each session it writes, in `torch_profiler_dir`:
//! - `{worker}.{time_ns}.pt.trace.json.gz` (or `.json`): torch's tensorboard naming. Kineto
//!   writes the JSON under a hidden temporary name, the writer compresses it into a second
//!   temporary file and renames that into place, so the final name only ever holds a complete
//!   trace;
//! - `{worker}.profiler_out.txt` when the config asks for the op table (vLLM's file name);
//!
//! An engine that names its traces (`WorkerProfiler::set_trace_name`) gets `{name}.trace.json.gz`,
//! `{name}.stepscope.json` and `{name}.profiler_out.txt` instead.
//! - `{worker}.{time_ns}.stepscope.json`: the manifest, written `"writing"` when the job begins
//!   and `"complete"` or `"failed"` (with the error) when it ends. A job still running when the
//!   backend is dropped and the flush timeout passes is marked `"unfinished"`.

use std::fs::{self, File};
use std::io::{self, BufReader, BufWriter, Write};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;
use serde::Serialize;

use super::kineto::{Detached, TraceResult};
use super::summary::{self, SortBy};
use crate::error::{panic_message, Error, Result};
use crate::flush::PendingWrites;

/// How traces are written; fixed for the backend's life.
pub(super) struct Settings {
    pub dir: PathBuf,
    pub gzip: bool,
    pub flush_timeout: Duration,
}

/// One stopped session, on its way to disk.
pub(super) struct Job {
    /// Detached from the engine thread; the finalizer thread finalizes it.
    pub session: Detached,
    /// The trace's time stamp (the stop), in the file names.
    pub time_ns: u128,
    pub queued: Instant,
    pub manifest: Manifest,
}

/// A finalized session: Kineto's result, ready to save.
struct Finalized {
    result: TraceResult,
    manifest_path: PathBuf,
    manifest: Manifest,
    queued: Instant,
}

/// The manifest written next to each trace.
#[derive(Debug, Clone, Default, Serialize)]
pub(super) struct Manifest {
    pub stepscope_version: &'static str,
    /// `writing`, `complete`, `failed` or `unfinished`.
    pub status: &'static str,
    pub error: Option<String>,
    pub backend: &'static str,
    /// The writing process: the next start in the directory marks a `writing` manifest of a
    /// process no longer alive `unfinished`.
    pub pid: u32,
    pub worker_name: String,
    pub local_rank: u32,
    pub first_step: Option<u64>,
    pub last_step: Option<u64>,
    pub iterations: u64,
    pub start_time_unix_ns: u128,
    pub stop_time_unix_ns: u128,
    pub trace_file: String,
    pub trace_bytes: Option<u64>,
    pub json_bytes: Option<u64>,
    pub summary_file: Option<String>,
    /// Seconds from the stop to the trace's rename into place.
    pub writer_seconds: Option<f64>,
    /// Of which finalizing the session in Kineto (the second half of `disableProfiler`).
    pub finalize_seconds: Option<f64>,
    /// Of which serializing, compressing and renaming the trace.
    pub write_seconds: Option<f64>,
    /// The session's config, written after the fields (shared with the backend, serialized
    /// on the writer threads, never copied on the engine thread).
    #[serde(skip)]
    pub config: Arc<serde_json::Value>,
    /// The top-ops table written next to the trace, if any.
    #[serde(skip)]
    pub table: Option<SortBy>,
    /// The exact file stem the engine asked for (`set_trace_name`), in place of
    /// `{worker}.{time_ns}.pt`.
    #[serde(skip)]
    pub trace_name: Option<String>,
}

/// The manifest file: the manifest's fields, then the config.
#[derive(Serialize)]
struct ManifestFile<'a> {
    #[serde(flatten)]
    manifest: &'a Manifest,
    config: &'a serde_json::Value,
}

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

fn flushing_marker() -> PathBuf {
    std::env::temp_dir().join(format!("stepscope-flushing-{}", std::process::id()))
}

/// One more trace in flight in this process, whose writer waits up to `timeout` at exit.
/// Counts only (it runs in `stop()`, on the engine thread); [`publish_in_flight`] writes the
/// marker, off it.
fn in_flight_begin(timeout: Duration) {
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
fn publish_in_flight() {
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
fn in_flight_end(n: usize) {
    let mut g = IN_FLIGHT.lock();
    g.count = g.count.saturating_sub(n);
    if g.count == 0 && g.written.take().is_some() {
        let _ = fs::remove_file(flushing_marker());
    }
}

/// Jobs the writer has not finished, by manifest path: what the backend marks `unfinished`
/// when it cannot wait any longer.
type InFlight = Arc<Mutex<Vec<(PathBuf, Manifest)>>>;

/// Two threads: the finalizer runs the expensive half of `disableProfiler` (Kineto must finish
/// one session before the next can start, so it never waits behind a save), the saver writes
/// files.
pub(super) struct Writer {
    settings: Arc<Settings>,
    tx: Option<Sender<(PathBuf, Job)>>,
    threads: Vec<JoinHandle<()>>,
    /// Jobs not yet written (finalizing, queued or saving).
    pending: PendingWrites,
    /// Jobs not yet finalized.
    finalizing: PendingWrites,
    in_flight: InFlight,
}

impl Writer {
    pub fn new(settings: Settings) -> Self {
        Writer {
            settings: Arc::new(settings),
            tx: None,
            threads: Vec::new(),
            pending: PendingWrites::default(),
            finalizing: PendingWrites::default(),
            in_flight: InFlight::default(),
        }
    }

    /// The directory traces are written to.
    pub fn dir(&self) -> &Path {
        &self.settings.dir
    }

    pub fn pending(&self) -> PendingWrites {
        self.pending.clone()
    }

    /// Waits (up to the flush timeout) until no session is being finalized.
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

    fn spawn(&mut self) -> Result<Sender<(PathBuf, Job)>> {
        let spawn_err =
            |e: io::Error| Error::backend("torch", format!("cannot start the trace writer: {e}"));
        let (tx, rx) = crossbeam_channel::unbounded::<(PathBuf, Job)>();
        let (save_tx, save_rx) = crossbeam_channel::unbounded::<Finalized>();
        // Spawned from the engine thread: its CPUs are the ones to keep clear.
        let cpus = OffEngineCpus::of_this_thread();
        let (settings, pending, in_flight) = (
            Arc::clone(&self.settings),
            self.pending.clone(),
            Arc::clone(&self.in_flight),
        );
        let saver = thread::Builder::new()
            .name("stepscope-writer".into())
            .spawn(move || {
                cpus.apply();
                save_loop(&settings, &save_rx, &pending, &in_flight)
            })
            .map_err(spawn_err)?;
        self.threads.push(saver);
        let (pending, finalizing, in_flight) = (
            self.pending.clone(),
            self.finalizing.clone(),
            Arc::clone(&self.in_flight),
        );
        let finalizer = thread::Builder::new()
            .name("stepscope-finalize".into())
            .spawn(move || {
                cpus.apply();
                finalize_loop(&rx, &save_tx, &pending, &finalizing, &in_flight)
            })
            .map_err(spawn_err)?;
        self.threads.push(finalizer);
        Ok(tx)
    }

    /// Queues a session for writing. Costs a channel send (the threads start with the first
    /// job); never blocks on Kineto or I/O.
    pub fn submit(&mut self, mut job: Job) -> Result<()> {
        let s = &self.settings;
        let (stem, ext) = match &job.manifest.trace_name {
            Some(name) => (name.clone(), "trace.json"),
            None => (
                format!("{}.{}", job.manifest.worker_name, job.time_ns),
                "pt.trace.json",
            ),
        };
        let ext = if s.gzip {
            format!("{ext}.gz")
        } else {
            ext.to_string()
        };
        job.manifest.stepscope_version = crate::VERSION;
        job.manifest.backend = "torch";
        job.manifest.status = "writing";
        job.manifest.pid = std::process::id();
        job.manifest.trace_file = format!("{stem}.{ext}");
        let manifest_path = s.dir.join(format!("{stem}.stepscope.json"));
        if self.tx.is_none() {
            self.tx = Some(self.spawn()?);
        }
        self.in_flight
            .lock()
            .push((manifest_path.clone(), job.manifest.clone()));
        self.pending.begin();
        self.finalizing.begin();
        in_flight_begin(self.settings.flush_timeout);
        let sent = self
            .tx
            .as_ref()
            .is_some_and(|tx| tx.send((manifest_path.clone(), job)).is_ok());
        if !sent {
            self.pending.finish();
            self.finalizing.finish();
            in_flight_end(1);
            self.in_flight.lock().retain(|(p, _)| *p != manifest_path);
            return Err(Error::backend("torch", "the trace writer has stopped"));
        }
        Ok(())
    }
}

impl Drop for Writer {
    /// Waits up to the flush timeout for queued traces; what is still unwritten then is marked
    /// `unfinished` in its manifest and left to the (detached) threads.
    fn drop(&mut self) {
        drop(self.tx.take());
        if self.pending.wait(self.settings.flush_timeout) {
            for t in self.threads.drain(..) {
                let _ = t.join();
            }
            return;
        }
        let mut in_flight = self.in_flight.lock();
        for (path, manifest) in in_flight.iter_mut() {
            manifest.status = "unfinished";
            manifest.error = Some(format!(
                "the profiler was dropped before this trace was written (waited {:?}, \
                 stepscope.flush_timeout_s)",
                self.settings.flush_timeout
            ));
            write_manifest(path, manifest);
        }
        log::error!(
            "stepscope: {} trace(s) still being written after {:?}; marked unfinished",
            in_flight.len(),
            self.settings.flush_timeout
        );
        // Nobody waits for them any longer: no parent should either.
        in_flight_end(in_flight.len());
        in_flight.clear();
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

/// Records a job's end: its final manifest, then its place in the pending count.
fn conclude(
    manifest_path: &Path,
    manifest: &Manifest,
    pending: &PendingWrites,
    in_flight: &InFlight,
) {
    // Leave the in-flight list first (under its lock), so a concurrent drop cannot mark this
    // job unfinished after its final manifest is written.
    let listed = {
        let mut list = in_flight.lock();
        let before = list.len();
        list.retain(|(p, _)| p != manifest_path);
        write_manifest(manifest_path, manifest);
        list.len() < before
    };
    pending.finish();
    // A job a drop gave up on was already taken off the process's count.
    if listed {
        in_flight_end(1);
    }
}

fn finalize_loop(
    rx: &Receiver<(PathBuf, Job)>,
    save_tx: &Sender<Finalized>,
    pending: &PendingWrites,
    finalizing: &PendingWrites,
    in_flight: &InFlight,
) {
    for (manifest_path, mut job) in rx.iter() {
        publish_in_flight();
        {
            // Under the lock, and only while still listed: a drop that gave up on this job has
            // already written it as unfinished, which "writing" must not overwrite.
            let list = in_flight.lock();
            if list.iter().any(|(p, _)| *p == manifest_path) {
                write_manifest(&manifest_path, &job.manifest);
            }
        }
        let began = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            job.session
                .finalize()
                .map_err(|e| format!("Kineto could not finalize the session: {e}"))
        }))
        .unwrap_or_else(|p| Err(format!("finalizing panicked: {}", panic_message(&*p))));
        finalizing.finish();
        let mut manifest = job.manifest;
        manifest.finalize_seconds = Some(began.elapsed().as_secs_f64());
        match outcome {
            Ok(result) => {
                let next = Finalized {
                    result,
                    manifest_path,
                    manifest,
                    queued: job.queued,
                };
                if let Err(crossbeam_channel::SendError(f)) = save_tx.send(next) {
                    let mut manifest = f.manifest;
                    manifest.status = "failed";
                    manifest.error = Some("the trace writer has stopped".into());
                    conclude(&f.manifest_path, &manifest, pending, in_flight);
                }
            }
            Err(message) => {
                log::error!("stepscope: {} failed: {message}", manifest.trace_file);
                manifest.status = "failed";
                manifest.error = Some(message);
                conclude(&manifest_path, &manifest, pending, in_flight);
            }
        }
    }
}

fn save_loop(
    settings: &Settings,
    rx: &Receiver<Finalized>,
    pending: &PendingWrites,
    in_flight: &InFlight,
) {
    for mut job in rx.iter() {
        let began = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            write_job(settings, &mut job.result, &job.manifest)
        }))
        .unwrap_or_else(|p| Err(format!("the writer panicked: {}", panic_message(&*p))));
        let manifest = &mut job.manifest;
        match outcome {
            Ok(written) => {
                manifest.status = "complete";
                manifest.trace_bytes = Some(written.trace_bytes);
                manifest.json_bytes = Some(written.json_bytes);
                manifest.summary_file = written.summary_file;
                manifest.writer_seconds =
                    Some(written.renamed.duration_since(job.queued).as_secs_f64());
                manifest.write_seconds = Some(written.renamed.duration_since(began).as_secs_f64());
                log::info!(
                    "stepscope: wrote {} ({} bytes)",
                    settings.dir.join(&manifest.trace_file).display(),
                    written.trace_bytes
                );
            }
            Err(message) => {
                log::error!(
                    "stepscope: writing {} failed: {message}",
                    manifest.trace_file
                );
                manifest.status = "failed";
                manifest.error = Some(message);
            }
        }
        // The result (Kineto's buffers) is freed here, on this thread.
        drop(job.result);
        conclude(&job.manifest_path, &job.manifest, pending, in_flight);
    }
}

struct Written {
    trace_bytes: u64,
    json_bytes: u64,
    summary_file: Option<String>,
    renamed: Instant,
}

/// Removes the file on drop unless disarmed: temporaries never outlive a failed write.
struct TempFile(Option<PathBuf>);

impl TempFile {
    fn path(&self) -> &Path {
        self.0.as_deref().unwrap_or(Path::new(""))
    }
    fn keep(mut self) {
        self.0 = None;
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = fs::remove_file(p);
        }
    }
}

/// The marker every temporary name carries: `.{name}.{pid}.partial…`, so the next start in
/// the directory can tell a dead process's leftovers from a live one's writes
/// ([`clean_stale`]).
const PARTIAL: &str = "partial";

/// `.{name}.{pid}.partial{suffix}` in `dir`.
fn temp_path(dir: &Path, name: &str, suffix: &str) -> PathBuf {
    dir.join(format!(".{name}.{}.{PARTIAL}{suffix}", std::process::id()))
}

fn write_job(
    settings: &Settings,
    result: &mut TraceResult,
    manifest: &Manifest,
) -> std::result::Result<Written, String> {
    let dir = &settings.dir;
    let final_name = &manifest.trace_file;
    let final_path = dir.join(final_name);
    // Kineto saves to `{json_path}.tmp`, then renames that to `json_path`.
    let json_path = temp_path(dir, final_name, ".json");
    let kineto_tmp = TempFile(Some(suffixed(&json_path, ".tmp")));
    let json_tmp = TempFile(Some(json_path.clone()));
    let io_err = |what: &str, path: &Path, e: io::Error| format!("{what} {}: {e}", path.display());

    let json_str = json_path
        .to_str()
        .ok_or_else(|| format!("{} is not valid UTF-8", json_path.display()))?
        .to_string();
    let mut save = || {
        result
            .save(&json_str)
            .map_err(|e| format!("Kineto could not save the trace to {json_str}: {e}"))
    };

    let json_bytes = if settings.gzip {
        let gz_tmp = TempFile(Some(temp_path(dir, final_name, "")));
        let pumped = stream_gzip(kineto_tmp.path(), gz_tmp.path(), &mut save)?;
        let json_bytes = match pumped {
            Some(json_bytes) => json_bytes,
            None if !is_regular_file(json_tmp.path()) => {
                return Err("Kineto wrote no trace (the write failed)".into())
            }
            // This Kineto wrote the file itself, not through its `.tmp` (our FIFO): compress
            // the file it wrote.
            None => {
                let tail = check_complete(json_tmp.path())?;
                compress(json_tmp.path(), gz_tmp.path())
                    .map_err(|e| io_err("compressing the trace into", gz_tmp.path(), e))?;
                tail
            }
        };
        fs::rename(gz_tmp.path(), &final_path)
            .map_err(|e| io_err("renaming the trace to", &final_path, e))?;
        gz_tmp.keep();
        drop(json_tmp);
        json_bytes
    } else {
        save()?;
        let json_bytes = check_complete(json_tmp.path())?;
        File::open(json_tmp.path())
            .and_then(|f| f.sync_all())
            .map_err(|e| io_err("syncing", json_tmp.path(), e))?;
        fs::rename(json_tmp.path(), &final_path)
            .map_err(|e| io_err("renaming the trace to", &final_path, e))?;
        json_tmp.keep();
        json_bytes
    };
    // The FIFO (or Kineto's leftovers) go now; a plain JSON trace was renamed into place.
    drop(kineto_tmp);
    let renamed = Instant::now();
    let trace_bytes = fs::metadata(&final_path)
        .map_err(|e| io_err("reading the size of", &final_path, e))?
        .len();

    let summary_file = match manifest.table {
        Some(sort) => Some(write_summary(
            settings,
            result,
            manifest
                .trace_name
                .as_deref()
                .unwrap_or(&manifest.worker_name),
            sort,
        )?),
        None => None,
    };
    Ok(Written {
        trace_bytes,
        json_bytes,
        summary_file,
        renamed,
    })
}

fn is_regular_file(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_file())
}

fn suffixed(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// Runs `save` (Kineto serializing the trace) with a FIFO at `fifo` (the path Kineto writes
/// through) and, on a second thread, gzips what comes out of it into `gz`: the JSON never
/// touches the disk uncompressed, and serializing and compressing overlap.
///
/// `Ok(Some(json_bytes))` when the JSON came through the FIFO, complete; `Ok(None)` when
/// Kineto never opened it (a Kineto that writes the path directly; the caller compresses
/// that file).
fn stream_gzip(
    fifo: &Path,
    gz: &Path,
    save: impl FnOnce() -> std::result::Result<(), String>,
) -> std::result::Result<Option<u64>, String> {
    make_fifo(fifo).map_err(|e| format!("creating the pipe {}: {e}", fifo.display()))?;
    let (saved, pumped) = thread::scope(|scope| {
        let pump = thread::Builder::new()
            .name("stepscope-gzip".into())
            .spawn_scoped(scope, || pump_gzip(fifo, gz));
        let pump = match pump {
            Ok(p) => p,
            Err(e) => return (Err(format!("cannot start the gzip thread: {e}")), None),
        };
        let saved = save();
        // If Kineto never opened the FIFO, the pump still waits in open(): let it go.
        release_reader(fifo);
        let pumped = pump
            .join()
            .unwrap_or_else(|p| Err(format!("the gzip thread panicked: {}", panic_message(&*p))));
        (saved, Some(pumped))
    });
    saved?;
    match pumped {
        None => Err("the gzip thread did not run".into()),
        Some(Err(e)) => Err(e),
        Some(Ok(Pumped { json_bytes: 0, .. })) => Ok(None),
        Some(Ok(Pumped {
            complete: false,
            json_bytes,
        })) => Err(format!(
            "Kineto wrote an incomplete trace ({json_bytes} bytes): the write failed"
        )),
        Some(Ok(Pumped { json_bytes, .. })) => Ok(Some(json_bytes)),
    }
}

struct Pumped {
    json_bytes: u64,
    /// The JSON ended with `}` (Kineto reports no write errors of its own).
    complete: bool,
}

/// Reads the FIFO to its end, gzipping into `gz` (fsynced). On a write error it still drains
/// the FIFO, so Kineto never writes into a closed pipe (SIGPIPE would end a host process that
/// does not ignore it).
fn pump_gzip(fifo: &Path, gz: &Path) -> std::result::Result<Pumped, String> {
    use std::io::Read;
    let mut input = retry_interrupted(|| File::open(fifo))
        .map_err(|e| format!("opening the pipe {}: {e}", fifo.display()))?;
    let mut out = File::create(gz)
        .map(|f| {
            // The output is a tenth of the input or less: 256 KiB writes.
            flate2::write::GzEncoder::new(
                BufWriter::with_capacity(256 << 10, f),
                flate2::Compression::new(6),
            )
        })
        .map_err(|e| format!("creating {}: {e}", gz.display()));
    let mut buf = vec![0u8; 1 << 20];
    let mut json_bytes = 0u64;
    let mut last = 0u8;
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                out = Err(format!("reading the pipe {}: {e}", fifo.display()));
                break;
            }
        };
        json_bytes += n as u64;
        if let Some(b) = buf[..n].iter().rev().find(|b| !b.is_ascii_whitespace()) {
            last = *b;
        }
        if let Ok(gz_out) = out.as_mut() {
            if let Err(e) = gz_out.write_all(&buf[..n]) {
                out = Err(format!("compressing the trace into {}: {e}", gz.display()));
            }
        }
    }
    let gz_out = out?;
    gz_out
        .finish()
        .and_then(|w| w.into_inner().map_err(|e| e.into_error()))
        .and_then(|f| f.sync_all())
        .map_err(|e| format!("compressing the trace into {}: {e}", gz.display()))?;
    Ok(Pumped {
        json_bytes,
        complete: last == b'}',
    })
}

fn retry_interrupted<T>(mut f: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    loop {
        match f() {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

fn make_fifo(path: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in the path"))?;
    let _ = fs::remove_file(path);
    // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
    if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Opens the FIFO's write end without blocking and closes it: a reader still waiting in
/// open() (no writer ever came) wakes to an empty stream. Harmless when nobody waits.
fn release_reader(fifo: &Path) {
    use std::os::unix::fs::OpenOptionsExt;
    let _ = fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(fifo);
}

/// The file's size, after checking that its last non-whitespace byte is `}`: Kineto does not
/// report write errors, so a full disk leaves a truncated JSON behind.
fn check_complete(path: &Path) -> std::result::Result<u64, String> {
    use std::io::{Read, Seek, SeekFrom};
    let check = || -> io::Result<(u64, bool)> {
        let mut f = File::open(path)?;
        let len = f.metadata()?.len();
        let tail = len.min(64);
        f.seek(SeekFrom::Start(len - tail))?;
        let mut buf = Vec::with_capacity(tail as usize);
        f.read_to_end(&mut buf)?;
        Ok((
            len,
            buf.iter().rev().find(|b| !b.is_ascii_whitespace()) == Some(&b'}'),
        ))
    };
    match check() {
        Ok((len, true)) => Ok(len),
        Ok((len, false)) => Err(format!(
            "Kineto wrote an incomplete trace ({len} bytes): the disk is full or the write failed"
        )),
        Err(e) => Err(format!(
            "Kineto wrote no trace at {}: the disk is full or the write failed ({e})",
            path.display()
        )),
    }
}

/// gzip at level 6 (gzip's own default): a third of the time torch's level-9 export takes, for
/// a file a few percent larger.
fn compress(src: &Path, dst: &Path) -> io::Result<()> {
    let mut input = BufReader::with_capacity(1 << 20, File::open(src)?);
    let out = BufWriter::with_capacity(1 << 20, File::create(dst)?);
    let mut gz = flate2::write::GzEncoder::new(out, flate2::Compression::new(6));
    io::copy(&mut input, &mut gz)?;
    let out = gz.finish()?;
    out.into_inner().map_err(|e| e.into_error())?.sync_all()
}

fn write_summary(
    settings: &Settings,
    result: &TraceResult,
    stem: &str,
    sort: SortBy,
) -> std::result::Result<String, String> {
    let rows = result.events()?;
    let events: Vec<summary::Event<'_>> = rows
        .iter()
        .map(|r| summary::Event {
            name: &r.name,
            thread: r.thread,
            start_ns: r.start_ns,
            duration_ns: r.duration_ns,
            device: r.device,
            is_async: r.is_async,
        })
        .collect();
    let stats = summary::summarize(&events);
    // Kineto's device activity here is CUDA's (the backend records no other device's).
    let device = "CUDA";
    let limit = match sort {
        SortBy::SelfDevice => 100,
        SortBy::SelfCpu => 50,
    };
    let table = summary::table(&stats, sort, limit, device);
    let name = format!("{stem}.profiler_out.txt");
    let path = settings.dir.join(&name);
    let tmp = TempFile(Some(temp_path(&settings.dir, &name, "")));
    // vLLM writes the table with print(): one more newline.
    fs::write(tmp.path(), table + "\n")
        .map_err(|e| format!("writing {}: {e}", tmp.path().display()))?;
    fs::rename(tmp.path(), &path).map_err(|e| format!("renaming {}: {e}", path.display()))?;
    tmp.keep();
    Ok(name)
}

/// Cleans up after processes that died while writing into `dir` (killed, or out of time at
/// exit): removes their temporaries (`.{name}.{pid}.partial…`) and marks their manifests still
/// `writing` as `unfinished`. Files of live processes, this one included, are left alone.
pub(super) fn clean_stale(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let path = entry.path();
        if let Some(pid) = temp_owner(name) {
            if !process_alive(pid) {
                match fs::remove_file(&path) {
                    Ok(()) => log::info!(
                        "stepscope: removed {} (left by process {pid}, which has ended)",
                        path.display()
                    ),
                    Err(e) => log::debug!("stepscope: cannot remove {}: {e}", path.display()),
                }
            }
        } else if name.ends_with(".stepscope.json") && !name.starts_with('.') {
            mark_if_orphaned(&path);
        }
    }
}

/// The pid in a temporary's name, `.{name}.{pid}.partial…`.
fn temp_owner(name: &str) -> Option<u32> {
    let rest = name.strip_prefix('.')?;
    let at = rest.rfind(&format!(".{PARTIAL}"))?;
    let before = &rest[..at];
    before[before.rfind('.')? + 1..].parse().ok()
}

fn process_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: kill with signal 0 sends nothing; it only checks that the process exists.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Marks a manifest `unfinished` when it is still `writing` and its process has ended. Reads
/// only the manifest's head: `status` and `pid` come first.
fn mark_if_orphaned(path: &Path) {
    use std::io::Read;
    let mut head = [0u8; 512];
    let Ok(n) = File::open(path).and_then(|mut f| f.read(&mut head)) else {
        return;
    };
    let head = String::from_utf8_lossy(&head[..n]);
    if !head.contains(r#""status": "writing""#) {
        return;
    }
    let Ok(text) = fs::read_to_string(path) else {
        return;
    };
    let Ok(mut value) = serde_json::from_str::<serde_json::Value>(&text) else {
        return;
    };
    let pid = value.get("pid").and_then(serde_json::Value::as_u64);
    let Some(pid) = pid.and_then(|p| u32::try_from(p).ok()) else {
        return;
    };
    if process_alive(pid) {
        return;
    }
    value["status"] = "unfinished".into();
    value["error"] = format!(
        "process {pid} ended before this trace was written (killed, or it ran out of \
         stepscope.flush_timeout_s at exit)"
    )
    .into();
    let tmp = temp_path(path.parent().unwrap_or(Path::new(".")), "manifest", "");
    let written = serde_json::to_vec_pretty(&value)
        .map_err(io::Error::other)
        .and_then(|mut bytes| {
            bytes.push(b'\n');
            fs::write(&tmp, bytes)?;
            fs::rename(&tmp, path)
        });
    match written {
        Ok(()) => log::warn!(
            "stepscope: {} was left 'writing' by process {pid}, which has ended; marked \
             unfinished",
            path.display()
        ),
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            log::debug!("stepscope: cannot update {}: {e}", path.display());
        }
    }
}

/// Writes a manifest atomically (temporary name, then rename); failures are logged, since the
/// manifest is what would have reported them.
fn write_manifest(path: &Path, manifest: &Manifest) {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = temp_path(path.parent().unwrap_or(Path::new(".")), &name, "");
    let result = serde_json::to_vec_pretty(&ManifestFile {
        manifest,
        config: &manifest.config,
    })
    .map_err(io::Error::other)
    .and_then(|mut bytes| {
        bytes.push(b'\n');
        let mut f = File::create(&tmp)?;
        f.write_all(&bytes)?;
        drop(f);
        fs::rename(&tmp, path)
    });
    if let Err(e) = result {
        let _ = fs::remove_file(&tmp);
        log::error!(
            "stepscope: cannot write the manifest {}: {e}",
            path.display()
        );
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

    #[test]
    fn temporaries_name_their_process() {
        let p = temp_path(Path::new("/d"), "w.1.pt.trace.json.gz", ".json");
        let name = p.file_name().unwrap().to_str().unwrap();
        assert_eq!(temp_owner(name), Some(std::process::id()));
        assert_eq!(temp_owner("w.1.pt.trace.json.gz"), None);
        assert_eq!(temp_owner(".w.1.stepscope.json.x.partial"), None);
    }
}
