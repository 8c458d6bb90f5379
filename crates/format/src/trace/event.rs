//! The parts of a trace event and of a trace's top-level metadata that analysis reads; every
//! other field is skipped unparsed.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};

use super::header::TraceHeader;

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
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct Args {
    /// Links a launch (cuda_runtime) to its kernel, memcpy or memset.
    #[serde(default)]
    pub correlation: Option<u64>,
    /// The GPU of a device event.
    #[serde(default)]
    pub device: Option<u64>,
    /// The stream of a device event.
    #[serde(default)]
    pub stream: Option<u64>,
    /// A RecordFunction's handle: stepscope sets it to the step index of its iteration
    /// annotations (0 elsewhere).
    #[serde(default, rename = "Record function id")]
    pub record_function_id: Option<u64>,
    /// The ids of the requests an iteration served (stepscope's `request_ids`).
    #[serde(default)]
    pub requests: Option<Vec<String>>,
}

/// One trace event, with the fields analysis reads. The reader fills it with its scanner
/// (see [`FromTrace`](super::FromTrace)); serde reads it too, by the same rules.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
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
    /// Thread (or GPU stream).
    #[serde(default, borrow)]
    pub tid: Option<Id<'a>>,
    /// Start, µs.
    #[serde(default)]
    pub ts: Option<f64>,
    /// `ts` as written, split at its point into whole µs and a fraction, when the scanner read
    /// it (serde leaves it `None`): an f64 of an epoch time in µs keeps only 0.25 µs at
    /// 1.7e15, so a nanosecond trace's digits survive only in this form.
    #[serde(skip)]
    pub ts_split: Option<(i64, f64)>,
    /// Duration, µs.
    #[serde(default)]
    pub dur: Option<f64>,
    /// Arguments, unread: most events' `args` are never read, so they are only skipped over
    /// (their structure checked); [`Event::args`] reads them on demand.
    #[serde(default, borrow, rename = "args")]
    pub raw_args: Option<RawArgs<'a>>,
}

/// The keys of the fields [`Args`] holds, in the order of [`ArgsAt`]'s offsets and of the
/// duplicate check's bits.
pub(crate) const ARGS_KEYS: [&[u8]; 5] = [
    b"correlation",
    b"device",
    b"Record function id",
    b"requests",
    b"stream",
];

/// Where the values of the fields [`Args`] holds lie in an event's `args` object, found while
/// the scanner's `skip_args` skipped it: a kernel's `args` hold a dozen keys, and reading them
/// again one by one for the three the summary takes cost 3,100 instructions a kernel (HTA's
/// rank-1 trace: 3.6 M of the 27 M its reading thread ran, callgrind). The skip checks the
/// object's structure, not its grammar: where a `:` or `,` is missing at the object's own
/// level, the fields are those found, where the full read gives none.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ArgsAt {
    /// Each value's offset from the object's `{`, in the order of [`ARGS_KEYS`] (0: absent).
    pub(crate) at: [u32; 5],
    /// One of the keys given twice.
    pub(crate) twice: bool,
    /// Every key of the object's own level was looked at: none lay in a block of 64 bytes
    /// with a backslash (an escape could spell one of the keys), or in the bytes after the
    /// buffer's last whole block. Else the keys are read again, one by one.
    pub(crate) known: bool,
}

/// An event's `args` value as it stands in the trace, unread ([`RawArgs::read`] and
/// [`Event::args`] read it: `scan.rs`).
#[derive(Debug, Clone, Copy)]
pub struct RawArgs<'a> {
    pub(crate) bytes: &'a [u8],
    /// Where the fields [`Args`] holds lie, when the scanner found them as it skipped the value.
    pub(crate) at: ArgsAt,
}

/// Two `args` are the same JSON text (where the scanner found their fields is not compared).
impl PartialEq for RawArgs<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.bytes == other.bytes
    }
}

impl Eq for RawArgs<'_> {}

