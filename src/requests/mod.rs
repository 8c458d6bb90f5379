//! The request log (`stepscope.requests`): each request's lifecycle in an engine and the
//! engine steps it lived through, recorded by the engine's scheduler hooks, for its readers:
//! `stepscope ctl requests` (which requests paid for a slow step, and why) from a live engine,
//! and `stepscope analyze --requests` and `report` from a capture's window of it.
//!
//! # A request's role in a step: decided here, once
//! A step that schedules a request is its **prefill** until the request has produced its first
//! token, and its **decode** from then on, the step that brings it back after a preemption
//! included: vLLM's own rule (`compute_iteration_details`, `is_context_phase`: a request with
//! output is in its generation phase; its `request_prefill_time` ends at the first token). The
//! engine may say what it knows instead ([`RoleHint`]): the output tokens it has counted (vLLM,
//! whose scheduler knows them when this log's count lags), or the role itself (SGLang's batch,
//! whose overlap loop schedules a decode before the last chunk's token is processed). The role
//! is recorded with the request ([`RequestRecord::last_prefill_step`]: its steps up to it were
//! prefill, the later ones decode) and every reader takes it from there.
//!
//! # Calls, in an engine step's order
//! [`arrived`](RequestLog::arrived) when a request reaches the scheduler;
//! [`begin_step`](RequestLog::begin_step) when the engine begins scheduling a step, then
//! [`scheduled`](RequestLog::scheduled) for each request it schedules and
//! [`preempted`](RequestLog::preempted) for each it preempts;
//! [`end_step`](RequestLog::end_step) when the step's output has been processed, then
//! [`produced`](RequestLog::produced) for each request given tokens and
//! [`finished`](RequestLog::finished) for each that ended (also between steps, for aborts).
//! Steps may overlap (an engine that schedules step N+1 before N's output is back): every
//! call names its step.
//!
//! # Layout and cost
//! Three rings allocated once, sized by the config: requests (each slot holds the id inline,
//! up to [`ID_BYTES`] bytes, and the lifecycle's counters and times), steps, and preemption
//! events. Ids are found through an open-addressing table of slot indices (linear probing,
//! deletion by backward shift) keyed by a per-log random SipHash of the id: no allocation and
//! no lock on any recording call (`table.rs`). A request's slot is reused once `requests`
//! newer ones have arrived; one still running then is dropped and counted
//! (`evicted_running`). A request the log does not hold when the engine schedules it (dropped
//! so, or running before the log was on) gets a record again, marked **partial**: what the
//! log missed of it (its prompt, cached and output tokens) is absent, not 0. `recorded`
//! counts the requests that reached the scheduler while the log was on, each once.
//!
//! # Threads
//! Recording takes `&mut self` and reading `&self`: the engine's scheduler thread owns the log
//! (vLLM answers its utility calls on that same thread, between steps), and a reader on
//! another thread goes through whatever lock the owner keeps (Python's: the object's borrow).

mod record;
mod slots;
mod table;

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;

use slots::{Event, Req, Step};
use table::IdTable;

use crate::clock::{unix_now_ns, Clock};
use crate::config::{RequestLogSize, REQUEST_LOG_RANGE};

pub use stepscope_format::requests::{
    in_prefill, otlp_json, otlp_protobuf, request_spans, step_spans, Counts, EngineStep,
    RequestRecord, RequestsDocument, ScheduledAs, SpanOptions, SpanParent, COSTLIEST, ENGINE_SPAN,
    ID_BYTES,
};

/// Why a request finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Finish {
    /// A stop condition (EOS, a stop string or token).
    Stop = 1,
    /// Its length limit.
    Length = 2,
    /// Aborted (the client went away, or the engine was told to).
    Abort = 3,
    /// An error.
    Error = 4,
    /// Another reason the engine names.
    Other = 5,
}

impl Finish {
    /// The reason an engine names (in any case, as vLLM's `FinishReason.STOP`,
    /// `RequestStatus.FINISHED_ABORTED` or SGLang's `FINISH_MATCHED_TOKEN` name it, or the
    /// log's own names): `ABORT` → abort, `STOP`, `EOS` or `MATCHED` → stop, `LENGTH` → length,
    /// `ERROR` → error, else other. The one finish-reason table: the plugins pass the engine's
    /// name as it is.
    pub fn from_name(name: &str) -> Finish {
        let n = name.to_ascii_uppercase();
        let has = |k: &str| n.contains(k);
        if has("ABORT") {
            Finish::Abort
        } else if has("STOP") || has("EOS") || has("MATCHED") {
            Finish::Stop
        } else if has("LENGTH") {
            Finish::Length
        } else if has("ERROR") {
            Finish::Error
        } else {
            Finish::Other
        }
    }

    /// The log's name of a reason's code (`stop`, `length`, …).
    fn name(code: u8) -> Option<&'static str> {
        Some(match code {
            1 => "stop",
            2 => "length",
            3 => "abort",
            4 => "error",
            5 => "other",
            _ => return None,
        })
    }
}

/// What an engine says of a scheduled request's role (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoleHint {
    /// Nothing: the log's own count of the request's output decides.
    Infer,
    /// The tokens the request had produced before this step, as the engine counts them.
    OutputsBefore(u32),
    /// The role itself (`true`: prefill).
    Prefill(bool),
}

