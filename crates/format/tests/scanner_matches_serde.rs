//! The scanner against serde_json (the reader it replaced) on every event of the real GPU
//! traces in cli/tests/data/hta: the same fields, the same `args`, event for event.

use std::borrow::Cow;
use std::io::Read;
use std::path::PathBuf;

use stepscope_format::trace::{Args, Event, EventSink, EventStream, Id, Meta, Serde};

#[path = "support/old_event.rs"]
mod old_event;
use old_event::OldEvent;

/// What both readers give: the fields, and the args as analysis reads them.
#[derive(Debug, Clone, PartialEq)]
struct Fields {
    ph: Option<String>,
    cat: Option<String>,
    name: Option<String>,
    pid: Option<Id<'static>>,
    tid: Option<Id<'static>>,
    ts: Option<f64>,
    dur: Option<f64>,
    args: Args,
}

fn s(c: Option<Cow<'_, str>>) -> Option<String> {
    c.map(Cow::into_owned)
}

fn id(i: Option<Id<'_>>) -> Option<Id<'static>> {
    i.map(|i| match i {
        Id::Num(n) => Id::Num(n),
        Id::Str(s) => Id::Str(Cow::Owned(s.into_owned())),
    })
}

struct Scanned(Vec<Fields>);
impl EventSink for Scanned {
    type Event<'de> = Event<'de>;
    fn event(&mut self, e: Event<'_>, _: &Meta) {
        let args = e.args();
        self.0.push(Fields {
            ph: s(e.ph),
            cat: s(e.cat),
            name: s(e.name),
            pid: id(e.pid),
            tid: id(e.tid),
            ts: e.ts,
            dur: e.dur,
            args,
        });
    }
}

struct ViaSerde(Vec<Fields>);
impl EventSink for ViaSerde {
    type Event<'de> = Serde<OldEvent<'de>>;
    fn event(&mut self, Serde(e): Serde<OldEvent<'_>>, _: &Meta) {
        self.0.push(Fields {
            args: e
                .raw_args
                .and_then(|r| serde_json::from_str(r.get()).ok())
                .unwrap_or_default(),
            ph: s(e.ph),
            cat: s(e.cat),
            name: s(e.name),
            pid: id(e.pid),
            tid: id(e.tid),
            ts: e.ts,
            dur: e.dur,
        });
    }
}

/// serde_json rounds some long decimals differently in the last place (it is not correctly
/// rounded without its `float_roundtrip` feature; the scanner is).
fn same_time(a: Option<f64>, b: Option<f64>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a == b || (a - b).abs() <= a.abs().max(b.abs()) * 4.0 * f64::EPSILON,
        (a, b) => a == b,
    }
}

#[test]
fn every_event_of_the_real_traces_reads_as_serde_reads_it() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../cli/tests/data/hta");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".json.gz"))
        .collect();
    files.sort();
    assert!(files.len() >= 5, "{files:?}");
    let mut total = 0;
    for path in files {
        let mut json = Vec::new();
        flate2::read::GzDecoder::new(std::fs::File::open(&path).unwrap())
            .read_to_end(&mut json)
            .unwrap();
        let mut scanned = Scanned(Vec::new());
        EventStream::new()
            .read_all(&json[..], &mut scanned)
            .unwrap();
        let mut serde = ViaSerde(Vec::new());
        EventStream::new().read_all(&json[..], &mut serde).unwrap();
        assert_eq!(scanned.0.len(), serde.0.len(), "{path:?}");
        assert!(!scanned.0.is_empty());
        for (i, (a, b)) in scanned.0.iter().zip(&serde.0).enumerate() {
            let times = same_time(a.ts, b.ts) && same_time(a.dur, b.dur);
            let rest = Fields {
                ts: None,
                dur: None,
                ..a.clone()
            } == Fields {
                ts: None,
                dur: None,
                ..b.clone()
            };
            assert!(times && rest, "{path:?} event {i}:\n{a:?}\n{b:?}");
        }
        // Some of these traces carry what the analysis reads from `args`.
        total += scanned
            .0
            .iter()
            .filter(|e| e.args.correlation.is_some())
            .count();
    }
    assert!(total > 10_000, "{total} events with a correlation id");
}
