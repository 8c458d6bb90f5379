//! Scanning a trace on one thread for a sink on another: [`ScanAhead`] reads each chunk's
//! events as [`EventStream`] does and hands them over as [`Scanned`], the chunk's bytes with
//! each event's fields as places in them, which [`Scanned::replay`] turns back into the
//! [`Event`]s the sink would have been given, in the same order and with the same [`Meta`].
//!
//! Why: reading a trace is a pipeline of gunzip, scanning and the sink's work. With scanning
//! and the sink on one thread, that thread is the whole critical path on a machine of two
//! cores while the gunzip thread waits (HTA's rank-1 trace: gunzip 18% of the CPU, scanning
//! 26%, the summarizer 15%, `perf`); three stages let the cores share the work.
//!
//! An event's strings are kept as ranges of the chunk they were scanned from while that chunk
//! stays whole: a chunk read in place ([`EventStream::feed_chunk`]) is kept, unchanged, until
//! the next chunk replaces it, and then handed over with the events read from it. Where the
//! stream copies instead (an event cut at a chunk's end that is longer than the next chunk's
//! room, or a chunk shorter than what the cut event waits for), or the scanner unescaped a
//! string, the event's text is copied: the bytes it borrows from are about to change.

use std::borrow::Cow;

use super::event::{ArgsAt, Event, Id, Meta, RawArgs};
use super::stream::{EventSink, EventStream, StreamError};
use super::CHUNK_HEADROOM;

/// Bytes an event borrowed: a range of the chunk handed over with it, or a copy.
#[derive(Debug)]
enum Span {
    At(usize, usize),
    Owned(Box<[u8]>),
}

/// An event's id as scanned.
#[derive(Debug)]
enum SpanId {
    Num(i64),
    Str(Span),
}

/// One [`Event`], its borrowed fields as [`Span`]s.
#[derive(Debug)]
struct Spanned {
    ph: Option<Span>,
    cat: Option<Span>,
    name: Option<Span>,
    pid: Option<SpanId>,
    tid: Option<SpanId>,
    ts: Option<f64>,
    ts_split: Option<(i64, f64)>,
    dur: Option<f64>,
    raw_args: Option<Span>,
    /// Where the scanner found the fields of `raw_args` (offsets within them).
    args_at: ArgsAt,
}

/// Events scanned, in order, with the bytes they lie in (one chunk's); see the module docs.
/// Those of two chunks where the stream copied the second: then the events are copies, and
/// the bytes only a buffer given back for reuse.
#[derive(Debug)]
pub struct Scanned {
    bytes: Vec<u8>,
    batch: Batch,
}

impl Scanned {
    /// Hands each event to `sink` as [`EventStream`] would have, with the metadata it was read
    /// under (`meta`: that of the last [`Scanned`] replayed; [`Meta::default`] before the
    /// first).
    pub fn replay<S>(&self, sink: &mut S, meta: &mut Meta)
    where
        S: for<'de> EventSink<Event<'de> = Event<'de>>,
    {
        let mut metas = self.batch.metas.iter().peekable();
        for (i, e) in self.batch.events.iter().enumerate() {
            while let Some((_, m)) = metas.next_if(|(at, _)| *at == i) {
                *meta = (**m).clone();
            }
            sink.event(self.event(e), meta);
        }
        for (_, m) in metas {
            *meta = (**m).clone();
        }
    }

    /// The bytes, for the next chunk to be read into.
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    /// Bytes held (the chunk's length).
    pub fn byte_len(&self) -> usize {
        self.bytes.len()
    }

    fn bytes<'a>(&'a self, span: &'a Span) -> &'a [u8] {
        match span {
            // In range by construction (`Batcher::span`); empty if it were not.
            Span::At(at, len) => self.bytes.get(*at..at + len).unwrap_or_default(),
            Span::Owned(b) => b,
        }
    }