/// [`RequestLog::steps_after`]'s answer.
#[derive(Debug, Clone, Default)]
pub struct StepsAfter {
    /// The ended steps, oldest first.
    pub steps: Vec<EngineStep>,
    /// The last step returned or passed: the next call's `after`.
    pub through: u64,
    /// Steps after `after` the ring no longer held.
    pub lost: u64,
}

/// Each request's lifecycle and the engine's steps, in bounded rings (module docs).
pub struct RequestLog {
    clock: Clock,
    hasher: RandomState,
    requests: Box<[Req]>,
    /// The slots by id.
    table: IdTable,
    /// Requests that reached the scheduler while the log was on (each once).
    arrivals: u64,
    steps: Box<[Step]>,
    events: Box<[Event]>,
    /// Requests seen in all; the next goes into slot `next_seq % requests`.
    next_seq: u64,
    /// Steps begun in all.
    next_step: u64,
    next_event: u64,
    evicted_running: u64,
}

impl RequestLog {
    /// A log keeping the last `size.requests` requests and `size.steps` steps (each rounded up
    /// to a power of two within [`REQUEST_LOG_RANGE`]).
    pub fn new(size: RequestLogSize) -> Self {
        let round = |n: usize| {
            n.clamp(REQUEST_LOG_RANGE.0, REQUEST_LOG_RANGE.1)
                .next_power_of_two()
        };
        let requests = round(size.requests);
        let steps = round(size.steps);
        RequestLog {
            clock: Clock::fastest(),
            hasher: RandomState::new(),
            requests: vec![Req::EMPTY; requests].into_boxed_slice(),
            table: IdTable::new(requests),
            arrivals: 0,
            steps: vec![Step::default(); steps].into_boxed_slice(),
            // A preemption and its return for every request the ring holds.
            events: vec![Event::default(); requests * 2].into_boxed_slice(),
            next_seq: 0,
            next_step: 0,
            next_event: 0,
            evicted_running: 0,
        }
    }

    /// What it keeps.
    pub fn capacity(&self) -> Counts {
        Counts {
            requests: self.requests.len() as u64,
            steps: self.steps.len() as u64,
        }
    }

