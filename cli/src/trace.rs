//! Reading Kineto / Chrome traces: `.json` or `.json.gz`, streamed event by event.
//!
//! The file is decompressed into one buffer, then `traceEvents` is walked with a serde visitor
//! that hands each event to a callback as soon as it is parsed: no DOM of the whole trace is
//! built, and event strings borrow from the buffer. Memory is the decompressed file plus what
//! the callback keeps.

use std::borrow::Cow;
use std::fmt;
use std::io::Read;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

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

/// Reads a trace file into memory, gunzipping it when it starts with the gzip magic.
pub fn read(path: &Path) -> Result<Vec<u8>, TraceError> {
    let raw = std::fs::read(path).map_err(|e| err(path, format!("cannot read: {e}")))?;
    if raw.starts_with(&[0x1f, 0x8b]) {
        gunzip(&raw).map_err(|e| {
            err(
                path,
                format!("not a valid gzip file (truncated or corrupt): {e}"),
            )
        })
    } else {
        Ok(raw)
    }
}

/// Decompresses a gzip file. The trailer states the size (mod 4 GiB) of the last member, so
/// a single-member file (what torch writes) is inflated in one call into an exact buffer with
/// libdeflate; anything else (several members, a size that does not fit) is streamed.
fn gunzip(raw: &[u8]) -> Result<Vec<u8>, String> {
    if raw.len() >= 18 {
        let tail = &raw[raw.len() - 4..];
        let size = u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]) as usize;
        // A truncated file ends in arbitrary bytes: trust the size only within deflate's
        // maximum ratio (about 1032:1).
        if size <= raw.len().saturating_mul(1032) {
            let mut out = vec![0u8; size];
            let mut d = libdeflater::Decompressor::new();
            if let Ok(n) = d.gzip_decompress(raw, &mut out) {
                if n == size {
                    return Ok(out);
                }
            }
        }
    }
    let mut out = Vec::with_capacity(raw.len().saturating_mul(8));
    flate2::read::MultiGzDecoder::new(raw)
        .read_to_end(&mut out)
        .map_err(|e| e.to_string())?;
    Ok(out)
}

/// Whether a path looks like a trace file.
pub fn is_trace_file(path: &Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    name.ends_with(".json") || name.ends_with(".json.gz")
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

/// An id that traces write as a number or a string (pid, tid).
#[derive(Debug, Clone, PartialEq)]
pub enum Id<'a> {
    /// A number.
    Num(i64),
    /// A string.
    Str(Cow<'a, str>),
}

impl<'de: 'a, 'a> Deserialize<'de> for Id<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Id<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number or a string")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Id<'a>, E> {
                Ok(Id::Num(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Id<'a>, E> {
                Ok(Id::Num(v as i64))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Id<'a>, E> {
                Ok(Id::Num(v as i64))
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Id<'a>, E> {
                Ok(Id::Str(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Id<'a>, E> {
                Ok(Id::Str(Cow::Owned(v.to_string())))
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}

/// The `args` fields analysis reads; all others are skipped unparsed.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Args {
    /// Links a launch (cuda_runtime) to its kernel, memcpy or memset.
    #[serde(default)]
    pub correlation: Option<u64>,
    /// The GPU of a device event.
    #[serde(default)]
    pub device: Option<u64>,
    /// A RecordFunction's handle: stepscope sets it to the step index of its iteration
    /// annotations (0 elsewhere).
    #[serde(default, rename = "Record function id")]
    pub record_function_id: Option<u64>,
    /// The ids of the requests an iteration served (stepscope's `request_ids`; Kineto writes
    /// them when the capture records shapes).
    #[serde(default)]
    pub requests: Option<Vec<String>>,
}

/// One trace event, with the fields analysis reads.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Event<'a> {
    /// Phase: `X` complete, `M` metadata, `s`/`f` flow, `i` instant, …
    #[serde(default, borrow)]
    pub ph: Option<Cow<'a, str>>,
    /// Category: `kernel`, `gpu_memcpy`, `gpu_memset`, `cuda_runtime`, `cpu_op`, …
    #[serde(default, borrow)]
    pub cat: Option<Cow<'a, str>>,
    /// Name.
    #[serde(default, borrow)]
    pub name: Option<Cow<'a, str>>,
    /// Process.
    #[serde(default, borrow)]
    pub pid: Option<Id<'a>>,
    /// Start, µs.
    #[serde(default)]
    pub ts: Option<f64>,
    /// Duration, µs.
    #[serde(default)]
    pub dur: Option<f64>,
    /// Arguments, unparsed: most events' `args` are never read, so they are only skipped
    /// over; [`Event::args`] parses them on demand.
    #[serde(default, borrow, rename = "args")]
    pub raw_args: Option<&'a serde_json::value::RawValue>,
}

impl<'a> Event<'a> {
    /// The arguments analysis reads (default when absent or malformed).
    pub fn args(&self) -> Args {
        self.raw_args
            .and_then(|r| serde_json::from_str(r.get()).ok())
            .unwrap_or_default()
    }
}

/// The trace-level metadata analysis reads.
#[derive(Debug, Clone, Default)]
pub struct Meta {
    /// `distributedInfo.rank`.
    pub rank: Option<i64>,
    /// `distributedInfo.world_size`.
    pub world_size: Option<i64>,
    /// `deviceProperties`.
    pub devices: Vec<DeviceProperties>,
    /// stepscope's header (`stepscope`): the captured steps' requests and the trigger.
    pub stepscope: StepscopeHeader,
    /// Whether a `traceEvents` array was found.
    pub has_events: bool,
}

/// The parts of stepscope's trace header (`"stepscope": {...}`) analysis reads.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StepscopeHeader {
    /// Each captured iteration's requests (`request_ids`).
    #[serde(default)]
    pub steps: Vec<HeaderStep>,
    /// What started the capture (`{"slow_step": {"step", "duration_ns", …}}`).
    #[serde(default)]
    pub trigger: Option<serde_json::Value>,
}

/// One entry of the header's `steps`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct HeaderStep {
    /// The step index.
    pub step: u64,
    /// The requests it served.
    #[serde(default)]
    pub requests: Vec<String>,
}

