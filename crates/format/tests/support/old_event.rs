//! The event type the trace reader parsed with serde_json before the scanner, field for field:
//! the reference the scanner is checked against (`scanner_matches_serde.rs`) and the old parser
//! the read bench measures beside it (`cli/benches/analyze.rs`).

use std::borrow::Cow;

use serde::Deserialize;
use stepscope_format::trace::Id;

#[allow(dead_code)]
#[derive(Deserialize)]
pub struct OldEvent<'a> {
    #[serde(default, borrow)]
    pub ph: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub cat: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub name: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub pid: Option<Id<'a>>,
    #[serde(default, borrow)]
    pub tid: Option<Id<'a>>,
    #[serde(default)]
    pub ts: Option<f64>,
    #[serde(default)]
    pub dur: Option<f64>,
    #[serde(default, borrow, rename = "args")]
    pub raw_args: Option<&'a serde_json::value::RawValue>,
}
