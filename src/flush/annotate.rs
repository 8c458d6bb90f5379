//! The requests of each captured iteration, written into its annotation's `args` while the
//! trace streams to disk.
//!
//! Kineto writes a `RecordFunction`'s kwinputs into the event's args only when the session
//! records shapes; otherwise the annotation carries only its `"Record function id"`, which
//! stepscope sets to the step index. This pass finds, line by line in Kineto's JSON, each
//! `user_annotation` event whose `"Record function id"` is a captured step with requests, and
//! inserts `"requests": [...]` right after that number. Any other layout is left as it is
//! (the ids stay in the header's `stepscope.steps`, keyed by step), so a Kineto that formats
//! differently gets an untouched trace, never a broken one.

use std::collections::HashMap;

use memchr::memmem;

use crate::trace::StepRequests;

const CATEGORY: &[u8] = b"\"cat\": \"";
const ANNOTATION: &[u8] = b"user_annotation\"";
const RECORD_ID: &[u8] = b"\"Record function id\": ";

/// The line-by-line insertion of each step's requests.
pub(crate) struct RequestArgs {
    /// `, "requests": [...]` for each step not yet written.
    by_step: HashMap<u64, String>,
    /// The last, incomplete line of the previous chunk.
    carry: Vec<u8>,
    /// The event being read is a `user_annotation` (its category precedes its args).
    in_annotation: bool,
}

impl RequestArgs {
    /// The pass for these steps; `None` when no step has requests.
    pub(crate) fn new(steps: &[StepRequests]) -> Option<Self> {
        let by_step: HashMap<u64, String> = steps
            .iter()
            .filter(|s| !s.requests.is_empty())
            .map(|s| {
                let ids = serde_json::to_string(&s.requests).unwrap_or_else(|_| "[]".into());
                (s.step, format!(", \"requests\": {ids}"))
            })
            .collect();
        (!by_step.is_empty()).then(|| RequestArgs {
            by_step,
            carry: Vec::new(),
            in_annotation: false,
        })
    }

    /// Copies `chunk` to `out`, with the insertions of its complete lines; an incomplete last
    /// line waits for the next chunk (or [`RequestArgs::finish`]).
    pub(crate) fn feed(&mut self, chunk: &[u8], out: &mut Vec<u8>) {
        let Some(last_newline) = memchr::memrchr(b'\n', chunk) else {
            self.carry.extend_from_slice(chunk);
            return;
        };
        let (complete, rest) = chunk.split_at(last_newline + 1);
        if self.carry.is_empty() {
            self.lines(complete, out);
        } else {
            let mut joined = std::mem::take(&mut self.carry);
            joined.extend_from_slice(complete);
            self.lines(&joined, out);
            joined.clear();
            self.carry = joined;
        }
        self.carry.extend_from_slice(rest);
    }

    /// Writes what is left (a last line without a newline).
    pub(crate) fn finish(&mut self, out: &mut Vec<u8>) {
        let rest = std::mem::take(&mut self.carry);
        self.lines(&rest, out);
    }

    /// Copies whole lines, inserting where a line holds a captured step's record id.
    fn lines(&mut self, text: &[u8], out: &mut Vec<u8>) {
        let mut copied = 0;
        let mut start = 0;
        while start < text.len() {
            let end = memchr::memchr(b'\n', &text[start..]).map_or(text.len(), |i| start + i + 1);
            let line = &text[start..end];
            if let Some(at) = memmem::find(line, CATEGORY) {
                self.in_annotation = line[at + CATEGORY.len()..].starts_with(ANNOTATION);
            }
            if self.in_annotation {
                if let Some(at) = memmem::find(line, RECORD_ID) {
                    let digits_at = start + at + RECORD_ID.len();
                    let digits = text[digits_at..end]
                        .iter()
                        .take_while(|b| b.is_ascii_digit())
                        .count();
                    let step = std::str::from_utf8(&text[digits_at..digits_at + digits])
                        .ok()
                        .and_then(|s| s.parse::<u64>().ok());
                    if let Some(insert) = step.and_then(|s| self.by_step.remove(&s)) {
                        out.extend_from_slice(&text[copied..digits_at + digits]);
                        out.extend_from_slice(insert.as_bytes());
                        copied = digits_at + digits;
                    }
                    self.in_annotation = false;
                }
            }
            start = end;
        }
        out.extend_from_slice(&text[copied..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An excerpt laid out as Kineto 2.13 writes it.
    const TRACE: &str = r#"{
  "traceEvents": [
  {
    "ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1,
    "ts": 10.0, "dur": 1.0,
    "args": {
      "External id": 2,"Record function id": 0, "Ev Idx": 1
    }
  },
  {
    "ph": "X", "cat": "user_annotation", "name": "execute_context_0(0)_generation_2(2)", "pid": 1, "tid": 1,
    "ts": 9.0, "dur": 5.0,
    "args": {
      "External id": 1,"Record function id": 4, "Ev Idx": 0
    }
  },
  {
    "ph": "X", "cat": "user_annotation", "name": "execute_context_0(0)_generation_2(2)", "pid": 1, "tid": 1,
    "ts": 19.0, "dur": 5.0,
    "args": {
      "External id": 9,"Record function id": 5, "Ev Idx": 8
    }
  }
  ]
}"#;

    fn steps() -> Vec<StepRequests> {
        vec![
            StepRequests {
                step: 4,
                requests: vec!["a".into(), "b\"q".into()],
                ..StepRequests::default()
            },
            StepRequests {
                step: 5,
                requests: vec!["c".into()],
                ..StepRequests::default()
            },
        ]
    }

    fn annotation_args(json: &[u8]) -> Vec<serde_json::Value> {
        let doc: serde_json::Value = serde_json::from_slice(json).expect("valid JSON");
        doc["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["args"].clone())
            .collect()
    }

    #[test]
    fn each_captured_annotation_gets_its_requests_whatever_the_chunking() {
        for chunk in [1, 7, 64, 4096] {
            let mut pass = RequestArgs::new(&steps()).unwrap();
            let mut out = Vec::new();
            for c in TRACE.as_bytes().chunks(chunk) {
                pass.feed(c, &mut out);
            }
            pass.finish(&mut out);
            let args = annotation_args(&out);
            assert_eq!(args[0].get("requests"), None, "a cpu_op is untouched");
            assert_eq!(args[1]["requests"], serde_json::json!(["a", "b\"q"]));
            assert_eq!(args[1]["Record function id"], 4);
            assert_eq!(args[2]["requests"], serde_json::json!(["c"]));
            assert_eq!(args[2]["Ev Idx"], 8);
        }
    }

    #[test]
    fn nothing_to_insert_is_no_pass_and_an_unknown_layout_is_copied_as_is() {
        assert!(RequestArgs::new(&[]).is_none());
        let other = TRACE.replace("\"Record function id\": ", "\"Record function id\":");
        let mut pass = RequestArgs::new(&steps()).unwrap();
        let mut out = Vec::new();
        pass.feed(other.as_bytes(), &mut out);
        pass.finish(&mut out);
        assert_eq!(out, other.as_bytes());
    }
}
