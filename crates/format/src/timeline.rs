//! The step timeline's document: one step's fields ([`TimelineStep`]), their order in the
//! arrays the C ABI, the Python package and the HTTP routes give ([`FIELDS`]), and reading a
//! row back ([`TimelineStep::from_row`]). The ring that records steps is the profiler's.

use serde_json::Value;

/// The names of a [`TimelineStep`]'s fields, in the order of the tuples and JSON arrays the
/// Python package and the HTTP routes give.
pub const FIELDS: [&str; 8] = [
    "step",
    "start_unix_ns",
    "duration_ns",
    "num_ctx_reqs",
    "num_ctx_tokens",
    "num_gen_reqs",
    "num_gen_tokens",
    "phase",
];

/// One step of the timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct TimelineStep<P = &'static str> {
    /// The step's index (the profiler's step count; the first step is 1).
    pub step: u64,
    /// When `step()` was called, ns since the Unix epoch.
    pub start_unix_ns: u64,
    /// From `step()` to the guard's drop (`step_end`), or to the next `step()` when the guard
    /// outlived it, ns.
    pub duration_ns: u64,
    /// Requests in prefill.
    pub num_ctx_reqs: u32,
    /// Tokens scheduled for requests in prefill.
    pub num_ctx_tokens: u32,
    /// Requests in decode.
    pub num_gen_reqs: u32,
    /// Tokens scheduled for requests in decode.
    pub num_gen_tokens: u32,
    /// The session's phase during the step (the schedule's `Phase::as_str`; a reader of
    /// the JSON holds it as a `String`).
    pub phase: P,
}

/// A [`TimelineStep`] as a tuple in [`FIELDS`] order (the C ABI's JSON arrays, Python's
/// tuples).
pub type StepTuple = (u64, u64, u64, u32, u32, u32, u32, &'static str);

impl TimelineStep {
    /// Its fields in [`FIELDS`] order.
    pub fn as_tuple(&self) -> StepTuple {
        (
            self.step,
            self.start_unix_ns,
            self.duration_ns,
            self.num_ctx_reqs,
            self.num_ctx_tokens,
            self.num_gen_reqs,
            self.num_gen_tokens,
            self.phase,
        )
    }
}

/// The timeline's size and how much of it is filled, as `status()` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct TimelineInfo {
    /// How many steps it keeps.
    pub capacity: u64,
    /// How many steps it has recorded in all (the ring holds the last `capacity`).
    pub recorded: u64,
    /// `tsc` (the CPU's time-stamp counter) or `monotonic`.
    pub clock: &'static str,
}

/// One worker's timeline as every surface serves it (the vLLM plugin's
/// `GET /stepscope/timeline` workers, each SGLang scheduler's `/server_info`, the C ABI's
/// `stepscope_timeline_json`): built by the profiler, once.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TimelineDocument {
    /// The worker's name.
    pub worker_name: String,
    /// Its global rank, when known.
    pub rank: Option<u32>,
    /// The session's phase now.
    pub phase: &'static str,
    /// The worker's step count now.
    pub step_index: u64,
    /// The worker's clock when the document was made, ns since the Unix epoch: a reader's
    /// window ends there (the steps' times are on this clock).
    pub now_unix_ns: u64,
    /// The timeline's size and fill; `None` when it is off.
    pub timeline: Option<TimelineInfo>,
    /// The steps' fields, in the order of each step's array.
    pub fields: [&'static str; 8],
    /// The ended steps asked for, oldest first, each in `fields` order; `None` when the
    /// timeline is off.
    pub steps: Option<Vec<StepTuple>>,
}

impl<P> TimelineStep<P> {
    /// Requests in the step, prefill and decode.
    pub fn requests(&self) -> u64 {
        u64::from(self.num_ctx_reqs) + u64::from(self.num_gen_reqs)
    }

    /// Tokens scheduled in the step, prefill and decode.
    pub fn tokens(&self) -> u64 {
        u64::from(self.num_ctx_tokens) + u64::from(self.num_gen_tokens)
    }
}

/// Where each of [`FIELDS`] is in the rows of a timeline document whose `"fields"` are
/// `fields`: the error names the first one missing.
pub fn field_positions(fields: &[&str]) -> Result<[usize; 8], String> {
    let mut at = [0; 8];
    for (slot, name) in at.iter_mut().zip(FIELDS) {
        *slot = fields
            .iter()
            .position(|f| *f == name)
            .ok_or_else(|| format!("the timeline's fields lack {name:?}"))?;
    }
    Ok(at)
}

impl TimelineStep<String> {
    /// One row of a timeline document (`[step, start_unix_ns, ...]` with its fields at
    /// `at`, from [`field_positions`]); the error shows the row.
    pub fn from_row(row: &Value, at: &[usize; 8]) -> Result<Self, String> {
        let v = |i: usize| row.get(at[i]).and_then(Value::as_u64);
        let small = |i: usize| v(i).and_then(|n| u32::try_from(n).ok());
        (|| {
            Some(TimelineStep {
                step: v(0)?,
                start_unix_ns: v(1)?,
                duration_ns: v(2)?,
                num_ctx_reqs: small(3)?,
                num_ctx_tokens: small(4)?,
                num_gen_reqs: small(5)?,
                num_gen_tokens: small(6)?,
                phase: row.get(at[7])?.as_str()?.to_string(),
            })
        })()
        .ok_or_else(|| format!("a timeline step is not in its fields' form: {row}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_reads_back_in_any_field_order() {
        let step = TimelineStep {
            step: 7,
            start_unix_ns: 10,
            duration_ns: 3,
            num_ctx_reqs: 1,
            num_ctx_tokens: 128,
            num_gen_reqs: 2,
            num_gen_tokens: 2,
            phase: "running",
        };
        let row = serde_json::to_value(step.as_tuple()).unwrap();
        let back = TimelineStep::from_row(&row, &field_positions(&FIELDS).unwrap()).unwrap();
        assert_eq!(back.phase, "running");
        assert_eq!((back.step, back.requests(), back.tokens()), (7, 3, 130));

        let mut reversed = FIELDS;
        reversed.reverse();
        let row: Vec<Value> = FIELDS
            .iter()
            .rev()
            .map(|f| {
                let i = FIELDS.iter().position(|g| g == f).unwrap();
                row[i].clone()
            })
            .collect();
        let back2 = TimelineStep::from_row(&Value::from(row), &field_positions(&reversed).unwrap())
            .unwrap();
        assert_eq!(back2, back);
        assert_eq!(
            field_positions(&["step"]).unwrap_err(),
            "the timeline's fields lack \"start_unix_ns\""
        );
        assert!(
            TimelineStep::from_row(&serde_json::json!([1, 2]), &[0, 1, 2, 3, 4, 5, 6, 7])
                .unwrap_err()
                .contains("[1,2]")
        );
    }
}
