//! Reading Kineto / Chrome traces: `.json` or `.json.gz`, streamed event by event.
//!
//! The file is gunzipped as it is read and its events parsed as their bytes come in
//! ([`stepscope_format::trace::EventStream`]): memory is a bounded number of buffers of 144 KiB
//! (a few; about two dozen at most while a slow sink holds the scanner back, as
//! [`read_ahead`]'s channels bound them) plus what the sink keeps, whatever the trace's size.

use std::fmt;
use std::fs::File;
use std::io::{BufRead, BufReader, ErrorKind, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TryRecvError};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError, TryLockError};
use std::time::{Duration, Instant};

use stepscope_format::manifest::MANIFEST_SUFFIX;
pub use stepscope_format::trace::{DeviceProperties, Event, EventSink, Id, Meta, RawEvent};
use stepscope_format::trace::{
    EventStream, ReadError, ScanAhead, Scanned, StreamErrorKind, CHUNK_HEADROOM,
};

/// A trace file that could not be read; the message names the file and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceError {
    /// The file.
    pub path: PathBuf,
    /// What is wrong with it.
    pub message: String,
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.message)
    }
}

impl std::error::Error for TraceError {}

fn err(path: &Path, message: impl Into<String>) -> TraceError {
    TraceError {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

/// Bytes of the compressed file read at a time (each page of the buffer is a page fault the
/// first time it is written: a 1.8 MB trace's 124 KB file touched 31 pages of a 256 KiB one).
const FILE_BUFFER: usize = 64 << 10;

/// A trace file opened: read as it is, or gunzipped (in chunks of the size given).
enum Source {
    Plain(BufReader<File>),
    Gzip(Gunzip, usize),
}

impl Source {
    /// Read on a thread of its own where it is gunzipped ([`Prefetch`]).
    fn prefetched(self) -> std::io::Result<Box<dyn Read + Send>> {
        Ok(match self {
            Source::Plain(input) => Box::new(input),
            Source::Gzip(gunzip, chunk) => Box::new(Prefetch::spawn(gunzip, chunk)?),
        })
    }

    /// The next chunk ([`fill_chunk`]): gunzipped here, or read from the plain file in chunks
    /// as large as the gunzip's.
    fn next_chunk(&mut self, reuse: Option<Vec<u8>>) -> (Vec<u8>, std::io::Result<()>) {
        match self {
            Source::Plain(input) => fill_chunk(input, reuse, PREFETCH_CHUNK),
            Source::Gzip(gunzip, chunk) => fill_chunk(gunzip, reuse, *chunk),
        }
    }
}

/// A trace opened, with whether it is small: under [`SMALL_TRACE`] bytes of JSON (the file's
/// size, or a gzip file's trailer's).
struct Opened {
    source: Source,
    small: bool,
}

/// Opens a trace, gunzipping as it reads when the file starts with the gzip magic (members
/// concatenated, as `cat a.gz b.gz` makes, are read as one stream).
fn open_source(path: &Path) -> Result<Opened, TraceError> {
    let file = File::open(path).map_err(|e| err(path, format!("cannot read: {e}")))?;
    let mut input = BufReader::with_capacity(FILE_BUFFER, file);
    let head = input
        .fill_buf()
        .map_err(|e| err(path, format!("cannot read: {e}")))?;
    if head.starts_with(&[0x1f, 0x8b]) {
        let small = gzip_json_size(input.get_ref()).is_some_and(|n| n < SMALL_TRACE);
        let chunk = if small { SMALL_CHUNK } else { PREFETCH_CHUNK };
        Ok(Opened {
            source: Source::Gzip(Gunzip::new(input), chunk),
            small,
        })
    } else {
        let small = input
            .get_ref()
            .metadata()
            .is_ok_and(|m| m.len() < SMALL_TRACE);
        Ok(Opened {
            source: Source::Plain(input),
            small,
        })
    }
}

/// The size of a gzip file's JSON as its trailer gives it (ISIZE: the last member's length
/// modulo 2^32), `None` if it cannot be read. Only chooses the gunzip thread's chunk size: a
/// wrong figure (members concatenated, over 4 GiB) costs time, never a byte of the trace.
fn gzip_json_size(file: &File) -> Option<u64> {
    use std::os::unix::fs::FileExt;
    let len = file.metadata().ok()?.len();
    let mut trailer = [0u8; 4];
    file.read_exact_at(&mut trailer, len.checked_sub(4)?).ok()?;
    Some(u64::from(u32::from_le_bytes(trailer)))
}

/// Opens a trace for reading its JSON (gunzipped as [`read_events`] reads it).
pub fn open(path: &Path) -> Result<Box<dyn Read + Send>, TraceError> {
    open_source(path)?
        .source
        .prefetched()
        .map_err(|e| read_error(path, ReadError::Io(e)))
}

/// Decompressed bytes handed from the gunzip thread at a time. Small, and the same each time,
/// so that the few buffers in flight are reused from the start: on a 1.7 MB trace, chunks
/// doubling from 64 KiB to 1 MiB were all fresh memory, ~900 page faults of the process's
/// ~1,100 (this size: ~570, the whole read 0.91x the time).
const PREFETCH_CHUNK: usize = 128 << 10;
/// The chunk of a trace of under [`SMALL_TRACE`] bytes of JSON. A page fault is dear on some
/// machines (a VM whose freed memory goes back to its host), and each buffer's pages fault
/// once; but each chunk handed over costs the threads a wake-up (a 35 MB trace in chunks of
/// this size: four times the context switches, about 10% slower). So small chunks only where
/// the faults outweigh the wake-ups: HTA's 1.8 MB rank-0 trace, 544 page faults in all against
/// 344 with this and the smaller file buffer, 0.85x the time (medians of 50 runs).
const SMALL_CHUNK: usize = 32 << 10;
const SMALL_TRACE: u64 = 4 << 20;
/// Chunks in flight between the threads.
const PREFETCH_DEPTH: usize = 3;
/// Buffers handed back for reuse that are kept.
const RECYCLED: usize = 16;

/// A reader whose source is read on a thread of its own, a few chunks ahead: gunzip runs
/// beside the parser instead of before it. Each chunk's bytes follow [`CHUNK_HEADROOM`] bytes
/// of room, so the parser reads them where they lie ([`EventStream::feed_chunk`]) instead of
/// copying them. The thread ends when the reader is dropped.
struct Prefetch {
    chunks: Receiver<std::io::Result<Vec<u8>>>,
    /// Emptied chunks, back to the thread for reuse.
    spent: SyncSender<Vec<u8>>,
    current: Vec<u8>,
    at: usize,
}

impl Prefetch {
    fn spawn(mut source: impl Fill + Send + 'static, chunk_size: usize) -> std::io::Result<Self> {
        let (tx, chunks) = sync_channel(PREFETCH_DEPTH);
        // Room for every buffer in flight: a buffer let go is freed, and the one made in its
        // place faults its pages anew (measured when this thread fed a scanning thread too:
        // the 15 MB ns_resolution trace, 2,200-2,500 page faults with 4 kept and 3 batches
        // waiting, 1,500-1,600 with 16 kept and 1 waiting).
        let (spent, back) = sync_channel::<Vec<u8>>(RECYCLED);
        std::thread::Builder::new()
            .spawn(move || loop {
                let (chunk, result) = fill_chunk(&mut source, back.try_recv().ok(), chunk_size);
                let end = ends_source(&chunk) || result.is_err();
                let sent = match result {
                    Ok(()) => tx.send(Ok(chunk)),
                    Err(e) => tx.send(Err(e)),
                };
                if end || sent.is_err() {
                    return;
                }
            })
            .map_err(|e| {
                std::io::Error::other(format!("cannot start a thread to gunzip it: {e}"))
            })?;
        Ok(Prefetch {
            chunks,
            spent,
            current: Vec::new(),
            at: 0,
        })
    }

    /// The next chunk, `None` after the last.
    fn next_chunk(&mut self) -> Option<std::io::Result<Vec<u8>>> {
        match self.chunks.recv() {
            Ok(Ok(chunk)) if ends_source(&chunk) => None,
            Ok(chunk) => Some(chunk),
            // The thread has ended after the last chunk.
            Err(_) => None,
        }
    }

    /// Streams every chunk's events into `sink`, each read where it lies.
    fn read_all<S: EventSink>(
        mut self,
        mut stream: EventStream,
        sink: &mut S,
    ) -> Result<Meta, ReadError> {
        while let Some(chunk) = self.next_chunk() {
            let spent = stream.feed_chunk(chunk.map_err(ReadError::Io)?, sink)?;
            let _ = self.spent.try_send(spent);
        }
        Ok(stream.finish(sink)?)
    }
}

/// Whether a chunk [`fill_chunk`] read holds no byte of the source after its room: the source
/// has ended.
fn ends_source(chunk: &[u8]) -> bool {
    chunk.len() <= CHUNK_HEADROOM
}

/// The next `chunk_size` bytes of `source` after [`CHUNK_HEADROOM`] bytes of room, read into
/// `reuse` where it is a buffer handed back ([`ends_source`] once the source has ended).
fn fill_chunk(
    source: &mut impl Fill,
    reuse: Option<Vec<u8>>,
    chunk_size: usize,
) -> (Vec<u8>, std::io::Result<()>) {
    let mut chunk = reuse
        // A buffer the parser grew for an event longer than the room is let go.
        .filter(|c| c.capacity() <= 2 * (CHUNK_HEADROOM + chunk_size))
        .unwrap_or_else(|| Vec::with_capacity(CHUNK_HEADROOM + chunk_size));
    // The room is zeroed once per buffer; a buffer back from the parser keeps its own.
    if chunk.len() < CHUNK_HEADROOM {
        chunk.clear();
        chunk.resize(CHUNK_HEADROOM, 0);
    }
    chunk.truncate(CHUNK_HEADROOM);
    chunk.reserve_exact(chunk_size);
    let result = source.fill(&mut chunk, chunk_size);
    (chunk, result)
}

/// A source read into the spare room of a buffer.
trait Fill {
    /// Appends the source's next bytes to `out`: `n` of them, or what is left at the source's
    /// end, or (a gzip file) as many as fill `out`'s capacity, reserved for `n` or more.
    fn fill(&mut self, out: &mut Vec<u8>, n: usize) -> std::io::Result<()>;
}

impl<R: Read> Fill for R {
    fn fill(&mut self, out: &mut Vec<u8>, n: usize) -> std::io::Result<()> {
        self.take(n as u64).read_to_end(out).map(drop)
    }
}

/// A gzip file's JSON, gunzipped straight into a buffer's spare room. Through `Read`, the
/// standard library zeroes that room before each read (the decoder has no `read_buf`): on
/// HTA's 9.8 MB nccl trace, 3.7% of `analyze`'s instructions (callgrind). Members concatenated,
/// as `cat a.gz b.gz` makes, are read as one stream; each member's CRC-32 and length are checked.
struct Gunzip {
    input: BufReader<File>,
    inflate: flate2::Decompress,
    /// The member being read has ended: what follows, if anything, is another.
    ended: bool,
}

impl Gunzip {
    fn new(input: BufReader<File>) -> Self {
        Gunzip {
            input,
            inflate: flate2::Decompress::new_gzip(15),
            ended: false,
        }
    }
}

impl Fill for Gunzip {
    fn fill(&mut self, out: &mut Vec<u8>, n: usize) -> std::io::Result<()> {
        let goal = out.len() + n;
        while out.len() < goal {
            let input = self.input.fill_buf()?;
            if self.ended {
                if input.is_empty() {
                    return Ok(());
                }
                self.inflate = flate2::Decompress::new_gzip(15);
                self.ended = false;
            }
            if input.is_empty() {
                return Err(std::io::Error::new(
                    ErrorKind::UnexpectedEof,
                    "the file ends inside a gzip member",
                ));
            }
            let (read, written) = (self.inflate.total_in(), out.len());
            let status = self
                .inflate
                .decompress_vec(input, out, flate2::FlushDecompress::None)
                .map_err(|e| std::io::Error::new(ErrorKind::InvalidData, e))?;
            let used = (self.inflate.total_in() - read) as usize;
            self.input.consume(used);
            match status {
                flate2::Status::StreamEnd => self.ended = true,
                _ if used == 0 && out.len() == written => {
                    return Err(std::io::Error::new(
                        ErrorKind::InvalidData,
                        "the gzip stream stopped making progress",
                    ))
                }
                _ => {}
            }
        }
        Ok(())
    }
}

impl Read for Prefetch {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.at >= self.current.len() {
            let Some(next) = self.next_chunk() else {
                return Ok(0);
            };
            let spent = std::mem::replace(&mut self.current, next?);
            let _ = self.spent.try_send(spent);
            self.at = CHUNK_HEADROOM;
        }
        let n = out.len().min(self.current.len() - self.at);
        out[..n].copy_from_slice(&self.current[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// Streams a trace's events into `sink`, reading the file once, in bounded memory (the
/// event being parsed and what the sink keeps). Returns the trace's top-level metadata.
pub fn read_events<S: EventSink>(path: &Path, sink: &mut S) -> Result<Meta, TraceError> {
    read_source(open_source(path)?.source, sink).map_err(|e| read_error(path, e))
}

/// Streams `source`'s events into `sink` on this thread (gunzip on its own).
fn read_source<S: EventSink>(source: Source, sink: &mut S) -> Result<Meta, ReadError> {
    let stream = EventStream::new();
    match source {
        Source::Plain(input) => stream.read_all(input, sink),
        Source::Gzip(gunzip, chunk) => Prefetch::spawn(gunzip, chunk)
            .map_err(ReadError::Io)?
            .read_all(stream, sink),
    }
}

/// A reading's error as the message naming the file says it.
fn read_error(path: &Path, e: ReadError) -> TraceError {
    match e {
        ReadError::Stream(e) if e.kind == StreamErrorKind::NotATrace => err(path, e.message),
        ReadError::Stream(e) => err(path, format!("not valid trace JSON: {e}")),
        ReadError::Io(io)
            if matches!(
                io.kind(),
                ErrorKind::InvalidInput | ErrorKind::InvalidData | ErrorKind::UnexpectedEof
            ) =>
        {
            err(
                path,
                format!("not a valid gzip file (truncated or corrupt): {io}"),
            )
        }
        ReadError::Io(io) => err(path, format!("cannot read: {io}")),
    }
}

/// What the scanning thread of [`read_events_ahead`] hands over.
enum Ahead {
    /// Scanned chunks, and how many of them the reader gave (the rest the scanner read).
    Chunks(Vec<Scanned>, usize),
    End(Vec<Scanned>, Box<Meta>),
    Failed(ReadError),
}

/// Bytes of JSON scanned before they are handed over at once, where the next chunk is already
/// waiting: each handing over may wake the sink's thread, and on a VM a wake-up is dear (HTA's
/// 1.7 MB rank-1 trace in 32 KiB chunks, one each: 80 context switches against 20, the
/// process's CPU 1.7x). Where none waits, what is scanned goes at once ([`scan_ahead`]).
const HAND_OVER: usize = 256 << 10;

/// [`read_events`] for a sink of [`Event`]s. A trace of [`SMALL_TRACE`] bytes of JSON or
/// more, read while no other is, is scanned on a thread of its own and its events given to the
/// sink on this one, the gunzip done by whichever of the two is free ([`read_ahead`]), so
/// that on a machine of two cores the cores share the work instead of the scan and the sink
/// taking turns on one. A smaller one is read as [`read_events`] reads it: there the
/// hand-overs cost more than they give (HTA's 1.7 MB rank-1 trace: 1.14-1.26x the time with
/// three threads); so is a trace read while another is (`analyze` of several reads them a core
/// each). The events, their order and the metadata each is given are those [`read_events`]
/// gives (`stepscope_format`'s
/// `events_scanned_ahead_are_those_the_stream_gives`; here `scanned_ahead_or_not_a_sink_is_given_the_same`).
pub fn read_events_ahead<S>(path: &Path, sink: &mut S) -> Result<Meta, TraceError>
where
    S: for<'de> EventSink<Event<'de> = Event<'de>>,
{
    let Opened { source, small } = open_source(path)?;
    let reading = Reading::start();
    let read = if small || reading.others > 0 {
        read_source(source, sink)
    } else {
        read_ahead(source, sink)
    };
    read.map_err(|e| read_error(path, e))
}

/// Traces being read by [`read_events_ahead`] now.
static READING: AtomicUsize = AtomicUsize::new(0);

/// One trace's reading, counted in [`READING`] while it lasts.
struct Reading {
    /// Those being read besides this one when it began.
    others: usize,
}

impl Reading {
    fn start() -> Self {
        Reading {
            others: READING.fetch_add(1, Ordering::Relaxed),
        }
    }
}

impl Drop for Reading {
    fn drop(&mut self) {
        READING.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Chunks this thread hands to the scanning thread and has not had back at most.
const SCAN_DEPTH: usize = 4;

/// The source of [`read_ahead`], which either thread reads the next chunk of: this thread
/// while it has room to hand one over, the scanning thread when it has none waiting.
struct Feed {
    source: Source,
    /// The source has ended, or failed.
    ended: bool,
    /// Buffers the sink is done with, for the next chunks (their pages already faulted).
    spare: Receiver<Vec<u8>>,
}

impl Feed {
    /// The next chunk; `None` once the source has ended.
    fn next(&mut self) -> Option<std::io::Result<Vec<u8>>> {
        if self.ended {
            return None;
        }
        let (chunk, result) = self.source.next_chunk(self.spare.try_recv().ok());
        let next = match result {
            Err(e) => Some(Err(e)),
            Ok(()) if ends_source(&chunk) => None,
            Ok(()) => Some(Ok(chunk)),
        };
        self.ended = !matches!(next, Some(Ok(_)));
        next
    }
}

/// How long a thread of [`read_ahead`] waits awake for the other before it sleeps: the other
/// is about to hand it work (a chunk it is reading, a batch it is scanning), and on a VM a
/// sleeping thread took 30-50 µs to run again once woken (`perf sched`), tens of times per
/// trace. Only where the process may run on two cores or more: on one, the other thread cannot
/// run while this one waits awake (HTA's 9.8 MB nccl trace pinned to one core: 22.8 ms with the
/// wait awake, 19.4-20.0 ms for the three threads, 19.0-19.6 ms with no wait).
fn spin() -> Duration {
    static SPIN: OnceLock<Duration> = OnceLock::new();
    *SPIN.get_or_init(|| match std::thread::available_parallelism() {
        Ok(n) if n.get() >= 2 => Duration::from_micros(200),
        _ => Duration::ZERO,
    })
}

/// Streams `source`'s events into `sink` on this thread, scanned on one other
/// ([`read_events_ahead`]). Two threads, on a machine of two cores: the scanning thread
/// scans, this one replays the scanned events into the sink, and the gunzip (or the read of a
/// plain file) is done by whichever is free: this thread while fewer than [`SCAN_DEPTH`]
/// chunks are out, the scanner when it has no chunk waiting. Three threads (gunzip, scan,
/// sink) left the scheduler to share two cores among three: HTA's 9.8 MB nccl trace, about
/// 200 context switches where these two make 21-25. `analyze` of HTA's 9.8, 15, 26 and 35 MB
/// traces, the whole command against the three threads, 40 pairs taken in turn, two series:
/// median wall 0.90-0.97x, 0.84-0.95x, 0.86-0.88x and 0.86x, the same CPU time.
fn read_ahead<S>(source: Source, sink: &mut S) -> Result<Meta, ReadError>
where
    S: for<'de> EventSink<Event<'de> = Event<'de>>,
{
    let (spent, spare) = sync_channel::<Vec<u8>>(RECYCLED);
    let feed = Mutex::new(Feed {
        source,
        ended: false,
        spare,
    });
    std::thread::scope(|scope| {
        // Never full at a send: at most SCAN_DEPTH chunks are out. A read's error goes the same
        // way, after the chunks before it, so that an error in their JSON is the one reported,
        // as the stream reading the file alone would.
        let (to_scan, chunks) = sync_channel::<std::io::Result<Vec<u8>>>(SCAN_DEPTH);
        // Batches scanned and not yet replayed, at most: with the chunks the scanner read
        // itself, a slow sink holds the scanner there (memory stays bounded).
        let (tx, scanned) = sync_channel::<Ahead>(2 * SCAN_DEPTH);
        let scanner_feed = &feed;
        std::thread::Builder::new()
            .spawn_scoped(scope, move || scan_ahead(&chunks, scanner_feed, &tx))
            .map_err(|e| {
                ReadError::Io(std::io::Error::other(format!(
                    "cannot start a thread to read it: {e}"
                )))
            })?;
        let stopped = || {
            // The scanning thread panicked (the scope re-raises it when this returns).
            ReadError::Io(std::io::Error::other(
                "internal error: the scanning thread stopped",
            ))
        };
        let mut to_scan = Some(to_scan);
        let mut out = 0;
        let mut waiting_since: Option<Instant> = None;
        let mut meta = Meta::default();
        loop {
            if let Some(feeding) = to_scan.as_ref().filter(|_| out < SCAN_DEPTH) {
                // Only if the scanner is not reading the source itself.
                if let Some(mut f) = try_lock(&feed) {
                    match f.next() {
                        // Sent under the lock: the scanner, looking for a chunk waiting under
                        // it, reads the source only where none is.
                        Some(Ok(chunk)) => match feeding.send(Ok(chunk)) {
                            Ok(()) => out += 1,
                            // The scanner has stopped: its failure is waiting below.
                            Err(_) => to_scan = None,
                        },
                        // The scanner reports it after the chunks before it (if it has
                        // stopped, its own failure, earlier in the file, is waiting below).
                        Some(Err(e)) => {
                            let _ = feeding.send(Err(e));
                            to_scan = None;
                        }
                        // The scanner, waiting for a chunk, finds the end in the feed.
                        None => to_scan = None,
                    }
                    // Awake for what is scanned from now: the read was not waiting.
                    waiting_since = None;
                }
            }
            let message = match scanned.try_recv() {
                Ok(message) => message,
                Err(TryRecvError::Disconnected) => return Err(stopped()),
                // Nothing scanned yet: feed again if the scanner no longer holds the feed, or
                // wait awake a while, then asleep.
                Err(TryRecvError::Empty) => {
                    if waiting_since.get_or_insert_with(Instant::now).elapsed() < spin() {
                        std::hint::spin_loop();
                        continue;
                    }
                    scanned.recv().map_err(|_| stopped())?
                }
            };
            waiting_since = None;
            match message {
                Ahead::Chunks(batch, given) => {
                    out -= given;
                    for s in batch {
                        s.replay(sink, &mut meta);
                        let _ = spent.try_send(s.into_bytes());
                    }
                }
                Ahead::End(batch, meta_at_end) => {
                    for s in batch {
                        s.replay(sink, &mut meta);
                    }
                    return Ok(*meta_at_end);
                }
                Ahead::Failed(e) => return Err(e),
            }
        }
    })
}

/// The feed, if no other thread holds it (after a panic while one held it, the feed as that
/// left it: the scope re-raises the panic once both threads are done).
fn try_lock(feed: &Mutex<Feed>) -> Option<MutexGuard<'_, Feed>> {
    match feed.try_lock() {
        Ok(f) => Some(f),
        Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}

/// The scanning thread's next chunk, and whether the reader gave it (else this thread read it
/// from the feed); `None` after the last.
fn next_to_scan(
    chunks: &Receiver<std::io::Result<Vec<u8>>>,
    feed: &Mutex<Feed>,
) -> Option<(std::io::Result<Vec<u8>>, bool)> {
    let began = Instant::now();
    loop {
        if let Ok(chunk) = chunks.try_recv() {
            return Some((chunk, true));
        }
        if let Some(mut f) = try_lock(feed) {
            // One the reader sent before this took the feed comes first.
            if let Ok(chunk) = chunks.try_recv() {
                return Some((chunk, true));
            }
            return f.next().map(|chunk| (chunk, false));
        }
        // The reader holds the feed: it is reading a chunk for this thread. Wait for it awake
        // a while, then asleep (the reader lets go of its sender once the source has ended).
        if began.elapsed() < spin() {
            std::hint::spin_loop();
            continue;
        }
        match chunks.recv() {
            Ok(chunk) => return Some((chunk, true)),
            Err(_) => {
                let mut f = feed.lock().unwrap_or_else(PoisonError::into_inner);
                return f.next().map(|chunk| (chunk, false));
            }
        }
    }
}

/// The scanning thread of [`read_ahead`]: scans the chunks it is given, and where none waits,
/// reads the next from `feed` itself; hands the events back a batch at a time ([`HAND_OVER`]
/// bytes, or what is scanned when no chunk waits), each with how many of its chunks were
/// given. Ends after the last chunk, or when the reader is gone.
fn scan_ahead(
    chunks: &Receiver<std::io::Result<Vec<u8>>>,
    feed: &Mutex<Feed>,
    tx: &SyncSender<Ahead>,
) {
    let mut ahead = ScanAhead::new();
    let mut batch: Vec<Scanned> = Vec::new();
    let (mut batched, mut given) = (0, 0);
    let mut waiting = None;
    loop {
        let next = match waiting.take() {
            Some(chunk) => Some((chunk, true)),
            None => next_to_scan(chunks, feed),
        };
        let Some((chunk, was_given)) = next else {
            break;
        };
        let chunk = match chunk {
            Ok(chunk) => chunk,
            Err(e) => {
                let _ = tx.send(Ahead::Failed(ReadError::Io(e)));
                return;
            }
        };
        given += usize::from(was_given);
        match ahead.feed_chunk(chunk) {
            Ok(scanned) => {
                batched += scanned.byte_len();
                batch.push(scanned);
            }
            Err(e) => {
                let _ = tx.send(Ahead::Failed(ReadError::Stream(e)));
                return;
            }
        }
        // With no chunk waiting, the reader may be waiting for what is scanned: hand it over
        // before reading one.
        waiting = chunks.try_recv().ok();
        if batched >= HAND_OVER || waiting.is_none() {
            let done = Ahead::Chunks(std::mem::take(&mut batch), given);
            (batched, given) = (0, 0);
            if tx.send(done).is_err() {
                return;
            }
        }
    }
    let _ = tx.send(match ahead.finish() {
        Ok((scanned, meta)) => {
            batch.push(scanned);
            Ahead::End(batch, Box::new(meta))
        }
        Err(e) => Ahead::Failed(ReadError::Stream(e)),
    });
}

/// Whether a path looks like a trace file: `.json` or `.json.gz`, not a temporary still being
/// written (hidden, or renamed by a tool that moved it: `….{pid}.partial…`), not a stepscope
/// manifest.
pub fn is_trace_file(path: &Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    !name.starts_with('.')
        && !name.contains(".partial")
        && !name.ends_with(MANIFEST_SUFFIX)
        && (name.ends_with(".json") || name.ends_with(".json.gz"))
}

/// Expands directories into the trace files they hold (sorted); files stay as given.
pub fn expand(paths: &[PathBuf]) -> Result<Vec<PathBuf>, TraceError> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut found: Vec<PathBuf> = std::fs::read_dir(p)
                .map_err(|e| err(p, format!("cannot list directory: {e}")))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| is_trace_file(f))
                .collect();
            if found.is_empty() {
                return Err(err(p, "directory holds no .json or .json.gz trace"));
            }
            found.sort();
            out.extend(found);
        } else {
            out.push(p.clone());
        }
    }
    Ok(out)
}

/// The rank in a file name: `rank-3`, `rank_3`, `rank3`, `rank-3.` …
pub fn rank_from_name(path: &Path) -> Option<i64> {
    let name = path.file_name()?.to_str()?.to_ascii_lowercase();
    let at = name.rfind("rank")?;
    let digits: String = name[at + 4..]
        .trim_start_matches(['-', '_', '.'])
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use stepscope_test_doubles::Scratch;

    /// Each event as text, with the rank it was given.
    #[derive(Default)]
    struct Record(Vec<String>);

    impl EventSink for Record {
        type Event<'de> = Event<'de>;
        fn event(&mut self, e: Event<'_>, meta: &Meta) {
            let args = e.raw_args.and_then(|r| r.text()).map(str::len);
            self.0.push(format!(
                "{:?} {:?} {:?} {:?} {:?} {:?} {:?} {args:?} {:?}",
                e.ph, e.name, e.pid, e.tid, e.ts, e.ts_split, e.dur, meta.rank
            ));
        }
    }

    /// A trace of about 6 MB of JSON: escapes, string and number ids, args, events longer
    /// than a chunk's room (copied by the stream), the rank read between two event arrays;
    /// `fault` puts a syntax error near its end.
    fn document(fault: bool) -> Vec<u8> {
        let mut doc = String::from(r#"{"traceEvents": ["#);
        for i in 0..24_000 {
            // Not before the first event of each array.
            if i > 0 && i != 12_001 {
                doc.push_str(", ");
            }
            let name = if i % 5_000 == 7 {
                "y".repeat(CHUNK_HEADROOM + 3_000)
            } else {
                // JSON escapes: a quote, and é as \u00e9.
                format!(r#"op \"{i}\" \u00e9"#)
            };
            let tid = if i % 3 == 0 {
                format!(r#""t{i}\u0031""#)
            } else {
                i.to_string()
            };
            doc.push_str(&format!(
                r#"{{"ph": "X", "cat": "cpu_op", "name": "{name}", "pid": 1, "tid": {tid}, "ts": 1712195495505582.{:03}, "dur": {}.5, "args": {{"External id": {i}, "Input Dims": [[2048, 1], []]}}}}"#,
                i % 1000,
                i % 97
            ));
            if fault && i == 23_990 {
                doc.push_str(", {\"ph\" 1}");
            }
            if i == 12_000 {
                doc.push_str(r#"], "distributedInfo": {"rank": 4}, "traceEvents": ["#);
            }
        }
        doc.push_str("]}");
        doc.into_bytes()
    }

    #[test]
    fn scanned_ahead_or_not_a_sink_is_given_the_same() {
        let dir = Scratch::empty("trace-ahead");
        std::fs::create_dir_all(&*dir).unwrap();
        for fault in [false, true] {
            let json = document(fault);
            assert!(json.len() as u64 > SMALL_TRACE);
            let plain = dir.join(format!("t{fault}.json"));
            std::fs::write(&plain, &json).unwrap();
            let gz = dir.join(format!("t{fault}.json.gz"));
            let mut enc = flate2::write::GzEncoder::new(
                File::create(&gz).unwrap(),
                flate2::Compression::fast(),
            );
            enc.write_all(&json).unwrap();
            enc.finish().unwrap();
            // Cut inside the gzip stream: a read error in the middle of the trace, met by
            // whichever thread gunzips that chunk.
            let cut = dir.join(format!("cut{fault}.json.gz"));
            let bytes = std::fs::read(&gz).unwrap();
            std::fs::write(&cut, &bytes[..bytes.len() * 3 / 5]).unwrap();
            {
                let ((got, ahead), (want, one)) = both_readers(&cut);
                let (got, want) = (got.unwrap_err(), want.unwrap_err());
                assert_eq!(got, want);
                assert!(got.message.contains("not a valid gzip file"), "{got}");
                // What was read before the error is as the stream read it (the events still
                // being scanned when it came are not given).
                assert!(one.0.starts_with(&ahead.0));
            }
            // The JSON at fault, the gzip cut after it: the JSON's error is the one given,
            // as the stream reading the file alone gives it, whichever thread read the cut.
            let mut early = json.clone();
            // A chunk or two before the cut: where the reader, a few chunks ahead of the
            // scanner, meets the cut before the scanner meets the fault.
            let from = json.len() * 11 / 20;
            let key = early[from..]
                .windows(7)
                .position(|w| w == b"\"name\":")
                .unwrap()
                + from;
            early[key + 6] = b';';
            let bytes = gzip(&early, 1);
            let both = dir.join(format!("both{fault}.json.gz"));
            std::fs::write(&both, &bytes[..bytes.len() * 3 / 5]).unwrap();
            for _ in 0..5 {
                let ((got, _), (want, _)) = both_readers(&both);
                let (got, want) = (got.unwrap_err(), want.unwrap_err());
                assert_eq!(got, want);
                assert!(got.message.contains("not valid trace JSON"), "{got}");
            }
            for path in [&plain, &gz] {
                assert!(!open_source(path).unwrap().small, "{}", path.display());
                let ((got, ahead), (want, one)) = both_readers(path);
                match (got, want) {
                    (Ok(got), Ok(want)) => {
                        assert!(!fault);
                        assert_eq!(ahead.0.len(), 24_000);
                        assert_eq!(ahead.0, one.0, "{}", path.display());
                        assert_eq!((got.rank, got.has_events), (want.rank, want.has_events));
                        assert!(one.0[12_001].ends_with("Some(4)"), "{}", one.0[12_001]);
                    }
                    (Err(got), Err(want)) => {
                        assert!(fault);
                        assert_eq!(got, want);
                        assert!(got.message.contains("event 23992"), "{got}");
                    }
                    (got, want) => panic!("{}: {got:?} against {want:?}", path.display()),
                }
            }
        }
    }

    /// One reader's outcome, with the events its sink was given.
    type Outcome = (Result<Meta, TraceError>, Record);

    /// A trace read by [`read_ahead`] and by [`read_source`], in that order.
    fn both_readers(path: &Path) -> (Outcome, Outcome) {
        let mut ahead = Record::default();
        let got = read_ahead(open_source(path).unwrap().source, &mut ahead)
            .map_err(|e| read_error(path, e));
        let mut one = Record::default();
        let want = read_source(open_source(path).unwrap().source, &mut one)
            .map_err(|e| read_error(path, e));
        ((got, ahead), (want, one))
    }

    /// Gzip of `bytes`, at `level`.
    fn gzip(bytes: &[u8], level: u32) -> Vec<u8> {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(level));
        enc.write_all(bytes).unwrap();
        enc.finish().unwrap()
    }

    #[test]
    fn gzipped_traces_give_the_plain_files_events_or_an_error_naming_the_file() {
        let dir = Scratch::empty("trace-prefetch");
        std::fs::create_dir_all(&*dir).unwrap();
        let read = |path: &Path| {
            let mut sink = Record::default();
            let got = read_source(open_source(path).unwrap().source, &mut sink)
                .map_err(|e| read_error(path, e));
            (got, sink)
        };
        // One event: the source ends in the first chunk.
        let tiny = br#"{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 2}], "distributedInfo": {"rank": 2}}"#;
        let large = document(false);
        for (what, json) in [("tiny", &tiny[..]), ("large", &large[..])] {
            let plain = dir.join(format!("{what}.json"));
            std::fs::write(&plain, json).unwrap();
            let gz = dir.join(format!("{what}.json.gz"));
            std::fs::write(&gz, gzip(json, 6)).unwrap();
            let ((got, events), (want, want_events)) = (read(&gz), read(&plain));
            let (got, want) = (got.unwrap(), want.unwrap());
            assert_eq!(events.0, want_events.0, "{what}");
            assert_eq!((got.rank, got.has_events), (want.rank, want.has_events));
            assert!(!events.0.is_empty() && got.rank.is_some(), "{what}");
        }
        // The gzip at fault in the first chunk, and after it: each an error naming the file,
        // the events before it given.
        let whole = gzip(&large, 6);
        let mut header = whole.clone();
        header[12..40].fill(0xFF);
        for (what, bytes) in [
            ("header", header),
            ("cut", whole[..whole.len() / 2].to_vec()),
        ] {
            let path = dir.join(format!("{what}.json.gz"));
            std::fs::write(&path, &bytes).unwrap();
            let (got, events) = read(&path);
            let e = got.unwrap_err();
            assert!(e.message.contains("not a valid gzip file"), "{what}: {e}");
            assert_eq!(e.path, path);
            assert_eq!(events.0.is_empty(), what == "header", "{what}");
        }
    }

    #[test]
    fn gunzip_gives_what_flate2s_multi_member_reader_gives_or_fails_where_it_fails() {
        let dir = Scratch::empty("trace-gunzip");
        std::fs::create_dir_all(&*dir).unwrap();
        let json = document(false);
        let (a, b) = json.split_at(json.len() / 3);
        let whole = gzip(&json, 6);
        let members = [gzip(a, 1), gzip(b, 9)].concat();
        let mut bad_crc = whole.clone();
        let at = bad_crc.len() - 8;
        bad_crc[at] ^= 1;
        let cases: [(&str, Vec<u8>); 6] = [
            ("whole", whole.clone()),
            ("members", members.clone()),
            ("empty member after", [whole.clone(), gzip(b"", 6)].concat()),
            ("truncated", whole[..whole.len() / 2].to_vec()),
            ("bad crc", bad_crc),
            ("garbage after", [members, b"not gzip".to_vec()].concat()),
        ];
        for (what, bytes) in cases {
            let path = dir.join("t.json.gz");
            std::fs::write(&path, &bytes).unwrap();
            let mut want = Vec::new();
            let want = flate2::read::MultiGzDecoder::new(&bytes[..])
                .read_to_end(&mut want)
                .map(|_| want);
            // Small chunks, so that members and the file's buffer end inside them.
            let mut source =
                Gunzip::new(BufReader::with_capacity(4096, File::open(&path).unwrap()));
            let mut got = Vec::new();
            let got = loop {
                let (chunk, result) = fill_chunk(&mut source, None, 10_000);
                if let Err(e) = result {
                    break Err(e);
                }
                if ends_source(&chunk) {
                    break Ok(got);
                }
                got.extend_from_slice(&chunk[CHUNK_HEADROOM..]);
            };
            match (got, want) {
                (Ok(got), Ok(want)) => {
                    assert!(
                        got == want,
                        "{what}: {} bytes against {}",
                        got.len(),
                        want.len()
                    );
                    assert_eq!(got.len(), json.len(), "{what}");
                }
                (Err(got), Err(_)) => {
                    // Read as a trace, the message says what is wrong, with the file.
                    let e = read_error(&path, ReadError::Io(got));
                    assert!(e.message.contains("not a valid gzip file"), "{what}: {e}");
                }
                (got, want) => panic!("{what}: {got:?} against {want:?}"),
            }
        }
    }

    #[test]
    fn ranks_come_from_file_names() {
        let r = |s: &str| rank_from_name(Path::new(s));
        assert_eq!(r("trace_filter__sampled_rank-1.json.gz"), Some(1));
        assert_eq!(
            r("ns_resolution_trace__rank-0.Apr_03.pt.trace.json.gz"),
            Some(0)
        );
        assert_eq!(r("worker_rank12.json"), Some(12));
        assert_eq!(r("trace.json"), None);
    }

    #[test]
    fn manifests_and_temporaries_are_not_traces() {
        let t = |s: &str| is_trace_file(Path::new(s));
        assert!(t("w0.123.pt.trace.json.gz") && t("rank-1.json"));
        assert!(!t("w0.123.pt.stepscope.json"));
        assert!(!t(".w0.123.pt.trace.json.gz.77.partial"));
        assert!(!t("r0_.w0.123.pt.trace.json.gz.77.partial.json"));
        assert!(!t("w0.123.pt.profiler_out.txt"));
    }
}
