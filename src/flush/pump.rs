//! The gzip pump: a trace serialized into a FIFO is compressed as it is written, with the
//! captured iterations' requests written into their annotations (`annotate`) and summarized
//! (`summarize`) on the way; and the checks and compression for a serializer that wrote a plain
//! file instead.

use std::fs::{self, File};
use std::io::{self, BufReader, BufWriter, Write};
use std::path::Path;
use std::thread;

use super::annotate::RequestArgs;
use super::summarize::SummaryThread;
use crate::error::{panic_message, Error, Result};
use crate::trace::Summary;

/// Runs `save` (Kineto serializing the trace) with a FIFO at `fifo` (the path Kineto writes
/// through) and, on a second thread, gzips what comes out of it into `gz`: the JSON never
/// touches the disk uncompressed, and serializing and compressing overlap.
///
/// `Ok(Some(json_bytes))` when the JSON came through the FIFO, complete; `Ok(None)` when
/// Kineto never opened it (a Kineto that writes the path directly; the caller compresses
/// that file).
pub(super) fn stream_gzip(
    fifo: &Path,
    gz: &Path,
    level: u32,
    requests: Option<RequestArgs>,
    save: impl FnOnce() -> Result<()>,
) -> Result<Option<Streamed>> {
    make_fifo(fifo).map_err(|e| Error::io(fifo, format!("creating the pipe: {e}"), e))?;
    let (saved, pumped) = thread::scope(|scope| {
        let pump = thread::Builder::new()
            .name("stepscope-gzip".into())
            .spawn_scoped(scope, || pump_gzip(fifo, gz, level, requests));
        let pump = match pump {
            Ok(p) => p,
            Err(e) => {
                let message = format!("cannot start the gzip thread: {e}");
                return (Err(Error::io(gz, message, e)), None);
            }
        };
        let saved = save();
        // If Kineto never opened the FIFO, the pump waits in open(), or is about to: let it go.
        // Until the pump has the FIFO open, there is no reader to open it against (ENXIO).
        while !release_reader(fifo) && !pump.is_finished() {
            thread::sleep(std::time::Duration::from_millis(1));
        }
        let pumped = pump.join().unwrap_or_else(|p| {
            let message = format!("the gzip thread panicked: {}", panic_message(&*p));
            Err(Error::write(gz, message))
        });
        (saved, Some(pumped))
    });
    saved?;
    match pumped {
        None => Err(Error::write(gz, "the gzip thread did not run")),
        Some(Err(e)) => Err(e),
        Some(Ok(Pumped { json_bytes: 0, .. })) => Ok(None),
        Some(Ok(Pumped {
            complete: false,
            json_bytes,
            ..
        })) => Err(Error::write(
            gz,
            format!("the trace was written incomplete ({json_bytes} bytes): the write failed"),
        )),
        Some(Ok(Pumped {
            json_bytes,
            summary,
            ..
        })) => Ok(Some(Streamed {
            json_bytes,
            summary,
        })),
    }
}

/// A trace that came through the FIFO, complete.
pub(super) struct Streamed {
    pub json_bytes: u64,
    /// Its summary, when it parsed as a trace.
    pub summary: Option<Summary>,
}

struct Pumped {
    json_bytes: u64,
    /// The JSON ended with `}` (Kineto reports no write errors of its own).
    complete: bool,
    summary: Option<Summary>,
}

/// Reads the FIFO to its end, gzipping into `gz` at `level` (fsynced), with the captured
/// iterations' requests written into their annotations on the way (`requests`), and summarized
/// on a thread beside it. On a write error it still drains the FIFO, so Kineto never writes
/// into a closed pipe (SIGPIPE would end a host process that does not ignore it).
fn pump_gzip(fifo: &Path, gz: &Path, level: u32, requests: Option<RequestArgs>) -> Result<Pumped> {
    thread::scope(|scope| {
        let mut summary = SummaryThread::spawn(scope);
        let pumped = pump_into(fifo, gz, level, requests, &mut summary);
        let summary = summary.and_then(SummaryThread::finish);
        pumped.map(|(json_bytes, complete)| Pumped {
            json_bytes,
            complete,
            summary,
        })
    })
}