    #[inline(always)]
    fn str<'a>(&'a self, span: &'a Span) -> Cow<'a, str> {
        // The bytes were a `str` when scanned (checked as UTF-8 there) and are unchanged; they
        // are checked again here, so that this stays safe whatever a change elsewhere does.
        // Most are short and ASCII: the inlined ASCII check costs a few instructions, where
        // the call to `from_utf8` was the largest item of the sink's thread, the pipeline's
        // slowest (6% of `analyze`'s CPU on HTA's 35 MB trace in `perf`; 3% after).
        let bytes = self.bytes(span);
        if bytes.is_ascii() {
            // SAFETY: every byte was just found below 0x80; ASCII is UTF-8.
            return Cow::Borrowed(unsafe { std::str::from_utf8_unchecked(bytes) });
        }
        Cow::Borrowed(std::str::from_utf8(bytes).unwrap_or_default())
    }

    fn text<'a>(&'a self, span: &'a Option<Span>) -> Option<Cow<'a, str>> {
        Some(self.str(span.as_ref()?))
    }

    fn id<'a>(&'a self, id: &'a Option<SpanId>) -> Option<Id<'a>> {
        Some(match id.as_ref()? {
            SpanId::Num(n) => Id::Num(*n),
            SpanId::Str(s) => Id::Str(self.str(s)),
        })
    }

    fn event<'a>(&'a self, e: &'a Spanned) -> Event<'a> {
        Event {
            ph: self.text(&e.ph),
            cat: self.text(&e.cat),
            name: self.text(&e.name),
            pid: self.id(&e.pid),
            tid: self.id(&e.tid),
            ts: e.ts,
            ts_split: e.ts_split,
            dur: e.dur,
            raw_args: e.raw_args.as_ref().map(|s| RawArgs {
                bytes: self.bytes(s),
                at: e.args_at,
            }),
        }
    }
}

/// The sink [`ScanAhead`] gives its stream: each event as a [`Spanned`], its borrowed bytes
/// as ranges of the chunk at `base..base + len` when they lie there, else copied.
struct Batcher<'x> {
    base: usize,
    len: usize,
    out: &'x mut Batch,
    version: &'x mut u64,
}

/// Events scanned and the metadata they were read under, as [`Scanned`] holds them.
#[derive(Debug, Default)]
struct Batch {
    events: Vec<Spanned>,
    /// The metadata the events from each index on were read under (a top-level key read
    /// between two events), in order.
    metas: Vec<(usize, Box<Meta>)>,
}

impl Batch {
    fn append(&mut self, mut other: Batch) {
        let at = self.events.len();
        self.metas
            .extend(other.metas.drain(..).map(|(i, m)| (at + i, m)));
        self.events.append(&mut other.events);
    }
}

impl Batcher<'_> {
    fn span(&self, bytes: &[u8]) -> Span {
        let at = (bytes.as_ptr() as usize).wrapping_sub(self.base);
        if at <= self.len && bytes.len() <= self.len - at {
            Span::At(at, bytes.len())
        } else {
            Span::Owned(bytes.into())
        }
    }

    fn text(&self, s: Option<Cow<'_, str>>) -> Option<Span> {
        Some(match s? {
            Cow::Borrowed(s) => self.span(s.as_bytes()),
            Cow::Owned(s) => Span::Owned(s.into_bytes().into_boxed_slice()),
        })
    }

    fn id(&self, id: Option<Id<'_>>) -> Option<SpanId> {
        Some(match id? {
            Id::Num(n) => SpanId::Num(n),
            Id::Str(s) => SpanId::Str(self.text(Some(s))?),
        })
    }
}

impl EventSink for Batcher<'_> {
    type Event<'de> = Event<'de>;

    fn event(&mut self, e: Event<'_>, meta: &Meta) {
        if meta.version != *self.version {
            *self.version = meta.version;
            let at = self.out.events.len();
            self.out.metas.push((at, Box::new(meta.clone())));
        }
        let spanned = Spanned {
            ph: self.text(e.ph),
            cat: self.text(e.cat),
            name: self.text(e.name),
            pid: self.id(e.pid),
            tid: self.id(e.tid),
            ts: e.ts,
            ts_split: e.ts_split,
            dur: e.dur,
            args_at: e.raw_args.map(|r| r.at).unwrap_or_default(),
            raw_args: e.raw_args.map(|r| self.span(r.bytes)),
        };
        self.out.events.push(spanned);
    }
}

