//! A streaming reader of Chrome/Kineto trace JSON: bytes go in as they come (a gunzip stream,
//! a FIFO's chunks), events come out one at a time, and the reader holds only the bytes of the
//! event it is in the middle of.
//!
//! The document is `{"traceEvents": [ev, ev, …], "key": value, …}` (keys in any order) or a
//! bare `[ev, ev, …]`. The reader walks that outer structure itself and reads each element of
//! `traceEvents` with the scanner ([`super::scan`]), straight from the buffered bytes (strings
//! borrowed), as the sink's [`FromTrace`] type. When an element is cut by the end of the
//! buffered bytes, the reader keeps the element's bytes and asks for more. Each wait for more
//! asks for at least as many bytes again as are buffered, so a long element costs linear, not
//! quadratic, work. Other top-level values are parsed once whole by serde_json: only
//! `distributedInfo`, `deviceProperties` and `stepscope` are kept ([`Meta`]).

use std::io::{self, Read};

use serde::Deserialize;
use serde_json::value::RawValue;

use super::event::{DeviceProperties, DistributedInfo, Meta};
use super::header::TraceHeader;
use super::scan::{Fault, FromTrace, Scanner};

/// What consumes a trace's events: the type each event is read as (borrowing from the
/// reader's buffer for the length of the call) and what is done with it.
pub trait EventSink {
    /// How an event is read: [`Event`](super::Event) (the fields analysis reads),
    /// [`RawEvent`](super::RawEvent) (its JSON text), [`Skip`](super::Skip), or
    /// [`Serde<T>`](super::Serde) for a type of one's own.
    type Event<'de>: FromTrace<'de>;

    /// Takes one event. `meta` holds what the top-level keys read so far said (those that
    /// follow `traceEvents` in the file are not known yet).
    fn event(&mut self, event: Self::Event<'_>, meta: &Meta);
}

/// Bytes read from a source at a time: the first read asks for the fewest, each read that
/// fills what it asked for doubles the next, up to the most (a small trace is not read into a
/// megabyte of zeroed memory).
const FIRST_READ: usize = 64 << 10;
const CHUNK: usize = 1 << 20;

/// The room at the front of a chunk given to [`EventStream::feed_chunk`], for the bytes of an
/// event cut at the end of the chunk before it (a longer one is copied instead).
pub const CHUNK_HEADROOM: usize = 16 << 10;

/// Where the reader is in the document's outer structure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before the first byte: `{` or `[`.
    Start,
    /// In the top-level object: a key, or `}` (`first`: right after `{`).
    Key { first: bool },
    /// After a key: `:`.
    Colon(Key),
    /// After `key:`: its value.
    Value(Key),
    /// After a top-level value: `,` or `}`.
    AfterValue,
    /// Right after the event array's `[`: an event or `]`.
    FirstEvent { bare: bool },
    /// An event.
    Event { bare: bool },
    /// After an event: `,` or `]`.
    AfterEvent { bare: bool },
    /// The document has ended: only whitespace may follow.
    Done,
}

/// The top-level keys read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key {
    Events,
    Distributed,
    Devices,
    Stepscope,
    BaseTime,
    Other,
}

/// What one step of the reader needs.
enum Progress {
    /// It moved on.
    Moved,
    /// The bytes buffered end inside a value: more are needed.
    NeedMore,
}

/// A document that is not a readable trace: what is wrong and where (a byte offset into the
/// whole document).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamError {
    /// The offset of the value or byte at fault.
    pub offset: u64,
    /// What is wrong.
    pub message: String,
    /// Which kind of fault.
    pub kind: StreamErrorKind,
}

/// The kinds of [`StreamError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamErrorKind {
    /// Not JSON, or JSON cut short.
    Malformed,
    /// Valid JSON without a `traceEvents` array.
    NotATrace,
}

impl std::fmt::Display for StreamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (at byte {})", self.message, self.offset)
    }
}

impl std::error::Error for StreamError {}

