//! The torch backend's writer thread: serializes each finished session off the engine thread.
//!
//! For each session it writes, in `torch_profiler_dir`:
//! - `{worker}.{time_ns}.pt.trace.json.gz` (or `.json`): torch's tensorboard naming. Kineto
//!   writes the JSON under a hidden temporary name, the writer compresses it into a second
//!   temporary file and renames that into place, so the final name only ever holds a complete
//!   trace;
//! - `{worker}.profiler_out.txt` when the config asks for the op table (vLLM's file name);
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
use cxx::UniquePtr;
use parking_lot::Mutex;
use serde::Serialize;

use super::ffi;
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
    pub session: UniquePtr<ffi::Detached>,
    /// The trace's time stamp (the stop), in the file names.
    pub time_ns: u128,
    pub queued: Instant,
    pub manifest: Manifest,
}

/// A finalized session: Kineto's result, ready to save.
struct Finalized {
    result: UniquePtr<ffi::TraceResult>,
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
}

/// The manifest file: the manifest's fields, then the config.
#[derive(Serialize)]
struct ManifestFile<'a> {
    #[serde(flatten)]
    manifest: &'a Manifest,
    config: &'a serde_json::Value,
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
        let (settings, pending, in_flight) = (
            Arc::clone(&self.settings),
            self.pending.clone(),
            Arc::clone(&self.in_flight),
        );
        let saver = thread::Builder::new()
            .name("stepscope-writer".into())
            .spawn(move || save_loop(&settings, &save_rx, &pending, &in_flight))
            .map_err(spawn_err)?;
        self.threads.push(saver);
        let (pending, finalizing, in_flight) = (
            self.pending.clone(),
            self.finalizing.clone(),
            Arc::clone(&self.in_flight),
        );
        let finalizer = thread::Builder::new()
            .name("stepscope-finalize".into())
            .spawn(move || finalize_loop(&rx, &save_tx, &pending, &finalizing, &in_flight))
            .map_err(spawn_err)?;
        self.threads.push(finalizer);
        Ok(tx)
    }

    /// Queues a session for writing. Costs a channel send (the threads start with the first
    /// job); never blocks on Kineto or I/O.
    pub fn submit(&mut self, mut job: Job) -> Result<()> {
        let s = &self.settings;
        let stem = format!("{}.{}", job.manifest.worker_name, job.time_ns);
        let ext = if s.gzip {
            "pt.trace.json.gz"
        } else {
            "pt.trace.json"
        };
        job.manifest.stepscope_version = crate::VERSION;
        job.manifest.backend = "torch";
        job.manifest.status = "writing";
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
        let sent = self
            .tx
            .as_ref()
            .is_some_and(|tx| tx.send((manifest_path.clone(), job)).is_ok());
        if !sent {
            self.pending.finish();
            self.finalizing.finish();
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
        in_flight.clear();
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
    {
        let mut list = in_flight.lock();
        list.retain(|(p, _)| p != manifest_path);
        write_manifest(manifest_path, manifest);
    }
    pending.finish();
}

fn finalize_loop(
    rx: &Receiver<(PathBuf, Job)>,
    save_tx: &Sender<Finalized>,
    pending: &PendingWrites,
    finalizing: &PendingWrites,
    in_flight: &InFlight,
) {
    for (manifest_path, mut job) in rx.iter() {
        {
            // Under the lock, and only while still listed: a drop that gave up on this job has
            // already written it as unfinished, which "writing" must not overwrite.
            let list = in_flight.lock();
            if list.iter().any(|(p, _)| *p == manifest_path) {
                write_manifest(&manifest_path, &job.manifest);
            }
        }
        let began = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| match job.session.as_mut() {
            Some(session) => ffi::finalize(session)
                .map_err(|e| format!("Kineto could not finalize the session: {}", e.what())),
            None => Err("no session to finalize".to_string()),
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

fn write_job(
    settings: &Settings,
    result: &mut UniquePtr<ffi::TraceResult>,
    manifest: &Manifest,
) -> std::result::Result<Written, String> {
    let dir = &settings.dir;
    let final_name = &manifest.trace_file;
    let final_path = dir.join(final_name);
    let json_tmp = TempFile(Some(dir.join(format!(".{final_name}.partial.json"))));
    // Kineto writes through its own `<path>.tmp` and leaves it behind when the write fails.
    let _kineto_tmp = TempFile(Some(dir.join(format!(".{final_name}.partial.json.tmp"))));
    let io_err = |what: &str, path: &Path, e: io::Error| format!("{what} {}: {e}", path.display());

    let Some(result_ref) = result.as_mut() else {
        return Err("the profiler returned no result".into());
    };
    let tmp_str = json_tmp
        .path()
        .to_str()
        .ok_or_else(|| format!("{} is not valid UTF-8", json_tmp.path().display()))?
        .to_string();
    ffi::save(result_ref, &tmp_str)
        .map_err(|e| format!("Kineto could not save the trace to {tmp_str}: {}", e.what()))?;
    let json_bytes = fs::metadata(json_tmp.path())
        .map_err(|e| {
            format!(
                "Kineto wrote no trace at {}: the disk is full or the write failed ({e})",
                json_tmp.path().display()
            )
        })?
        .len();
    // Kineto does not report write errors: a full disk leaves a truncated JSON behind.
    if !ends_with_closing_brace(json_tmp.path())
        .map_err(|e| io_err("reading back", json_tmp.path(), e))?
    {
        return Err(format!(
            "Kineto wrote an incomplete trace ({json_bytes} bytes): the disk is full or the \
             write failed"
        ));
    }

    if settings.gzip {
        let gz_tmp = TempFile(Some(dir.join(format!(".{final_name}.partial"))));
        compress(json_tmp.path(), gz_tmp.path())
            .map_err(|e| io_err("compressing the trace into", gz_tmp.path(), e))?;
        fs::rename(gz_tmp.path(), &final_path)
            .map_err(|e| io_err("renaming the trace to", &final_path, e))?;
        gz_tmp.keep();
    } else {
        File::open(json_tmp.path())
            .and_then(|f| f.sync_all())
            .map_err(|e| io_err("syncing", json_tmp.path(), e))?;
        fs::rename(json_tmp.path(), &final_path)
            .map_err(|e| io_err("renaming the trace to", &final_path, e))?;
        json_tmp.keep();
    }
    let renamed = Instant::now();
    let trace_bytes = fs::metadata(&final_path)
        .map_err(|e| io_err("reading the size of", &final_path, e))?
        .len();

    let summary_file = match manifest.table {
        Some(sort) => Some(write_summary(
            settings,
            result,
            &manifest.worker_name,
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

/// Whether the file's last non-whitespace byte is `}` (a complete JSON object).
fn ends_with_closing_brace(path: &Path) -> io::Result<bool> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = File::open(path)?;
    let len = f.metadata()?.len();
    let tail = len.min(64);
    f.seek(SeekFrom::Start(len - tail))?;
    let mut buf = Vec::with_capacity(tail as usize);
    f.read_to_end(&mut buf)?;
    Ok(buf.iter().rev().find(|b| !b.is_ascii_whitespace()) == Some(&b'}'))
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
    result: &UniquePtr<ffi::TraceResult>,
    worker_name: &str,
    sort: SortBy,
) -> std::result::Result<String, String> {
    let Some(result) = result.as_ref() else {
        return Err("the profiler returned no result".into());
    };
    let n = ffi::event_count(result);
    let mut rows = Vec::with_capacity(n);
    for i in 0..n {
        rows.push(ffi::event_at(result, i).map_err(|e| e.what().to_string())?);
    }
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
    let limit = match sort {
        SortBy::SelfDevice => 100,
        SortBy::SelfCpu => 50,
    };
    let table = summary::table(&stats, sort, limit);
    let name = format!("{worker_name}.profiler_out.txt");
    let path = settings.dir.join(&name);
    let tmp = TempFile(Some(settings.dir.join(format!(".{name}.partial"))));
    fs::write(tmp.path(), table).map_err(|e| format!("writing {}: {e}", tmp.path().display()))?;
    fs::rename(tmp.path(), &path).map_err(|e| format!("renaming {}: {e}", path.display()))?;
    tmp.keep();
    Ok(name)
}

/// Writes a manifest atomically (temporary name, then rename); failures are logged, since the
/// manifest is what would have reported them.
fn write_manifest(path: &Path, manifest: &Manifest) {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.partial"));
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