/// An [`EventStream`] whose events are handed over as [`Scanned`] chunks; see the module
/// docs.
#[derive(Default)]
pub struct ScanAhead {
    stream: EventStream,
    /// The events read from the chunk the stream holds now, not yet handed over.
    pending: Batch,
    /// The metadata's version the last event was read under.
    version: u64,
}

impl ScanAhead {
    /// A reader at the start of a document.
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads the next chunk (its bytes from [`CHUNK_HEADROOM`] on are the document's, as
    /// [`EventStream::feed_chunk`] takes them). Returns the events of the chunk before it with
    /// that chunk's bytes; where the stream copies this chunk, those events and this chunk's
    /// too, all as copies, with a buffer done with. After an error the document is at fault and
    /// the reader done: what it was holding is let go, and what it is fed after gives nothing
    /// of it.
    pub fn feed_chunk(&mut self, chunk: Vec<u8>) -> Result<Scanned, StreamError> {
        let read = self.read_chunk(chunk);
        if read.is_err() {
            // The pending events' bytes went with the stream's buffer.
            self.pending = Batch::default();
        }
        read
    }

    fn read_chunk(&mut self, chunk: Vec<u8>) -> Result<Scanned, StreamError> {
        let bytes = chunk.len().saturating_sub(CHUNK_HEADROOM);
        if bytes == 0 {
            return Ok(Scanned {
                bytes: chunk,
                batch: Batch::default(),
            });
        }
        let mut items = Batch::default();
        if self.stream.reads_in_place(bytes) {
            // The chunk becomes the stream's buffer; the one it replaces, the pending events'.
            let (base, len) = (chunk.as_ptr() as usize, chunk.len());
            let spent = self.stream.feed_chunk(
                chunk,
                &mut Batcher {
                    base,
                    len,
                    out: &mut items,
                    version: &mut self.version,
                },
            )?;
            return Ok(Scanned {
                bytes: spent,
                batch: std::mem::replace(&mut self.pending, items),
            });
        }
        // The stream copies the chunk into its buffer, which it then changes in place: the
        // events pending in it, and those read now, are copied out.
        let mut pending = std::mem::take(&mut self.pending);
        own(&mut pending.events, self.stream.buffered());
        let spent = self.stream.feed_chunk(
            chunk,
            &mut Batcher {
                base: 0,
                len: 0,
                out: &mut items,
                version: &mut self.version,
            },
        )?;
        pending.append(items);
        Ok(Scanned {
            bytes: spent,
            batch: pending,
        })
    }

    /// Ends the document (an error if it is incomplete): the last events, with the last
    /// chunk's bytes, and the top-level metadata.
    pub fn finish(mut self) -> Result<(Scanned, Meta), StreamError> {
        let mut items = std::mem::take(&mut self.pending);
        let (base, len) = {
            let b = self.stream.buffered();
            (b.as_ptr() as usize, b.len())
        };
        // Draining at the end reads the buffer where it lies and leaves it unchanged.
        let (meta, bytes) = self.stream.finish_with_buffer(&mut Batcher {
            base,
            len,
            out: &mut items,
            version: &mut self.version,
        })?;
        Ok((
            Scanned {
                bytes,
                batch: items,
            },
            meta,
        ))
    }
}

/// Copies the bytes of `events`' ranges of `bytes` out.
fn own(events: &mut [Spanned], bytes: &[u8]) {
    let own = |span: &mut Span| {
        if let Span::At(at, len) = *span {
            *span = Span::Owned(bytes.get(at..at + len).unwrap_or_default().into());
        }
    };
    for e in events {
        for span in [&mut e.ph, &mut e.cat, &mut e.name, &mut e.raw_args]
            .into_iter()
            .flatten()
        {
            own(span);
        }
        for id in [&mut e.pid, &mut e.tid].into_iter().flatten() {
            if let SpanId::Str(span) = id {
                own(span);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a sink is given: each event, owned, with the metadata it came with.
    #[derive(Default)]
    struct Record(Vec<String>);

    impl EventSink for Record {
        type Event<'de> = Event<'de>;
        fn event(&mut self, e: Event<'_>, meta: &Meta) {
            let args = e.raw_args.and_then(|r| r.text()).map(str::to_owned);
            self.0.push(format!(
                "{:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {args:?} | rank {:?} of {:?}, {} devices, steps {}, base {:?}",
                e.ph, e.cat, e.name, e.pid, e.tid, e.ts, e.ts_split, e.dur,
                meta.rank, meta.world_size, meta.devices.len(), meta.stepscope.steps.len(),
                meta.base_time_ns,
            ));
        }
    }

    /// A chunk of `piece` after room holding whatever a reused buffer held.
    fn chunk(mut buf: Vec<u8>, piece: &[u8]) -> Vec<u8> {
        buf.resize(CHUNK_HEADROOM, 0xAA);
        buf.truncate(CHUNK_HEADROOM);
        buf.extend_from_slice(piece);
        buf
    }

    /// `doc` in chunks of `n` bytes read by [`EventStream`] on this thread.
    fn at_once(doc: &[u8], n: usize) -> Result<(Vec<String>, Meta), StreamError> {
        let mut s = EventStream::new();
        let mut sink = Record::default();
        for piece in doc.chunks(n) {
            s.feed_chunk(chunk(Vec::new(), piece), &mut sink)?;
        }
        let meta = s.finish(&mut sink)?;
        Ok((sink.0, meta))
    }

    /// The same through [`ScanAhead`], each buffer handed back reused for a later chunk (as
    /// the gunzip thread reuses them), and each [`Scanned`] replayed only after the next
    /// chunk is read (as the sink's thread lags behind the scanner's).
    fn ahead(doc: &[u8], n: usize) -> Result<(Vec<String>, Meta), StreamError> {
        let mut a = ScanAhead::new();
        let mut sink = Record::default();
        let mut meta = Meta::default();
        let mut spare: Vec<Vec<u8>> = Vec::new();
        let mut lagging: Option<Scanned> = None;
        for piece in doc.chunks(n) {
            let scanned = a.feed_chunk(chunk(spare.pop().unwrap_or_default(), piece))?;
            if let Some(s) = lagging.replace(scanned) {
                s.replay(&mut sink, &mut meta);
                spare.push(s.into_bytes());
            }
        }
        let (last, end) = a.finish()?;
        for s in lagging.into_iter().chain([last]) {
            s.replay(&mut sink, &mut meta);
        }
        Ok((sink.0, end))
    }

    fn docs() -> Vec<Vec<u8>> {
        let long = "x".repeat(CHUNK_HEADROOM + 100);
        vec![
            // Metadata before the events and after them; escapes in names and ids; string and
            // number ids; args of every shape.
            br#"{"distributedInfo": {"rank": 3, "world_size": 8}, "traceEvents": [{"name": "a", "ph": "X", "cat": "kernel", "pid": 0, "tid": "stream \"7\"", "ts": 1712195495505582.988, "dur": 4.5, "args": {"x": [1, {"y": "}]"}], "correlation": 9}}, {"name": "b\"q", "ts": 12.5}, {"name": "\u00e9", "pid": "p", "tid": 2}], "deviceProperties": [{"id": 0}], "stepscope": {"steps": [{"step": 4, "requests": ["r1"]}]}, "baseTimeNanoseconds": 17}"#.to_vec(),
            br#" [ {"ph": "X", "name": "n1"} , {"ph": "M", "args": {}} ] "#.to_vec(),
            // Metadata between events: a second event array after another key (the stream
            // reads each), so the rank changes in the middle of what one chunk holds.
            br#"{"traceEvents": [{"name": "a", "tid": 1}, {"name": "b"}], "distributedInfo": {"rank": 2}, "baseTimeNanoseconds": 9, "traceEvents": [{"name": "c", "pid": "p1"}, {"name": "d"}], "distributedInfo": {"rank": 5}, "traceEvents": [{"name": "e"}]}"#.to_vec(),
            br#"{"traceEvents": []}"#.to_vec(),
            // Names, categories and ids in UTF-8 beyond ASCII, unescaped: borrowed, and checked
            // as UTF-8 again where they are handed over.
            r#"{"traceEvents": [{"name": "é→x", "cat": "ü", "pid": "p→", "tid": "雪"}, {"name": "a"}]}"#
                .as_bytes()
                .to_vec(),
            // An event longer than a chunk's room: the stream copies it.
            format!(
                r#"{{"traceEvents": [{{"name": "first"}}, {{"name": "{long}", "args": {{"k": "{long}"}}}}, {{"name": "after", "tid": "t"}}], "baseTimeNanoseconds": 5}}"#
            )
            .into_bytes(),
        ]
    }

    #[test]
    fn events_scanned_ahead_are_those_the_stream_gives() {
        for doc in docs() {
            // Every size on the short ones; on the long one, sizes that cut it many ways.
            let mut sizes: Vec<usize> = if doc.len() < 1000 {
                (1..doc.len() + 1).collect()
            } else {
                vec![7, 100, 999, 4096, CHUNK_HEADROOM - 1, CHUNK_HEADROOM + 50]
            };
            sizes.extend([doc.len() / 3, doc.len() / 2, doc.len()]);
            for n in sizes.into_iter().filter(|&n| n > 0) {
                let (want, want_meta) = at_once(&doc, n).unwrap();
                let (got, got_meta) = ahead(&doc, n).unwrap();
                assert_eq!(got, want, "chunks of {n}");
                assert_eq!(
                    format!(
                        "{:?}",
                        (got_meta.rank, got_meta.devices, got_meta.base_time_ns)
                    ),
                    format!(
                        "{:?}",
                        (want_meta.rank, want_meta.devices, want_meta.base_time_ns)
                    ),
                );
                assert!(!want.is_empty() || doc.len() < 30);
            }
        }
        // The metadata each event came with: the rank read before the first, the devices
        // only once they were read; between arrays, the rank read between them.
        let (got, _) = ahead(&docs()[0], 7).unwrap();
        assert!(got[0].ends_with("rank Some(3) of Some(8), 0 devices, steps 0, base None"));
        for n in [1, 10, 1000] {
            let (got, _) = ahead(&docs()[2], n).unwrap();
            let ranks: Vec<&str> = got
                .iter()
                .map(|e| &e[e.find("| rank ").unwrap() + 7..e.find(" of ").unwrap()])
                .collect();
            assert_eq!(
                ranks,
                ["None", "None", "Some(2)", "Some(2)", "Some(5)"],
                "{n}"
            );
        }
    }

    #[test]
    fn after_a_fault_nothing_pending_is_kept() {
        let mut a = ScanAhead::new();
        let doc = br#"{"traceEvents": [{"name": "a"}, {"name": "b"}, {"x" 1}]}"#;
        a.feed_chunk(chunk(Vec::new(), &doc[..32])).unwrap();
        assert!(!a.pending.events.is_empty());
        assert!(a.feed_chunk(chunk(Vec::new(), &doc[32..])).is_err());
        assert!(a.pending.events.is_empty());
    }

    #[test]
    fn faults_are_those_the_stream_gives() {
        for doc in [
            &b"{\"traceEvents\": [{}, {\"a\" 1}]}"[..],
            b"{\"traceEvents\": [{\"a\": 1}",
            b"{\"schemaVersion\": 1}",
            b"{\"traceEvents\": []} {}",
        ] {
            for n in 1..doc.len() + 1 {
                let want = at_once(doc, n).unwrap_err();
                let got = ahead(doc, n).unwrap_err();
                assert_eq!(got, want, "chunks of {n}");
            }
        }
    }
}