impl<'a> RawArgs<'a> {
    /// The value's JSON text (`None` when it is not UTF-8).
    pub fn text(&self) -> Option<&'a str> {
        std::str::from_utf8(self.bytes).ok()
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for RawArgs<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = <&'de serde_json::value::RawValue>::deserialize(d)?;
        Ok(RawArgs {
            bytes: raw.get().as_bytes(),
            at: ArgsAt::default(),
        })
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
    pub stepscope: TraceHeader,
    /// Whether a `traceEvents` array was found.
    pub has_events: bool,
    /// `baseTimeNanoseconds`: Kineto's events' `ts` (µs) plus this is Unix time.
    pub base_time_ns: Option<u64>,
    /// Bumped each time the reader reads a top-level value (those above among them): how
    /// events scanned on one thread carry, to the sink on another, the metadata each was read
    /// under ([`super::ahead`]). Private: `Meta` is built by the reader, or as
    /// `Meta::default()`.
    pub(crate) version: u64,
}

/// One entry of `deviceProperties`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
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

/// `distributedInfo`.
#[derive(Deserialize, Default)]
pub(crate) struct DistributedInfo {
    #[serde(default)]
    pub rank: Option<i64>,
    #[serde(default)]
    pub world_size: Option<i64>,
}

/// What a device event is (a kernel, memcpy or memset), and the graph node a replay's event
/// was made from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NodeKind {
    /// A kernel (`cat: kernel`).
    Kernel,
    /// A memcpy (`gpu_memcpy`).
    Memcpy,
    /// A memset (`gpu_memset`).
    Memset,
}

/// The device categories, and what their events are.
pub(crate) fn device_category(cat: &str) -> Option<NodeKind> {
    match cat {
        // MTIA's on-device events are Kineto's CONCURRENT_KERNEL under another name.
        "kernel" | "mtia_ccp_events" => Some(NodeKind::Kernel),
        "gpu_memcpy" => Some(NodeKind::Memcpy),
        "gpu_memset" => Some(NodeKind::Memset),
        _ => None,
    }
}

/// A device event's lane: its (device, stream) from `args`, else its numeric `pid` and `tid`
/// (where Kineto places device events), else -1.
pub(crate) fn device_lane(e: &Event<'_>, args: &Args) -> (i64, i64) {
    let num = |id: &Option<Id<'_>>| match id {
        Some(Id::Num(n)) => Some(*n),
        _ => None,
    };
    (
        args.device.map(|d| d as i64).or(num(&e.pid)).unwrap_or(-1),
        args.stream.map(|s| s as i64).or(num(&e.tid)).unwrap_or(-1),
    )
}

/// Whether an event is a step's annotation: `ProfilerStep#N` (torch's schedule), or an
/// engine iteration's `execute_…` (vLLM's and stepscope's names) other than its GPU echo.
pub(crate) fn is_step_annotation(cat: &str, name: &str) -> bool {
    name.starts_with("ProfilerStep#")
        || (name.starts_with("execute_") && !matches!(cat, "kernel" | "gpu_user_annotation"))
}

/// Host-side runtime calls whose correlation id links them to a device event.
pub(crate) fn is_launch_category(cat: &str) -> bool {
    matches!(cat, "cuda_runtime" | "cuda_driver" | "mtia_runtime")
}

/// Whether analysis reads an event's `args`: a device event's (its lane and correlation), a
/// launch's (its correlation), a step annotation's (its step and requests), as the summarizer
/// asks for them. The scanner finds these events' keys as it skips their `args`; any other's
/// are read in full if asked for.
pub(crate) fn args_read(cat: &str, name: &str) -> bool {
    device_category(cat).is_some() || is_launch_category(cat) || is_step_annotation(cat, name)
}

/// A process and thread id, owned (numbers in Kineto's traces; strings elsewhere).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum ThreadKey {
    Num(i64, i64),
    Other(String),
}

impl ThreadKey {
    /// An event's thread.
    pub(crate) fn of(e: &Event<'_>) -> Self {
        match (&e.pid, &e.tid) {
            (Some(Id::Num(p)), Some(Id::Num(t))) => ThreadKey::Num(*p, *t),
            (None, Some(Id::Num(t))) => ThreadKey::Num(i64::MIN, *t),
            (p, t) => ThreadKey::Other(format!("{p:?}/{t:?}")),
        }
    }
}