/// Why [`EventStream::read_all`] failed: the source (a corrupt gzip stream included), or the
/// document.
#[derive(Debug)]
pub enum ReadError {
    /// Reading the source failed.
    Io(io::Error),
    /// The document is not a readable trace.
    Stream(StreamError),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Io(e) => e.fmt(f),
            ReadError::Stream(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for ReadError {}

impl From<StreamError> for ReadError {
    fn from(e: StreamError) -> Self {
        ReadError::Stream(e)
    }
}

/// The streaming reader; see the module docs.
pub struct EventStream {
    /// Bytes of the document buffered (a read appends into its spare capacity: nothing is
    /// zeroed first).
    buf: Vec<u8>,
    /// The first byte of `buf` not consumed.
    pos: usize,
    /// The document offset of `buf`'s first byte, for error offsets. Wrapping: a chunk handed
    /// over whole ([`EventStream::feed_chunk`]) may begin with room before the document's
    /// first byte.
    dropped: u64,
    /// How many bytes beyond those buffered the next step needs before it can move on.
    want: usize,
    state: State,
    meta: Meta,
    /// Events handed to the sink.
    events: u64,
    /// Times a value was cut by the end of the bytes buffered and waited for more.
    waits: u64,
}

impl Default for EventStream {
    fn default() -> Self {
        Self::new()
    }
}

impl EventStream {
    /// A reader at the start of a document.
    pub fn new() -> Self {
        EventStream {
            buf: Vec::new(),
            pos: 0,
            dropped: 0,
            want: 0,
            state: State::Start,
            meta: Meta::default(),
            events: 0,
            waits: 0,
        }
    }

    /// Feeds the next bytes of the document; every event they complete goes to `sink`.
    pub fn feed<S: EventSink>(&mut self, bytes: &[u8], sink: &mut S) -> Result<(), StreamError> {
        self.compact();
        self.buf.extend_from_slice(bytes);
        self.drain_when_ready(sink)
    }

    /// Feeds the next bytes of the document as a chunk handed over whole: its bytes from
    /// [`CHUNK_HEADROOM`] on are the document's, the room before them takes the bytes of an
    /// event the last chunk cut, so the chunk is read where it lies instead of being copied
    /// (what a gunzip thread hands over). Returns a buffer done with, for the next chunk.
    pub fn feed_chunk<S: EventSink>(
        &mut self,
        mut chunk: Vec<u8>,
        sink: &mut S,
    ) -> Result<Vec<u8>, StreamError> {
        // A chunk no longer than its room holds none of the document.
        let Some(bytes) = chunk.get(CHUNK_HEADROOM..).filter(|b| !b.is_empty()) else {
            return Ok(chunk);
        };
        if !self.reads_in_place(bytes.len()) {
            self.feed(bytes, sink)?;
            return Ok(chunk);
        }
        let left = self.buf.len() - self.pos;
        let at = CHUNK_HEADROOM - left;
        chunk[at..CHUNK_HEADROOM].copy_from_slice(&self.buf[self.pos..]);
        // `buf[pos]` and `chunk[at]` are the same byte of the document.
        self.dropped = self
            .dropped
            .wrapping_add(self.pos as u64)
            .wrapping_sub(at as u64);
        self.pos = at;
        let spent = std::mem::replace(&mut self.buf, chunk);
        self.drain_when_ready(sink)?;
        Ok(spent)
    }

    /// Whether [`EventStream::feed_chunk`] reads a chunk of `bytes` bytes of the document
    /// where it lies (`false`: copied, as [`EventStream::feed`] does): not when what a cut value
    /// waits for is not all in the chunk, or the cut part does not fit the chunk's room.
    pub(super) fn reads_in_place(&self, bytes: usize) -> bool {
        let left = self.buf.len() - self.pos;
        left <= CHUNK_HEADROOM && left + bytes >= self.want
    }

    /// The bytes buffered: those a chunk read in place holds, until the next chunk replaces it.
    pub(super) fn buffered(&self) -> &[u8] {
        &self.buf
    }

    /// Ends the document: an error if it is incomplete. Returns the top-level metadata.
    pub fn finish<S: EventSink>(self, sink: &mut S) -> Result<Meta, StreamError> {
        self.finish_with_buffer(sink).map(|(meta, _)| meta)
    }

    /// [`EventStream::finish`], giving back the buffer too (the last chunk read in place).
    pub(super) fn finish_with_buffer<S: EventSink>(
        mut self,
        sink: &mut S,
    ) -> Result<(Meta, Vec<u8>), StreamError> {
        self.drain(sink, true)?;
        if self.state != State::Done {
            return Err(self.error(self.buf.len(), "the JSON ends early (truncated trace)"));
        }
        if !self.meta.has_events {
            // The whole document is at fault: its first byte.
            return Err(StreamError {
                offset: 0,
                message: "JSON without a \"traceEvents\" array: not a Kineto/Chrome trace".into(),
                kind: StreamErrorKind::NotATrace,
            });
        }
        Ok((self.meta, self.buf))
    }

    /// Reads a whole document from `source`, reading into the buffer directly.
    pub fn read_all<S: EventSink>(
        mut self,
        mut source: impl Read,
        sink: &mut S,
    ) -> Result<Meta, ReadError> {
        let mut ask = FIRST_READ;
        loop {
            self.compact();
            let need = self.want.max(ask);
            self.buf.reserve(need);
            let n = (&mut source)
                .take(need as u64)
                .read_to_end(&mut self.buf)
                .map_err(ReadError::Io)?;
            if n == need {
                ask = (ask * 2).min(CHUNK);
            }
            if n == 0 {
                return Ok(self.finish(sink)?);
            }
            self.drain_when_ready(sink)?;
        }
    }

    /// Moves on once the bytes a cut value waits for are in.
    fn drain_when_ready<S: EventSink>(&mut self, sink: &mut S) -> Result<(), StreamError> {
        if self.buf.len() - self.pos < self.want {
            return Ok(());
        }
        self.want = 0;
        self.drain(sink, false)
    }

    /// Drops consumed bytes from the buffer's front.
    fn compact(&mut self) {
        if self.pos > 0 {
            self.buf.drain(..self.pos);
            self.dropped = self.dropped.wrapping_add(self.pos as u64);
            self.pos = 0;
        }
    }

    fn error(&self, at: usize, message: impl Into<String>) -> StreamError {
        StreamError {
            offset: self.dropped.wrapping_add(at as u64),
            message: message.into(),
            kind: StreamErrorKind::Malformed,
        }
    }

    /// Moves through the buffered bytes as far as they go.
    fn drain<S: EventSink>(&mut self, sink: &mut S, eof: bool) -> Result<(), StreamError> {
        loop {
            while self.pos < self.buf.len() && self.buf[self.pos].is_ascii_whitespace() {
                self.pos += 1;
            }
            if self.pos == self.buf.len() {
                return Ok(());
            }
            match self.step(sink, eof)? {
                Progress::Moved => {}
                Progress::NeedMore => {
                    self.waits += 1;
                    // Ask for at least as much again as is buffered: linear work for a long
                    // value.
                    self.want = (self.buf.len() - self.pos).saturating_mul(2);
                    return Ok(());
                }
            }
        }
    }

    /// One move at `pos` (not whitespace).
    fn step<S: EventSink>(&mut self, sink: &mut S, eof: bool) -> Result<Progress, StreamError> {
        let byte = self.buf[self.pos];
        let expect = |what: &str| {
            self.error(
                self.pos,
                format!("expected {what}, found {:?}", char::from(byte)),
            )
        };
        let next = match (self.state, byte) {
            (State::Start, b'{') => State::Key { first: true },
            (State::Start, b'[') => {
                self.meta.has_events = true;
                self.meta.version += 1;
                State::FirstEvent { bare: true }
            }
            (State::Start, _) => return Err(expect("a trace object or an event array")),
            (State::Key { first: true }, b'}') => State::Done,
            (State::Key { .. }, b'"') => {
                let Some((key, len)) = self.value::<std::borrow::Cow<'_, str>>(eof)? else {
                    return Ok(Progress::NeedMore);
                };
                let key = match key.as_ref() {
                    "traceEvents" => Key::Events,
                    "distributedInfo" => Key::Distributed,
                    "deviceProperties" => Key::Devices,
                    "stepscope" => Key::Stepscope,
                    "baseTimeNanoseconds" => Key::BaseTime,
                    _ => Key::Other,
                };
                self.pos += len;
                self.state = State::Colon(key);
                return Ok(Progress::Moved);
            }
            (State::Key { .. }, _) => return Err(expect("a key")),
            (State::Colon(key), b':') => State::Value(key),
            (State::Colon(_), _) => return Err(expect("':'")),
            (State::Value(Key::Events), b'[') => {
                self.meta.has_events = true;
                self.meta.version += 1;
                State::FirstEvent { bare: false }
            }
            (State::Value(Key::Events), _) => return Err(expect("the traceEvents array")),
            (State::Value(key), _) => {
                let Some((raw, len)) = self.value::<&RawValue>(eof)? else {
                    return Ok(Progress::NeedMore);
                };
                // A malformed header value is ignored, as a reader of the events would.
                let text = raw.get();
                match key {
                    Key::Distributed => {
                        if let Ok(info) = serde_json::from_str::<DistributedInfo>(text) {
                            self.meta.rank = info.rank;
                            self.meta.world_size = info.world_size;
                        }
                    }
                    Key::Devices => {
                        self.meta.devices =
                            serde_json::from_str::<Vec<DeviceProperties>>(text).unwrap_or_default();
                    }
                    Key::Stepscope => {
                        // Kineto writes metadata values as strings of JSON.
                        self.meta.stepscope = serde_json::from_str::<TraceHeader>(text)
                            .or_else(|e| match serde_json::from_str::<String>(text) {
                                Ok(inner) => serde_json::from_str(&inner),
                                Err(_) => Err(e),
                            })
                            .unwrap_or_default();
                    }
                    Key::BaseTime => {
                        self.meta.base_time_ns = text.trim().trim_matches('"').parse().ok()
                    }
                    Key::Events | Key::Other => {}
                }
                self.meta.version += 1;
                self.pos += len;
                self.state = State::AfterValue;
                return Ok(Progress::Moved);
            }
            (State::AfterValue, b',') => State::Key { first: false },
            (State::AfterValue, b'}') => State::Done,
            (State::AfterValue, _) => return Err(expect("',' or '}'")),
            (State::FirstEvent { bare } | State::AfterEvent { bare }, b']') => {
                if bare {
                    State::Done
                } else {
                    State::AfterValue
                }
            }
            (State::FirstEvent { bare }, _) => {
                self.state = State::Event { bare };
                return Ok(Progress::Moved);
            }
            (State::Event { bare }, _) => {
                let start = self.pos;
                let mut scanner = Scanner::new(&self.buf[start..]);
                match S::Event::scan(&mut scanner) {
                    Ok(event) => {
                        let len = scanner.pos();
                        sink.event(event, &self.meta);
                        self.events += 1;
                        self.pos = start + len;
                        // The `, ` Kineto writes before the next event taken here, as the
                        // moves after an event would take it, not in two more of them.
                        self.state = match self.buf.get(self.pos..self.pos + 2) {
                            Some(b", ") => {
                                self.pos += 2;
                                State::Event { bare }
                            }
                            _ => State::AfterEvent { bare },
                        };
                        return Ok(Progress::Moved);
                    }
                    Err(Fault::Cut) if !eof => return Ok(Progress::NeedMore),
                    Err(Fault::Cut) => {
                        return Err(self.error(
                            self.buf.len(),
                            format!(
                                "event {}: the JSON ends inside it (truncated trace)",
                                self.events + 1
                            ),
                        ))
                    }
                    Err(Fault::Bad(bad)) => {
                        let message = format!("event {}: {}", self.events + 1, bad.message);
                        return Err(self.error(start + bad.at, message));
                    }
                }
            }
            (State::AfterEvent { bare }, b',') => State::Event { bare },
            (State::AfterEvent { .. }, _) => return Err(expect("',' or ']'")),
            (State::Done, _) => return Err(expect("the end of the document")),
        };
        self.pos += 1;
        self.state = next;
        Ok(Progress::Moved)
    }

    /// Parses one value of type `T` at `pos`: the value and its length, `None` when the bytes
    /// buffered end inside it.
    fn value<'a, T: Deserialize<'a>>(
        &'a self,
        eof: bool,
    ) -> Result<Option<(T, usize)>, StreamError> {
        let buf = &self.buf[self.pos..];
        let mut it = serde_json::Deserializer::from_slice(buf).into_iter::<T>();
        match it.next() {
            Some(Ok(v)) => {
                let len = it.byte_offset();
                if len == buf.len() && !eof {
                    Ok(None)
                } else {
                    Ok(Some((v, len)))
                }
            }
            Some(Err(e)) if !eof && cut_short(&e, buf) => Ok(None),
            Some(Err(e)) => Err(self.error(self.pos, e.to_string())),
            None => Ok(None),
        }
    }
}

/// Whether a parse error comes from the bytes ending (more may follow), not from what they
/// hold: end of input, or an error at the last bytes (a number cut after its `e` or `.`).
fn cut_short(e: &serde_json::Error, parsed: &[u8]) -> bool {
    if e.is_eof() {
        return true;
    }
    // The error's line and column (1-based, in bytes) as an offset into `parsed`.
    let line_start = match e.line() {
        0 | 1 => 0,
        line => match parsed
            .iter()
            .enumerate()
            .filter(|(_, b)| **b == b'\n')
            .nth(line - 2)
        {
            Some((i, _)) => i + 1,
            None => return false,
        },
    };
    line_start + e.column() + 1 >= parsed.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::Skip;

    struct Names(Vec<String>);
    impl EventSink for Names {
        type Event<'de> = super::super::Event<'de>;
        fn event(&mut self, e: Self::Event<'_>, _: &Meta) {
            self.0.push(e.name.unwrap_or_default().into_owned());
        }
    }

    struct Count(u64);
    impl EventSink for Count {
        type Event<'de> = Skip;
        fn event(&mut self, _: Skip, _: &Meta) {
            self.0 += 1;
        }
    }

    /// Feeds `doc` in pieces of `n` bytes.
    fn feed_by<S: EventSink>(doc: &[u8], n: usize, sink: &mut S) -> Result<Meta, StreamError> {
        let mut s = EventStream::new();
        for piece in doc.chunks(n.max(1)) {
            s.feed(piece, sink)?;
        }
        s.finish(sink)
    }

    const DOC: &[u8] = br#"{"schemaVersion": 1, "traceEvents": [{"name": "a", "ph": "X", "args": {"x": [1, {"y": "}]"}]}}, {"name": "b\"q", "ts": 12.5}, {"name": "\u00e9"}], "distributedInfo": {"rank": 3, "world_size": 8}, "stepscope": {"steps": [{"step": 4, "requests": ["r1"]}]}, "x": [1, 2.5e3, null, true]}"#;

    #[test]
    fn every_split_of_the_input_gives_the_same_events_and_metadata() {
        for n in 1..DOC.len() + 1 {
            let mut names = Names(Vec::new());
            let meta = feed_by(DOC, n, &mut names).unwrap_or_else(|e| panic!("split {n}: {e}"));
            assert_eq!(names.0, ["a", "b\"q", "é"], "split {n}");
            assert_eq!(
                (meta.rank, meta.world_size),
                (Some(3), Some(8)),
                "split {n}"
            );
            assert_eq!(meta.stepscope.steps[0].requests, ["r1"], "split {n}");
        }
        let mut names = Names(Vec::new());
        let meta = EventStream::new().read_all(DOC, &mut names).unwrap();
        assert_eq!(names.0.len(), 3);
        assert_eq!(meta.rank, Some(3));
    }

    /// Feeds `doc` in chunks of `n` bytes handed over whole, each after its room; the buffers
    /// handed back are reused, as a gunzip thread reuses them.
    fn feed_chunks_by<S: EventSink>(
        doc: &[u8],
        n: usize,
        sink: &mut S,
    ) -> Result<Meta, StreamError> {
        let mut s = EventStream::new();
        let mut spare: Vec<Vec<u8>> = Vec::new();
        for piece in doc.chunks(n.max(1)) {
            let mut chunk = spare.pop().unwrap_or_default();
            // Whatever the room held before: the stream writes what it needs there.
            chunk.resize(CHUNK_HEADROOM, 0xAA);
            chunk.truncate(CHUNK_HEADROOM);
            chunk.extend_from_slice(piece);
            spare.push(s.feed_chunk(chunk, sink)?);
        }
        // A chunk of room alone holds nothing.
        spare.push(s.feed_chunk(vec![b'x'; CHUNK_HEADROOM], sink)?);
        s.finish(sink)
    }

    #[test]
    fn chunks_read_where_they_lie_give_what_copied_bytes_give() {
        for n in 1..DOC.len() + 1 {
            let mut names = Names(Vec::new());
            let meta =
                feed_chunks_by(DOC, n, &mut names).unwrap_or_else(|e| panic!("split {n}: {e}"));
            assert_eq!(names.0, ["a", "b\"q", "é"], "split {n}");
            assert_eq!((meta.rank, meta.world_size), (Some(3), Some(8)));
        }
        // An event longer than the room, cut across many chunks: copied until whole, in
        // linear work, then chunks are read in place again.
        let long = format!(
            "{{\"traceEvents\": [{{\"name\": \"{}\"}}, {{\"name\": \"after\"}}]}}",
            "x".repeat(CHUNK_HEADROOM * 3)
        );
        let mut names = Names(Vec::new());
        feed_chunks_by(long.as_bytes(), 1000, &mut names).unwrap();
        assert_eq!(names.0.len(), 2);
        assert_eq!(names.0[0].len(), CHUNK_HEADROOM * 3);
        assert_eq!(names.0[1], "after");
        // A document that is no trace is at fault from its first byte, however it was fed.
        for n in [1, 3, 100] {
            let e = feed_chunks_by(br#"{"a": 1, "b": [2]}"#, n, &mut Count(0)).unwrap_err();
            assert_eq!(
                (e.kind, e.offset),
                (StreamErrorKind::NotATrace, 0),
                "split {n}"
            );
        }
        // Offsets in errors are the document's, whatever the room before them.
        let bad = b"{\"traceEvents\": [{}, {\"a\" 1}]}";
        for n in 1..bad.len() {
            let e = feed_chunks_by(bad, n, &mut Count(0)).unwrap_err();
            assert_eq!(e.offset, 26, "split {n}: {e}");
        }
    }

    #[test]
    fn bare_arrays_and_empty_documents() {
        let mut c = Count(0);
        feed_by(b" [ {\"ph\": \"X\"} , {\"ph\": \"M\"} ] \n", 3, &mut c).unwrap();
        assert_eq!(c.0, 2);
        let mut c = Count(0);
        feed_by(b"{\"traceEvents\": []}", 2, &mut c).unwrap();
        assert_eq!(c.0, 0);
        // Kineto writes the stepscope header as a string of JSON.
        let doc = br#"{"traceEvents": [], "stepscope": "{\"steps\": [{\"step\": 2, \"requests\": [\"a\"]}]}"}"#;
        let meta = feed_by(doc, 5, &mut Count(0)).unwrap();
        assert_eq!(meta.stepscope.steps[0].step, 2);
        assert_eq!(meta.stepscope.steps[0].requests, ["a"]);
    }

    #[test]
    fn malformed_documents_say_what_and_where() {
        let err = |doc: &[u8]| {
            feed_by(doc, 7, &mut Count(0))
                .expect_err("malformed")
                .to_string()
        };
        assert!(err(b"{\"schemaVersion\": 1}").contains("traceEvents"));
        assert!(err(b"{\"traceEvents\": [{\"a\": 1}").contains("ends early"));
        assert!(err(b"{\"traceEvents\": [{\"a\": 1}] x").contains("expected ',' or '}'"));
        assert!(err(b"{\"traceEvents\": [{\"a\": }]}").contains("event 1"));
        assert!(err(b"\"trace\"").contains("a trace object"));
        assert!(err(b"{\"traceEvents\": []} {}").contains("end of the document"));
        // The offset is the byte at fault: the `1` where the `:` should be.
        let e = feed_by(b"{\"traceEvents\": [{}, {\"a\" 1}]}", 4, &mut Count(0)).unwrap_err();
        assert_eq!(e.offset, 26, "{e}");
    }

    #[test]
    fn a_long_event_is_read_in_linear_work() {
        // One 4 MB event fed 1 KB at a time: each wait asks for twice what is buffered, so the
        // event is parsed about log2(4 MB / 1 KB) times, not 4,000 times.
        let long = format!(
            "{{\"traceEvents\": [{{\"name\": \"{}\"}}]}}",
            "x".repeat(4 << 20)
        );
        let mut s = EventStream::new();
        let mut names = Names(Vec::new());
        for piece in long.as_bytes().chunks(1024) {
            s.feed(piece, &mut names).unwrap();
        }
        assert!(s.waits < 32, "{} waits", s.waits);
        s.finish(&mut names).unwrap();
        assert_eq!(names.0[0].len(), 4 << 20);
    }
}