/// One entry of `deviceProperties`.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize, PartialEq)]
pub struct DeviceProperties {
    /// Device index.
    #[serde(default)]
    pub id: Option<i64>,
    /// E.g. "NVIDIA A100-SXM4-80GB".
    #[serde(default)]
    pub name: Option<String>,
    /// Bytes.
    #[serde(default, rename = "totalGlobalMem")]
    pub total_global_mem: Option<u64>,
    /// Compute capability, major.
    #[serde(default, rename = "computeMajor")]
    pub compute_major: Option<i64>,
    /// Compute capability, minor.
    #[serde(default, rename = "computeMinor")]
    pub compute_minor: Option<i64>,
    /// Streaming multiprocessors.
    #[serde(default, rename = "numSms")]
    pub num_sms: Option<i64>,
}

#[derive(Deserialize, Default)]
struct DistributedInfo {
    #[serde(default)]
    rank: Option<i64>,
    #[serde(default)]
    world_size: Option<i64>,
}

/// Walks `bytes` (a Chrome trace: an object with `traceEvents`, or a bare event array), calling
/// `on_event` for each event as it is parsed.
pub fn for_each_event<'de, T, F>(
    path: &Path,
    bytes: &'de [u8],
    on_event: F,
) -> Result<Meta, TraceError>
where
    T: Deserialize<'de>,
    F: FnMut(T),
{
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let mut meta = Meta::default();
    let seed = TopLevel {
        on_event,
        meta: &mut meta,
        _t: PhantomData,
    };
    seed.deserialize(&mut de)
        .and_then(|()| de.end())
        .map_err(|e| err(path, format!("not valid trace JSON: {e}")))?;
    if !meta.has_events {
        return Err(err(
            path,
            "JSON without a \"traceEvents\" array: not a Kineto/Chrome trace",
        ));
    }
    Ok(meta)
}

struct TopLevel<'m, T, F> {
    on_event: F,
    meta: &'m mut Meta,
    _t: PhantomData<T>,
}

impl<'de, 'm, T: Deserialize<'de>, F: FnMut(T)> DeserializeSeed<'de> for TopLevel<'m, T, F> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, 'm, T: Deserialize<'de>, F: FnMut(T)> Visitor<'de> for TopLevel<'m, T, F> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a trace object with traceEvents, or an array of events")
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            match key.as_ref() {
                "traceEvents" => {
                    self.meta.has_events = true;
                    map.next_value_seed(Events {
                        on_event: &mut self.on_event,
                        _t: PhantomData,
                    })?;
                }
                "distributedInfo" => {
                    let info: Option<DistributedInfo> = map.next_value().unwrap_or_default();
                    if let Some(info) = info {
                        self.meta.rank = info.rank;
                        self.meta.world_size = info.world_size;
                    }
                }
                "deviceProperties" => {
                    self.meta.devices = map.next_value().unwrap_or_default();
                }
                "stepscope" => {
                    let header: Option<StepscopeHeader> = map.next_value().unwrap_or_default();
                    self.meta.stepscope = header.unwrap_or_default();
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, seq: A) -> Result<(), A::Error> {
        self.meta.has_events = true;
        Events {
            on_event: &mut self.on_event,
            _t: PhantomData,
        }
        .visit_seq(seq)
    }
}

struct Events<'f, T, F> {
    on_event: &'f mut F,
    _t: PhantomData<T>,
}

impl<'de, 'f, T: Deserialize<'de>, F: FnMut(T)> DeserializeSeed<'de> for Events<'f, T, F> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de, 'f, T: Deserialize<'de>, F: FnMut(T)> Visitor<'de> for Events<'f, T, F> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of trace events")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(event) = seq.next_element::<T>()? {
            (self.on_event)(event);
        }
        Ok(())
    }
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
    fn events_stream_from_an_object_or_an_array() {
        let p = Path::new("t.json");
        let mut names = Vec::new();
        let meta = for_each_event(
            p,
            br#"{"distributedInfo": {"rank": 3}, "traceEvents": [{"name": "a", "ph": "X"}, {"name": "b\"q"}], "x": [1]}"#,
            |e: Event<'_>| names.push(e.name.unwrap_or_default().into_owned()),
        )
        .unwrap();
        assert_eq!(names, ["a", "b\"q"]);
        assert_eq!(meta.rank, Some(3));
        let mut n = 0;
        for_each_event(p, br#"[{"ph": "X"}, {"ph": "M"}]"#, |_: Event<'_>| n += 1).unwrap();
        assert_eq!(n, 2);
        let e = for_each_event(p, br#"{"schemaVersion": 1}"#, |_: Event<'_>| ()).unwrap_err();
        assert!(e.message.contains("traceEvents"), "{e}");
        let e = for_each_event(p, b"{\"traceEvents\": [", |_: Event<'_>| ()).unwrap_err();
        assert!(e.message.contains("not valid trace JSON"), "{e}");
    }
}