/// The pump's loop: (JSON bytes, whether the JSON ended with `}`).
fn pump_into(
    fifo: &Path,
    gz: &Path,
    level: u32,
    mut requests: Option<RequestArgs>,
    summary: &mut Option<SummaryThread<'_>>,
) -> Result<(u64, bool)> {
    use std::io::Read;
    let mut input = retry_interrupted(|| File::open(fifo))
        .map_err(|e| Error::io(fifo, format!("opening the pipe: {e}"), e))?;
    widen_pipe(&input);
    let mut out = File::create(gz)
        .map(|f| {
            // The output is a tenth of the input or less: 256 KiB writes.
            flate2::write::GzEncoder::new(
                BufWriter::with_capacity(256 << 10, f),
                flate2::Compression::new(level),
            )
        })
        .map_err(|e| Error::io(gz, format!("creating the compressed trace: {e}"), e));
    let mut buf = vec![0u8; 1 << 20];
    let mut edited = Vec::new();
    let mut json_bytes = 0u64;
    let mut last = 0u8;
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                out = Err(Error::io(fifo, format!("reading the pipe: {e}"), e));
                break;
            }
        };
        if let Some(b) = buf[..n].iter().rev().find(|b| !b.is_ascii_whitespace()) {
            last = *b;
        }
        let chunk = match requests.as_mut() {
            Some(r) => {
                edited.clear();
                r.feed(&buf[..n], &mut edited);
                &edited[..]
            }
            None => &buf[..n],
        };
        json_bytes += chunk.len() as u64;
        if let Some(s) = summary.as_mut() {
            s.feed(chunk);
        }
        if let Ok(gz_out) = out.as_mut() {
            if let Err(e) = gz_out.write_all(chunk) {
                out = Err(compressing(gz, e));
            }
        }
    }
    if let Some(r) = requests.as_mut() {
        edited.clear();
        r.finish(&mut edited);
        json_bytes += edited.len() as u64;
        if let Some(s) = summary.as_mut() {
            s.feed(&edited);
        }
        if let Ok(gz_out) = out.as_mut() {
            if let Err(e) = gz_out.write_all(&edited) {
                out = Err(compressing(gz, e));
            }
        }
    }
    let gz_out = out?;
    gz_out
        .finish()
        .and_then(|w| w.into_inner().map_err(|e| e.into_error()))
        .and_then(|f| f.sync_all())
        .map_err(|e| compressing(gz, e))?;
    Ok((json_bytes, last == b'}'))
}

/// The pipe's buffer, as large as the system lets an unprivileged process make it (1 MiB by
/// default, `/proc/sys/fs/pipe-max-size`), in place of 64 KiB: where the serializer and the
/// pump share one core (the engine pinned to the other), each time the pipe fills is a switch
/// between them. Left as it is if the system refuses.
fn widen_pipe(pipe: &File) {
    use std::os::fd::AsRawFd;
    // SAFETY: F_SETPIPE_SZ on a descriptor this function borrows; no memory is passed.
    let rc = unsafe { libc::fcntl(pipe.as_raw_fd(), libc::F_SETPIPE_SZ, 1 << 20) };
    if rc < 0 {
        log::debug!(
            "stepscope: the trace pipe keeps its size: {}",
            io::Error::last_os_error()
        );
    }
}

fn compressing(gz: &Path, e: io::Error) -> Error {
    Error::io(gz, format!("compressing the trace: {e}"), e)
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

/// Opens the FIFO's write end without blocking and closes it: a reader waiting in open() (no
/// writer ever came) wakes to an empty stream; harmless to one reading. `false` when no reader
/// has the FIFO open (ENXIO): one that has not reached open() yet would then wait there.
fn release_reader(fifo: &Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    let opened = fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(fifo);
    !matches!(opened, Err(e) if e.raw_os_error() == Some(libc::ENXIO))
}

/// The file's size, after checking that its last non-whitespace byte is `}`: Kineto does not
/// report write errors, so a full disk leaves a truncated JSON behind.
pub(super) fn check_complete(path: &Path) -> Result<u64> {
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
    // Kineto says nothing of why: the disk's free space tells a full disk from the rest.
    let free = || {
        path.parent()
            .and_then(|d| crate::sys::free_disk(d).ok())
            .map_or(String::new(), |b| {
                format!("; {} KB free on its disk", b >> 10)
            })
    };
    match check() {
        Ok((len, true)) => Ok(len),
        Ok((len, false)) => Err(Error::write(
            path,
            format!(
                "the trace was written incomplete ({len} bytes): the disk is full or the write \
                 failed{}",
                free()
            ),
        )),
        Err(e) => {
            let message = format!(
                "no trace was written: the disk is full or the write failed ({e}{})",
                free()
            );
            Err(Error::io(path, message, e))
        }
    }
}

/// Gzips `src` into `dst` at `level` (fsynced).
pub(super) fn compress(src: &Path, dst: &Path, level: u32) -> io::Result<()> {
    let mut input = BufReader::with_capacity(1 << 20, File::open(src)?);
    let out = BufWriter::with_capacity(1 << 20, File::create(dst)?);
    let mut gz = flate2::write::GzEncoder::new(out, flate2::Compression::new(level));
    io::copy(&mut input, &mut gz)?;
    let out = gz.finish()?;
    out.into_inner().map_err(|e| e.into_error())?.sync_all()
}