    /// Its memory, bytes: the rings and the table, allocated once.
    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of_val(&*self.requests)
            + self.table.memory_bytes()
            + std::mem::size_of_val(&*self.steps)
            + std::mem::size_of_val(&*self.events)
    }

    /// Request `id` reached the scheduler's queue now, with a prompt of `prompt_tokens`
    /// tokens; `arrival_unix_ns`: when the engine says it arrived at its front door. An id the
    /// log already holds, still running, is left as it is.
    pub fn arrived(&mut self, id: &str, prompt_tokens: u32, arrival_unix_ns: Option<u64>) {
        let now = self.clock.ticks();
        let lead = arrival_unix_ns.map(|t| unix_now_ns().saturating_sub(t));
        let hash = self.hasher.hash_one(id.as_bytes());
        if let Some(at) = self.find(hash, id.as_bytes()) {
            if self.requests[at].finish == 0 {
                return;
            }
            // The id again after its end (an engine reusing ids): a new request.
            self.remove(at);
        }
        let at = self.insert(hash, id.as_bytes());
        self.arrivals += 1;
        let after = self.next_step;
        let r = &mut self.requests[at];
        r.prompt_tokens = prompt_tokens;
        r.arrival_lead_ns = lead;
        r.queued = now.max(1);
        r.queued_after_step = after;
    }

    /// The steps begun so far: the index of the last (0 before the first), and a
    /// [`RequestLog::document`]'s `since` for what comes after now.
    pub fn step_index(&self) -> u64 {
        self.next_step
    }

    /// The engine begins scheduling a step now, with `waiting` requests in its queue (0 when
    /// unknown); returns the step's index.
    pub fn begin_step(&mut self, waiting: u32) -> u64 {
        let now = self.clock.ticks().max(1);
        self.next_step += 1;
        let step = self.next_step;
        self.steps[self.step_at(step)] = Step {
            step,
            begin: now,
            waiting,
            ..Step::default()
        };
        step
    }

    /// Step `step` scheduled `tokens` tokens of request `id`, whose first `computed_before`
    /// tokens the engine had computed, in the role the log's own count of its output gives
    /// (module docs).
    pub fn scheduled(&mut self, step: u64, id: &str, tokens: u32, computed_before: u32) {
        self.scheduled_as(step, id, tokens, computed_before, RoleHint::Infer);
    }

    /// [`RequestLog::scheduled`] with what the engine knows of the request's role
    /// ([`RoleHint`]).
    pub fn scheduled_as(
        &mut self,
        step: u64,
        id: &str,
        tokens: u32,
        computed_before: u32,
        hint: RoleHint,
    ) {
        let Some(s) = self.step_slot(step) else {
            return;
        };
        let begin = self.steps[s].begin;
        let at = self.find_or_insert(id);
        let r = &mut self.requests[at];
        let seq = r.seq;
        if r.first_scheduled_step == 0 {
            r.first_scheduled_step = step;
            r.first_scheduled = begin;
            r.cached_tokens = computed_before;
        }
        let resumed = std::mem::take(&mut r.out);
        // The one rule (module docs).
        let prefill = match hint {
            RoleHint::Prefill(p) => p,
            RoleHint::OutputsBefore(n) => in_prefill(n),
            // A partial record's count began mid-flight: a token before it is unknown.
            RoleHint::Infer => in_prefill(r.output_tokens) && !r.partial,
        };
        if prefill {
            r.prefill_steps += 1;
            r.prefill_tokens = r.prefill_tokens.saturating_add(tokens);
            r.last_prefill_step = step;
        } else {
            r.decode_steps += 1;
        }
        r.last_step = step;
        let st = &mut self.steps[s];
        if prefill {
            st.prefill_reqs += 1;
            st.prefill_tokens = st.prefill_tokens.saturating_add(tokens);
            if tokens > st.largest_prefill_tokens {
                st.largest_prefill_tokens = tokens;
                st.largest_prefill_seq = seq;
            }
        } else {
            st.decode_reqs += 1;
            st.decode_tokens = st.decode_tokens.saturating_add(tokens);
        }
        if resumed {
            self.event(seq, step, true);
        }
    }

    /// Step `step` preempted request `id` (it goes back to the queue).
    pub fn preempted(&mut self, step: u64, id: &str) {
        let at = self.find_or_insert(id);
        let r = &mut self.requests[at];
        r.out = true;
        let seq = r.seq;
        if let Some(s) = self.step_slot(step) {
            self.steps[s].preempted += 1;
        }
        self.event(seq, step, false);
    }

    /// Step `step` scheduled nothing (an engine that polls its scheduler while it waits, as
    /// vLLM's does for remote KV transfers, a millisecond apart): it is taken back, if it is
    /// the last begun and recorded no request, so that such polls never push real steps out
    /// of the ring. Returns whether it was.
    pub fn discard_step(&mut self, step: u64) -> bool {
        let Some(s) = self.step_slot(step) else {
            return false;
        };
        let st = &self.steps[s];
        let empty = st.prefill_reqs == 0 && st.decode_reqs == 0 && st.preempted == 0;
        if step != self.next_step || !empty {
            return false;
        }
        self.steps[s] = Step::default();
        self.next_step -= 1;
        true
    }

    /// Step `step`'s output has been processed: it ends now.
    pub fn end_step(&mut self, step: u64) {
        let now = self.clock.ticks().max(1);
        if let Some(s) = self.step_slot(step) {
            self.steps[s].end = now;
        }
    }

    /// Step `step` gave request `id` `tokens` tokens (its first: the first token).
    pub fn produced(&mut self, step: u64, id: &str, tokens: u32) {
        if tokens == 0 {
            return;
        }
        let end = self.step_end_or_now(step);
        let at = self.find_or_insert(id);
        let r = &mut self.requests[at];
        if r.first_token_step == 0 {
            r.first_token_step = step;
            r.first_token = end;
        }
        r.output_tokens = r.output_tokens.saturating_add(tokens);
        r.last_token = end;
    }

    /// Request `id` finished for `reason`: at the end of step `step`, or now between steps
    /// (`None`, an abort). An id the log does not hold is ignored.
    pub fn finished(&mut self, step: Option<u64>, id: &str, reason: Finish) {
        let (step, at_ticks) = match step {
            Some(s) => (s, self.step_end_or_now(s)),
            None => (self.next_step, self.clock.ticks().max(1)),
        };
        if let Some(at) = self.find(self.hasher.hash_one(id.as_bytes()), id.as_bytes()) {
            let r = &mut self.requests[at];
            if r.finish == 0 {
                r.finish = reason as u8;
                r.finished_step = step;
                r.finished = at_ticks;
            }
        }
    }

    /// Writes [`RequestLog::document`] above `since` as JSON to `path`, whole or not at all
    /// (the project's temporaries: `.{name}.{pid}.partial`, fsynced, renamed into place).
    pub fn write_document(&self, path: &std::path::Path, since: u64) -> crate::Result<()> {
        let json = serde_json::to_vec(&self.document(since)).map_err(|e| crate::Error::Write {
            path: path.to_path_buf(),
            message: format!("cannot serialize the request log: {e}"),
        })?;
        crate::files::write_atomic(path, &json)
    }

    /// The ended steps above `since` and the requests active after it (module docs of
    /// [`RequestsDocument`]). Allocates: a reader's call, never the engine's step.
    pub fn document(&self, since: u64) -> RequestsDocument {
        let scale = self.clock.scale();
        let mut steps: Vec<EngineStep> = self
            .steps
            .iter()
            .filter(|s| s.step > since && s.end != 0)
            .map(|s| record::engine_step(&scale, s, self.by_seq_id(s.largest_prefill_seq)))
            .collect();
        steps.sort_unstable_by_key(|s| s.step);
        let mut requests: Vec<&Req> = self
            .requests
            .iter()
            .filter(|r| r.seq != 0 && (r.finish == 0 || r.last_activity() > since))
            .collect();
        requests.sort_unstable_by_key(|r| r.seq);
        // Sorted by request, so that each request's are found by a binary search: a reader in
        // vLLM runs on the engine core's thread, between steps.
        let mut events: Vec<&Event> = self.events.iter().filter(|e| e.seq != 0).collect();
        events.sort_unstable_by_key(|e| (e.seq, e.step, e.resumed));
        self.documented(&scale, steps, requests, &events)
    }

    /// The document of the requests `ids` alone (those the log holds), with the steps they
    /// lived through (from the one in flight when the first was queued to the last one's
    /// last activity) and their events: what their spans are built from, in time proportional
    /// to those requests' steps, not to the log's size.
    pub fn document_of(&self, ids: &[&str]) -> RequestsDocument {
        let scale = self.clock.scale();
        let mut mine: Vec<&Req> = ids
            .iter()
            .filter_map(|id| {
                let hash = self.hasher.hash_one(id.as_bytes());
                self.find(hash, id.as_bytes()).map(|at| &self.requests[at])
            })
            .collect();
        mine.sort_unstable_by_key(|r| r.seq);
        mine.dedup_by_key(|r| r.seq);
        let first = mine.iter().map(|r| r.queued_after_step.max(1)).min();
        let last = mine.iter().map(|r| r.last_activity()).max();
        let mut steps = Vec::new();
        if let (Some(first), Some(last)) = (first, last) {
            // The ring keeps at most its length of steps: no more to look at.
            let from = first.max(last.saturating_sub(self.steps.len() as u64));
            for step in from..=last.min(self.next_step) {
                if let Some(at) = self.step_slot(step).filter(|&at| self.steps[at].end != 0) {
                    let st = &self.steps[at];
                    steps.push(record::engine_step(
                        &scale,
                        st,
                        self.by_seq_id(st.largest_prefill_seq),
                    ));
                }
            }
        }
        let seqs: Vec<u64> = mine.iter().map(|r| r.seq).collect();
        let mut events: Vec<&Event> = self
            .events
            .iter()
            .filter(|e| e.seq != 0 && seqs.binary_search(&e.seq).is_ok())
            .collect();
        events.sort_unstable_by_key(|e| (e.seq, e.step, e.resumed));
        self.documented(&scale, steps, mine, &events)
    }

    /// A document of `steps` and the records of `requests` (with their `events`, sorted by
    /// request), and the log's counts now.
    fn documented(
        &self,
        scale: &crate::clock::Scale,
        steps: Vec<EngineStep>,
        requests: Vec<&Req>,
        events: &[&Event],
    ) -> RequestsDocument {
        RequestsDocument {
            pid: std::process::id(),
            step_index: self.next_step,
            now_unix_ns: scale.unix_ns(self.clock.ticks()),
            clock: self.clock.name().to_string(),
            capacity: self.capacity(),
            recorded: Counts {
                requests: self.arrivals,
                steps: self.next_step,
            },
            evicted_running: self.evicted_running,
            steps,
            requests: requests
                .into_iter()
                .map(|r| record::record(scale, r, events))
                .collect(),
        }
    }

    /// The id of the request of `seq` while the ring holds it (0: none).
    fn by_seq_id(&self, seq: u64) -> Option<String> {
        (seq != 0)
            .then(|| self.by_seq(seq))
            .flatten()
            .map(Req::id_str)
    }

    fn by_seq(&self, seq: u64) -> Option<&Req> {
        let r = &self.requests[self.seq_slot(seq)];
        (r.seq == seq).then_some(r)
    }

    fn seq_slot(&self, seq: u64) -> usize {
        ((seq - 1) as usize) & (self.requests.len() - 1)
    }

    /// Where step `step` goes in the ring.
    fn step_at(&self, step: u64) -> usize {
        // The length is a power of two: the mask is the modulo.
        (step as usize) & (self.steps.len() - 1)
    }

    /// The steps after `after` that have ended, oldest first, up to the first still in
    /// flight: what an exporter sends once each, calling again with [`StepsAfter::through`].
    /// Steps the ring no longer holds are counted ([`StepsAfter::lost`]), not returned.
    pub fn steps_after(&self, after: u64) -> StepsAfter {
        let scale = self.clock.scale();
        let oldest = (self.next_step + 1)
            .saturating_sub(self.steps.len() as u64)
            .max(1);
        let from = (after + 1).max(oldest);
        let mut out = StepsAfter {
            steps: Vec::new(),
            through: after.max(from - 1),
            lost: from - (after + 1).min(from),
        };
        for step in from..=self.next_step {
            match self.step_slot(step) {
                Some(at) if self.steps[at].end != 0 => {
                    let st = &self.steps[at];
                    let who = self.by_seq_id(st.largest_prefill_seq);
                    out.steps.push(record::engine_step(&scale, st, who));
                    out.through = step;
                }
                // In flight: the next call takes it up.
                Some(_) => break,
                None => out.through = step,
            }
        }
        out
    }

    /// Where step `step` is, while the ring still holds it.
    fn step_slot(&self, step: u64) -> Option<usize> {
        let s = self.step_at(step);
        (step != 0 && self.steps[s].step == step).then_some(s)
    }

    fn step_end_or_now(&self, step: u64) -> u64 {
        match self.step_slot(step).map(|s| self.steps[s].end) {
            Some(end) if end != 0 => end,
            _ => self.clock.ticks().max(1),
        }
    }

    fn event(&mut self, seq: u64, step: u64, resumed: bool) {
        let len = self.events.len();
        self.events[(self.next_event as usize) % len] = Event { seq, step, resumed };
        self.next_event += 1;
    }

    /// The slot of request `id`, which a log not holding it gets now, marked partial (first
    /// seen scheduled, or producing: dropped from the ring while it ran, or running before the
    /// log was on). Not counted as an arrival: it was counted when it arrived, or it arrived
    /// before the log was on.
    fn find_or_insert(&mut self, id: &str) -> usize {
        let hash = self.hasher.hash_one(id.as_bytes());
        if let Some(at) = self.find(hash, id.as_bytes()) {
            return at;
        }
        let at = self.insert(hash, id.as_bytes());
        self.requests[at].partial = true;
        at
    }

    fn find(&self, hash: u64, id: &[u8]) -> Option<usize> {
        self.table
            .find(hash, |at| self.requests[at].id_matches(hash, id))
    }

    /// A new request in the next slot, evicting its occupant (a running one is counted).
    fn insert(&mut self, hash: u64, id: &[u8]) -> usize {
        self.next_seq += 1;
        let seq = self.next_seq;
        let at = self.seq_slot(seq);
        if self.requests[at].seq != 0 {
            if self.requests[at].finish == 0 {
                self.evicted_running += 1;
            }
            self.remove(at);
        }
        let mut r = Req::EMPTY;
        r.seq = seq;
        r.hash = hash;
        r.id_len = u32::try_from(id.len()).unwrap_or(u32::MAX);
        let n = id.len().min(ID_BYTES);
        r.id[..n].copy_from_slice(&id[..n]);
        self.requests[at] = r;
        self.table.insert(hash, at);
        at
    }

    /// Empties slot `at` and takes it out of the table.
    fn remove(&mut self, at: usize) {
        let hash = self.requests[at].hash;
        self.requests[at].seq = 0;
        let requests = &self.requests;
        self.table.remove(hash, at, |slot| requests[slot].hash);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn log(requests: usize, steps: usize) -> RequestLog {
        RequestLog::new(RequestLogSize { requests, steps })
    }

    fn get<'a>(d: &'a RequestsDocument, id: &str) -> &'a RequestRecord {
        d.requests.iter().find(|r| r.id == id).unwrap()
    }

    #[test]
    fn a_document_cut_after_a_step_is_the_one_the_log_makes_above_it() {
        // Three steps of `id` alone: its prompt, then two decodes; one token each.
        fn serve(l: &mut RequestLog, id: &str, prompt: u32, waiting: u32) {
            for k in 0..3u32 {
                let s = l.begin_step(waiting);
                let (tokens, computed) = if k == 0 {
                    (prompt, 0)
                } else {
                    (1, prompt - 1 + k)
                };
                l.scheduled(s, id, tokens, computed);
                l.end_step(s);
                l.produced(s, id, 1);
            }
        }
        let mut l = log(64, 64);
        l.arrived("early", 8, None);
        serve(&mut l, "early", 8, 0);
        l.finished(Some(3), "early", Finish::Length);
        l.arrived("late", 4, None);
        l.arrived("waiting", 4, None);
        serve(&mut l, "late", 4, 1);
        // Two documents made at different moments place the log's clock readings on the wall
        // clock a few µs apart (and their ticks to ns by a newer reading): all else is compared.
        fn untimed(d: &RequestsDocument) -> serde_json::Value {
            fn strip(v: &mut serde_json::Value) {
                match v {
                    serde_json::Value::Object(m) => {
                        m.retain(|k, _| !k.ends_with("_ns"));
                        m.values_mut().for_each(strip);
                    }
                    serde_json::Value::Array(a) => a.iter_mut().for_each(strip),
                    _ => {}
                }
            }
            let mut v = serde_json::to_value(d).expect("a document serializes");
            strip(&mut v);
            v
        }
        let whole = l.document(0);
        for since in 0..=6 {
            let cut = whole.clone().after_step(since);
            assert_eq!(untimed(&cut), untimed(&l.document(since)), "since {since}");
        }
        // `early` ended in step 3: gone from what follows step 3; `waiting` never ends.
        let ids =
            |d: &RequestsDocument| d.requests.iter().map(|r| r.id.clone()).collect::<Vec<_>>();
        assert_eq!(ids(&whole.clone().after_step(3)), ["late", "waiting"]);
        assert_eq!(whole.after_step(6).steps.len(), 0);
    }

    #[test]
    fn a_chunked_prefill_then_decode_is_one_lifecycle_in_order() {
        let mut l = log(64, 64);
        // Arrived at the front door 2 ms before it was queued.
        l.arrived("long", 600, Some(unix_now_ns() - 2_000_000));
        // Chunks of 256, 256 and 88 tokens; the last gives the first token.
        for (chunk, computed) in [(256, 0), (256, 256), (88, 512)] {
            let s = l.begin_step(0);
            l.scheduled(s, "long", chunk, computed);
            l.end_step(s);
            if computed + chunk == 600 {
                l.produced(s, "long", 1);
            }
        }
        l.arrived("short", 8, None);
        for k in 0..2 {
            let s = l.begin_step(0);
            l.scheduled(s, "long", 1, 600 + k);
            if k == 0 {
                l.scheduled(s, "short", 8, 0);
            } else {
                l.scheduled(s, "short", 1, 8);
            }
            l.end_step(s);
            l.produced(s, "long", 1);
            l.produced(s, "short", 1);
        }
        l.finished(Some(5), "long", Finish::Length);
        let d = l.document(0);
        assert_eq!(d.step_index, 5);
        assert_eq!(d.steps.len(), 5);
        let long = get(&d, "long");
        let lead = long.queued_unix_ns.unwrap() - long.arrival_unix_ns.unwrap();
        // 2 ms, and the instants between the two clock reads.
        assert!((2_000_000..1_000_000_000).contains(&lead), "{lead}");
        assert_eq!(long.queued_after_step, 0);
        assert_eq!((long.prefill_steps, long.prefill_tokens), (3, 600));
        assert_eq!(long.first_scheduled_step, Some(1));
        assert_eq!(long.first_token_step, Some(3));
        assert_eq!((long.decode_steps, long.output_tokens), (2, Some(3)));
        assert_eq!(
            (long.finished_step, long.finish.as_deref()),
            (Some(5), Some("length"))
        );
        let q = long.queued_unix_ns.unwrap();
        let sched = long.first_scheduled_unix_ns.unwrap();
        let first = long.first_token_unix_ns.unwrap();
        let last = long.last_token_unix_ns.unwrap();
        assert!(q <= sched && sched <= first && first <= last, "{long:?}");
        assert_eq!(first, d.steps[2].end_unix_ns());
        assert_eq!(sched, d.steps[0].start_unix_ns);

        let short = get(&d, "short");
        assert_eq!(short.queued_after_step, 3);
        assert_eq!((short.prefill_steps, short.decode_steps), (1, 1));
        assert_eq!(short.first_token_step, Some(4));
        assert_eq!(short.finish, None);

        let s4 = &d.steps[3];
        assert_eq!(
            (
                s4.prefill_reqs,
                s4.prefill_tokens,
                s4.decode_reqs,
                s4.decode_tokens
            ),
            (1, 8, 1, 1)
        );
        assert_eq!(s4.largest_prefill_request.as_deref(), Some("short"));
        assert_eq!(d.steps[0].largest_prefill_tokens, 256);
        assert_eq!(d.steps[0].largest_prefill_request.as_deref(), Some("long"));
        // Readers ask for what is new: long finished at 5, short is running.
        let later = l.document(5);
        assert!(later.steps.is_empty());
        assert_eq!(later.requests.len(), 1);
        assert_eq!(later.requests[0].id, "short");
    }

    #[test]
    fn a_preempted_request_returns_in_decode_and_shows_both_events() {
        let mut l = log(16, 16);
        l.arrived("a", 4, None);
        let s = l.begin_step(3);
        l.scheduled(s, "a", 4, 0);
        l.end_step(s);
        l.produced(s, "a", 1);
        let s = l.begin_step(0);
        l.scheduled(s, "a", 1, 4);
        l.end_step(s);
        l.produced(s, "a", 1);
        let s = l.begin_step(0);
        l.preempted(s, "a");
        l.end_step(s);
        // Back: prompt and outputs (6 tokens) computed again from the prefix cache's 4.
        let s = l.begin_step(0);
        l.scheduled(s, "a", 2, 4);
        l.end_step(s);
        l.produced(s, "a", 1);
        let s = l.begin_step(0);
        l.scheduled(s, "a", 1, 6);
        l.end_step(s);
        let d = l.document(0);
        let a = get(&d, "a");
        assert_eq!(
            (a.preempted_at.clone(), a.resumed_at.clone()),
            (vec![3], vec![4])
        );
        // vLLM's rule: after its first token, the step that brings it back (recomputing 2
        // tokens) is decode, as vLLM's compute_iteration_details counts it.
        assert_eq!((a.prefill_steps, a.decode_steps), (1, 3));
        assert_eq!(a.last_prefill_step, Some(1));
        assert_eq!(
            (1..=5).map(|s| a.role_in(s)).collect::<Vec<_>>(),
            [
                ScheduledAs::Prefill,
                ScheduledAs::Decode,
                ScheduledAs::Decode,
                ScheduledAs::Decode,
                ScheduledAs::Decode
            ]
        );
        assert_eq!(d.steps[3].decode_tokens, 2);
        assert_eq!(a.first_token_step, Some(1));
        assert_eq!(a.arrival_unix_ns, None);
        assert_eq!(d.steps[2].preempted, 1);
        assert_eq!(d.steps[0].waiting, 3);
    }

    #[test]
    fn requests_first_seen_scheduled_or_unknown_are_kept_or_ignored() {
        let mut l = log(16, 16);
        let s = l.begin_step(0);
        l.scheduled(s, "before-the-log", 1, 9);
        l.end_step(s);
        l.finished(Some(s), "never-seen", Finish::Abort);
        let d = l.document(0);
        assert_eq!(d.requests.len(), 1);
        let r = &d.requests[0];
        assert_eq!((r.queued_unix_ns, r.first_scheduled_step), (None, Some(1)));
        // What the log missed is absent, and the record says so.
        assert!(r.partial);
        assert_eq!(
            (r.prompt_tokens, r.cached_tokens, r.output_tokens),
            (None, None, None)
        );
        assert_eq!(d.recorded.requests, 0);
        // A step that was never begun, or has left the ring, records nothing.
        l.scheduled(99, "x", 1, 0);
        assert_eq!(l.document(0).requests.len(), 1);
        // An abort between steps.
        l.finished(
            None,
            "before-the-log",
            Finish::from_name("FINISHED_ABORTED"),
        );
        let d = l.document(0);
        assert_eq!(d.requests[0].finish.as_deref(), Some("abort"));
        assert_eq!(d.requests[0].finished_step, Some(1));
    }

    #[test]
    fn a_running_request_the_ring_dropped_comes_back_partial_and_is_counted_once() {
        // A ring of 16 and 24 requests in flight: the first 8 are dropped while running.
        let mut l = log(16, 64);
        for i in 0..24 {
            l.arrived(&format!("r{i}"), 10, None);
        }
        assert_eq!(l.document(0).evicted_running, 8);
        // The engine decodes r0 (it had 3 tokens): the log makes it a record again.
        let s = l.begin_step(0);
        l.scheduled_as(s, "r0", 1, 12, RoleHint::OutputsBefore(3));
        l.end_step(s);
        l.produced(s, "r0", 1);
        let d = l.document(0);
        let r0 = get(&d, "r0");
        assert!(r0.partial);
        assert_eq!((r0.prompt_tokens, r0.output_tokens), (None, None));
        assert_eq!((r0.prefill_steps, r0.decode_steps), (0, 1));
        // 24 requests, each counted once though r0 was recorded twice.
        assert_eq!(d.recorded.requests, 24);
        // One running before the log was on is a partial record, not an arrival.
        let s = l.begin_step(0);
        l.scheduled(s, "stranger", 1, 40);
        assert_eq!(l.document(0).recorded.requests, 24);
        // Without the engine's count, a partial record's step is decode: a token before it is
        // unknown, prefill is not assumed.
        assert_eq!(get(&l.document(0), "stranger").decode_steps, 1);
    }

    #[test]
    fn the_document_of_some_requests_holds_them_and_the_steps_they_lived_through() {
        let mut l = log(16, 64);
        for (i, id) in ["a", "b", "c"].iter().enumerate() {
            l.arrived(id, 4, None);
            let s = l.begin_step(0);
            l.scheduled(s, id, 4, 0);
            l.end_step(s);
            l.produced(s, id, 1);
            l.finished(Some(s), id, Finish::Length);
            assert_eq!(s, i as u64 + 1);
        }
        let d = l.document_of(&["b", "nobody", "b"]);
        assert_eq!(d.requests.len(), 1);
        assert_eq!(d.requests[0].id, "b");
        let steps: Vec<u64> = d.steps.iter().map(|s| s.step).collect();
        // b was queued within step 1 (in flight when it arrived) and lived through step 2.
        assert_eq!(steps, [1, 2]);
        // The same record as the whole document's (its clock readings placed on the wall
        // clock by that document's own reading: compared apart from them).
        let whole = l.document(0);
        let untimed = |r: &RequestRecord| RequestRecord {
            queued_unix_ns: None,
            first_scheduled_unix_ns: None,
            first_token_unix_ns: None,
            last_token_unix_ns: None,
            finished_unix_ns: None,
            ..r.clone()
        };
        assert_eq!(untimed(get(&whole, "b")), untimed(&d.requests[0]));
    }

    #[test]
    fn steps_after_gives_each_ended_step_once_stops_at_one_in_flight_and_counts_the_lost() {
        let mut l = log(16, 16);
        let nums = |a: &StepsAfter| a.steps.iter().map(|s| s.step).collect::<Vec<_>>();
        for _ in 0..3 {
            let s = l.begin_step(0);
            l.end_step(s);
        }
        // Step 4 in flight, 5 begun after it (async scheduling) and ended first.
        let four = l.begin_step(0);
        let five = l.begin_step(0);
        l.end_step(five);
        let a = l.steps_after(0);
        assert_eq!((nums(&a), a.through, a.lost), (vec![1, 2, 3], 3, 0));
        // Nothing new: nothing again.
        assert!(l.steps_after(a.through).steps.is_empty());
        l.end_step(four);
        let b = l.steps_after(a.through);
        assert_eq!((nums(&b), b.through), (vec![4, 5], 5));
        // 20 more steps through a ring of 16: those pushed out are counted, not returned.
        for _ in 0..20 {
            let s = l.begin_step(0);
            l.end_step(s);
        }
        let c = l.steps_after(b.through);
        assert_eq!((c.steps.len(), c.through, c.lost), (16, 25, 4));
        assert_eq!(c.steps[0].step, 10);
    }

    #[test]
    fn engines_finish_reasons_read_by_one_table() {
        for (name, want) in [
            ("STOP", Finish::Stop),
            ("stop", Finish::Stop),
            ("FINISH_MATCHED_TOKEN", Finish::Stop),
            ("FINISH_MATCHED_STR", Finish::Stop),
            ("eos", Finish::Stop),
            ("LENGTH", Finish::Length),
            ("FINISH_LENGTH", Finish::Length),
            ("FINISHED_LENGTH_CAPPED", Finish::Length),
            ("FINISHED_ABORTED", Finish::Abort),
            ("FINISH_ABORT", Finish::Abort),
            ("abort", Finish::Abort),
            ("FINISHED_ERROR", Finish::Error),
            ("REPETITION", Finish::Other),
        ] {
            assert_eq!(Finish::from_name(name), want, "{name}");
        }
    }

    #[test]
    fn long_ids_are_kept_to_their_first_bytes_and_still_told_apart() {
        let mut l = log(16, 16);
        let a = "x".repeat(100);
        let b = format!("{}y", "x".repeat(99));
        l.arrived(&a, 1, None);
        l.arrived(&b, 2, None);
        let s = l.begin_step(0);
        l.scheduled(s, &b, 2, 0);
        l.end_step(s);
        let d = l.document(0);
        assert_eq!(d.requests.len(), 2);
        assert!(d.requests.iter().all(|r| r.id.len() == ID_BYTES));
        assert_eq!(d.requests[0].first_scheduled_step, None);
        assert_eq!(d.requests[1].first_scheduled_step, Some(1));
    }

    #[test]
    fn the_rings_keep_the_latest_and_count_running_requests_dropped() {
        let mut l = log(16, 16);
        for i in 0..40 {
            l.arrived(&format!("r{i}"), 1, None);
            if i < 30 {
                l.finished(None, &format!("r{i}"), Finish::Stop);
            }
        }
        // r0..r23 finished before their slots were taken: nothing running was dropped.
        assert_eq!(l.document(0).evicted_running, 0);
        let d = l.document(0);
        let ids: Vec<&str> = d.requests.iter().map(|r| r.id.as_str()).collect();
        let want: Vec<String> = (24..40).map(|i| format!("r{i}")).collect();
        assert_eq!(ids, want);
        for i in 40..56 {
            l.arrived(&format!("r{i}"), 1, None);
        }
        // The slots of r24..r39 are taken: r30..r39 were running.
        assert_eq!(l.document(0).evicted_running, 10);
        for i in 0..20 {
            let s = l.begin_step(0);
            l.end_step(s);
            assert_eq!(s, i + 1);
        }
        let d = l.document(0);
        assert_eq!(d.steps.first().map(|s| s.step), Some(5));
        assert_eq!(d.steps.len(), 16);
        assert_eq!(
            d.recorded,
            Counts {
                requests: 56,
                steps: 20
            }
        );
        assert!(l.memory_bytes() > 16 * ID_BYTES);
    }

    #[test]
    fn the_id_table_finds_every_request_the_ring_holds_through_any_churn() {
        // A model: the last 32 arrivals are findable, older ones are not.
        let mut l = log(32, 16);
        let mut seqs: HashMap<String, u64> = HashMap::new();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for n in 1..=5_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Ids repeat (a reused id after its end), so the table sees deletions anywhere.
            let id = format!("req-{}", x % 97);
            let held = seqs.get(&id).is_some_and(|&s| s + 32 > l.next_seq);
            if held {
                l.finished(None, &id, Finish::Stop);
            }
            l.arrived(&id, 1, None);
            seqs.insert(id, l.next_seq);
            assert_eq!(l.next_seq, n);
            for (id, &seq) in &seqs {
                let hash = l.hasher.hash_one(id.as_bytes());
                let found = l.find(hash, id.as_bytes()).map(|at| l.requests[at].seq);
                let want = (seq + 32 > l.next_seq).then_some(seq);
                assert_eq!(found, want, "{id} at arrival {n}");
            }
        }
    }

    #[test]
    fn the_config_takes_true_false_or_sizes_and_names_a_bad_one() {
        use crate::config::{ProfilerConfig, REQUEST_LOG_SIZE};
        let size = |requests, steps| Some(RequestLogSize { requests, steps });
        for (json, want) in [
            (
                r#"{"stepscope": {"requests": true}}"#,
                Some(REQUEST_LOG_SIZE),
            ),
            (r#"{"stepscope": {"requests": false}}"#, None),
            (r#"{"stepscope": {}}"#, None),
            (
                r#"{"stepscope": {"requests": {"steps": 100}}}"#,
                size(4096, 100),
            ),
            (
                r#"{"stepscope": {"requests": {"requests": 64, "steps": 32}}}"#,
                size(64, 32),
            ),
        ] {
            let cfg = ProfilerConfig::from_json_str(json).unwrap();
            assert_eq!(cfg.stepscope.requests, want, "{json}");
        }
        for (bad, field) in [
            (r#"{"stepscope": {"requests": 5}}"#, "stepscope.requests"),
            (
                r#"{"stepscope": {"requests": {"steps": 8}}}"#,
                "stepscope.requests.steps",
            ),
            (
                r#"{"stepscope": {"requests": {"requests": -1}}}"#,
                "stepscope.requests.requests",
            ),
            (
                r#"{"stepscope": {"requests": {"step": 100}}}"#,
                "stepscope.requests.step",
            ),
        ] {
            let e = ProfilerConfig::from_json_str(bad).unwrap_err();
            assert_eq!(e.field(), Some(field), "{bad}: {e}");
        }
    }

    #[test]
    fn a_written_document_reads_back_whole_and_a_failed_write_names_its_file() {
        let mut l = log(16, 16);
        l.arrived("a", 4, None);
        let s = l.begin_step(0);
        l.scheduled(s, "a", 4, 0);
        l.end_step(s);
        let dir = std::env::temp_dir().join(format!("stepscope-requests-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("engine0.1.requests.json");
        l.write_document(&path, 0).unwrap();
        let back: RequestsDocument =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        // (Times are the clock's reading of each call: compared by what they hold.)
        assert_eq!((back.step_index, back.steps.len()), (1, 1));
        assert_eq!(
            (
                back.requests[0].id.as_str(),
                back.requests[0].prefill_tokens
            ),
            ("a", 4)
        );
        // Only the file: its temporary is gone.
        let names: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
        assert_eq!(names.len(), 1);
        let missing = dir.join("no-such-dir").join("x.requests.json");
        let e = l.write_document(&missing, 0).unwrap_err();
        assert!(e.to_string().contains("no-such-dir"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_empty_step_is_taken_back_so_that_polls_keep_no_room() {
        let mut l = log(16, 16);
        l.arrived("a", 4, None);
        let s = l.begin_step(1);
        l.scheduled(s, "a", 4, 0);
        l.end_step(s);
        // A thousand polls that schedule nothing leave the ring as it was.
        for _ in 0..1000 {
            let e = l.begin_step(0);
            assert!(l.discard_step(e));
        }
        let d = l.document(0);
        assert_eq!((d.step_index, d.steps.len()), (1, 1));
        // A step that scheduled someone, or is not the last begun, stays.
        let kept = l.begin_step(0);
        l.scheduled(kept, "a", 1, 4);
        assert!(!l.discard_step(kept));
        let older = l.begin_step(0);
        let newer = l.begin_step(0);
        assert!(!l.discard_step(older));
        assert!(l.discard_step(newer));
        assert_eq!(l.document(0).step_index, 3);
    }
}
