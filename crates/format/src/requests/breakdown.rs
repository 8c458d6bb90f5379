//! One request's breakdown from its engine's request log: where its time went (queue, prefill,
//! decode, preemptions) and the steps that cost it most, with what they carried. No I/O. What
//! `stepscope ctl requests`, `analyze --requests` and the OpenTelemetry spans (`spans.rs`) read.

use std::collections::HashMap;

use super::document::{EngineStep, RequestRecord, RequestsDocument, ScheduledAs};
use serde::Serialize;

/// What requests are ranked by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RankBy {
    /// Time to first token: arrival to the end of the step that gave it.
    Ttft,
    /// End to end: arrival to the end.
    E2e,
    /// The longest gap between two of its tokens.
    Itl,
    /// Queue wait: reaching the scheduler to its first scheduling.
    Queue,
}

/// A stretch of a request's life: how many engine steps, and how long.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Stretch {
    /// Engine steps.
    pub steps: u32,
    /// Its length, ms.
    pub ms: f64,
}

/// What a request did in one step it lived through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Lived {
    /// It waited through it, to reach the scheduler or in its queue.
    Waiting,
    /// It was scheduled in prefill (a chunk of its prompt).
    Prefill,
    /// It was scheduled in decode.
    Decode,
    /// It was preempted, waiting to be scheduled again.
    Preempted,
}

/// One step a request lived through, with what the step carried.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepCost {
    /// The step's index.
    pub step: u64,
    /// What the request did in it.
    pub role: Lived,
    /// The step's duration, ms.
    pub ms: f64,
    /// Requests it scheduled.
    pub requests: u32,
    /// Tokens it scheduled.
    pub tokens: u32,
    /// Of which requests in prefill.
    pub prefill_reqs: u32,
    /// Their tokens.
    pub prefill_tokens: u32,
    /// Requests in decode.
    pub decode_reqs: u32,
    /// Its largest prefill chunk, tokens.
    pub largest_prefill_tokens: u32,
    /// Whose it was, while the log holds that request.
    pub largest_prefill_request: Option<String>,
    /// The largest prefill chunk is this request's own.
    pub own_prefill: bool,
}

/// A request's breakdown.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RequestBreakdown {
    /// The server it ran on.
    pub server: String,
    /// The request's id.
    pub id: String,
    /// The log lost the start of it (see `RequestRecord::partial`): the figures it missed are
    /// absent.
    pub partial: bool,
    /// Its prompt, tokens.
    pub prompt_tokens: Option<u32>,
    /// Of which the engine had cached.
    pub cached_tokens: Option<u32>,
    /// Tokens it produced.
    pub output_tokens: Option<u32>,
    /// Arrival at the API server (else the scheduler's queue) to its first token.
    pub ttft_ms: Option<f64>,
    /// Arrival to its end (finished requests).
    pub e2e_ms: Option<f64>,
    /// Its arrival at the API server to reaching the scheduler's queue: an engine takes new
    /// requests in between steps, so a request arriving during a step waits for its end; the
    /// steps are those it waited through.
    pub intake: Option<Stretch>,
    /// Its queue wait: reaching the scheduler to the start of the step that first scheduled
    /// it; the steps are those it waited through.
    pub queue: Option<Stretch>,
    /// First scheduled to the end of the step that gave its first token; the steps are its
    /// prefill chunks.
    pub prefill: Option<Stretch>,
    /// Its first token to its last; the steps are its decode steps.
    pub decode: Option<Stretch>,
    /// Its decode steps' mean duration, ms.
    pub decode_step_mean_ms: Option<f64>,
    /// Its longest decode step, ms.
    pub decode_step_max_ms: Option<f64>,
    /// The longest gap between two of its tokens (the ends of the steps that gave them).
    pub itl_max_ms: Option<f64>,
    /// The steps that preempted it.
    pub preempted_at: Vec<u64>,
    /// The steps that scheduled it again after each preemption.
    pub resumed_at: Vec<u64>,
    /// Why it finished; `None` while it runs.
    pub finish: Option<String>,
    /// The steps that cost it most, longest first: for `--by itl` its decode steps, else every
    /// step from its arrival to its first token (`ttft`, `queue`) or its end (`e2e`).
    pub costliest: Vec<StepCost>,
    /// Its steps the log no longer holds (it lived longer than the ring keeps steps).
    pub steps_missing: u64,
}

impl RequestBreakdown {
    /// The figure `by` ranks by.
    pub fn key(&self, by: RankBy) -> Option<f64> {
        match by {
            RankBy::Ttft => self.ttft_ms,
            RankBy::E2e => self.e2e_ms,
            RankBy::Itl => self.itl_max_ms,
            RankBy::Queue => self.queue.map(|q| q.ms),
        }
    }
}

fn ns_ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

fn span_ms(from: Option<u64>, to: Option<u64>) -> Option<f64> {
    Some(ns_ms(to?.saturating_sub(from?)))
}

/// The breakdowns of `doc`'s requests (from server `server`), each with up to `keep` of its
/// costliest steps for `by` (`Some(0)`: all of them, in order; `None`: every step it lived
/// through, in order, whatever `by`).
pub fn breakdowns(
    server: &str,
    doc: &RequestsDocument,
    by: RankBy,
    keep: Option<usize>,
) -> Vec<RequestBreakdown> {
    let steps: HashMap<u64, &EngineStep> = doc.steps.iter().map(|s| (s.step, s)).collect();
    doc.requests
        .iter()
        .map(|r| breakdown(server, r, doc, &steps, by, keep))
        .collect()
}

pub(super) fn breakdown(
    server: &str,
    r: &RequestRecord,
    doc: &RequestsDocument,
    steps: &HashMap<u64, &EngineStep>,
    by: RankBy,
    keep: Option<usize>,
) -> RequestBreakdown {
    let start = r.arrival_unix_ns.or(r.queued_unix_ns);
    let end = r.finished_unix_ns.filter(|_| r.finish.is_some());
    // The steps it lived through, from the one in flight when it arrived (an engine takes new
    // requests in between steps, so that step delays it too) to its last.
    let ended_after = |s: u64, t: u64| steps.get(&s).is_some_and(|st| st.end_unix_ns() > t);
    let mut first = r.queued_after_step.max(1);
    if let Some(t) = start {
        while first > 1 && ended_after(first - 1, t) {
            first -= 1;
        }
        if first <= r.queued_after_step && !ended_after(first, t) {
            first += 1;
        }
    }
    let last = r
        .finished_step
        .or(r.last_step)
        .unwrap_or(doc.step_index)
        .max(first);
    let lived: Vec<(u64, Lived)> = (first..=last)
        .filter_map(|s| role_in(r, s).map(|k| (s, k)))
        .collect();
    let held = |s: &u64| steps.contains_key(s);
    let steps_missing = lived.iter().filter(|(s, _)| !held(s)).count() as u64;
    let durations = |k: Lived| -> Vec<f64> {
        lived
            .iter()
            .filter(|(_, role)| *role == k)
            .filter_map(|(s, _)| steps.get(s))
            .map(|s| ns_ms(s.duration_ns))
            .collect()
    };
    // Waiting: before it reached the scheduler (intake: the steps that ended by then) and
    // after (queue).
    let ended_by = |s: u64, t: Option<u64>| {
        steps
            .get(&s)
            .zip(t)
            .is_some_and(|(st, t)| st.end_unix_ns() <= t)
    };
    let waiting = || lived.iter().filter(|(_, k)| *k == Lived::Waiting);
    let intake_steps = waiting()
        .filter(|(s, _)| ended_by(*s, r.queued_unix_ns))
        .count() as u32;
    let queued_steps = waiting().count() as u32 - intake_steps;
    let intake = r.arrival_unix_ns.and(r.queued_unix_ns).map(|_| Stretch {
        steps: intake_steps,
        ms: span_ms(r.arrival_unix_ns, r.queued_unix_ns).unwrap_or(0.0),
    });
    let queue = r
        .first_scheduled_unix_ns
        .and(r.queued_unix_ns)
        .map(|_| Stretch {
            steps: queued_steps,
            ms: span_ms(r.queued_unix_ns, r.first_scheduled_unix_ns).unwrap_or(0.0),
        });
    let prefill = r
        .first_token_unix_ns
        .and(r.first_scheduled_unix_ns)
        .map(|_| Stretch {
            steps: r.prefill_steps,
            ms: span_ms(r.first_scheduled_unix_ns, r.first_token_unix_ns).unwrap_or(0.0),
        });
    let decode = r.first_token_unix_ns.map(|_| Stretch {
        steps: r.decode_steps,
        ms: span_ms(r.first_token_unix_ns, r.last_token_unix_ns).unwrap_or(0.0),
    });
    let decoding = durations(Lived::Decode);
    let decode_step_mean_ms =
        (!decoding.is_empty()).then(|| decoding.iter().sum::<f64>() / decoding.len() as f64);
    let decode_step_max_ms = decoding.iter().copied().reduce(f64::max);
    // Token times: the ends of the step of its first token and of its decode steps.
    let mut token_ends: Vec<u64> = r
        .first_token_step
        .into_iter()
        .chain(
            lived
                .iter()
                .filter(|(_, k)| *k == Lived::Decode)
                .map(|(s, _)| *s),
        )
        .filter_map(|s| steps.get(&s).map(|st| st.end_unix_ns()))
        .collect();
    token_ends.sort_unstable();
    let itl_max_ms = token_ends
        .windows(2)
        .map(|w| ns_ms(w[1] - w[0]))
        .reduce(f64::max);

    // The steps that cost it most for `by`.
    let until = match (keep, by) {
        (Some(_), RankBy::Ttft | RankBy::Queue) => r.first_token_step.unwrap_or(last),
        _ => last,
    };
    let counts = |k: Lived| keep.is_none() || by != RankBy::Itl || k == Lived::Decode;
    let mut costs: Vec<StepCost> = lived
        .iter()
        .filter(|(s, k)| *s <= until && counts(*k))
        .filter_map(|(s, k)| steps.get(s).map(|st| cost(st, *k, &r.id)))
        .collect();
    if let Some(n) = keep.filter(|n| *n > 0) {
        costs.sort_by(|a, b| b.ms.total_cmp(&a.ms).then(a.step.cmp(&b.step)));
        costs.truncate(n);
    }
    RequestBreakdown {
        server: server.to_string(),
        id: r.id.clone(),
        partial: r.partial,
        prompt_tokens: r.prompt_tokens,
        cached_tokens: r.cached_tokens,
        output_tokens: r.output_tokens,
        ttft_ms: span_ms(start, r.first_token_unix_ns),
        e2e_ms: span_ms(start, end),
        intake,
        queue,
        prefill,
        decode,
        decode_step_mean_ms,
        decode_step_max_ms,
        itl_max_ms,
        preempted_at: r.preempted_at.clone(),
        resumed_at: r.resumed_at.clone(),
        finish: r.finish.clone(),
        costliest: costs,
        steps_missing,
    }
}

/// What request `r` did in step `s` (one after it arrived), `None` when it was not there
/// (after it ended).
fn role_in(r: &RequestRecord, s: u64) -> Option<Lived> {
    let first_sched = r.first_scheduled_step.unwrap_or(u64::MAX);
    if s < first_sched {
        // Waiting (the caller starts at the step in flight when it arrived). Unknown arrival:
        // not counted.
        let known = r.queued_unix_ns.is_some() || r.arrival_unix_ns.is_some();
        return known.then_some(Lived::Waiting);
    }
    if r.finished_step.is_some_and(|f| s > f) {
        return None;
    }
    // Out between a preemption and the step that scheduled it again.
    let out = r.preempted_at.iter().enumerate().any(|(i, &p)| {
        let back = r.resumed_at.get(i).copied().unwrap_or(u64::MAX);
        s >= p && s < back
    });
    if out {
        return Some(Lived::Preempted);
    }
    if r.last_step.is_some_and(|l| s > l) {
        // Past its last scheduling and not finished: nothing known of it.
        return None;
    }
    // The log's decision, recorded with the request.
    Some(match r.role_in(s) {
        ScheduledAs::Prefill => Lived::Prefill,
        ScheduledAs::Decode => Lived::Decode,
    })
}

fn cost(s: &EngineStep, role: Lived, id: &str) -> StepCost {
    StepCost {
        step: s.step,
        role,
        ms: ns_ms(s.duration_ns),
        requests: s.requests(),
        tokens: s.tokens(),
        prefill_reqs: s.prefill_reqs,
        prefill_tokens: s.prefill_tokens,
        decode_reqs: s.decode_reqs,
        largest_prefill_tokens: s.largest_prefill_tokens,
        own_prefill: s.largest_prefill_request.as_deref() == Some(id),
        largest_prefill_request: s.largest_prefill_request.clone(),
    }
}

/// `all` ranked by `by`, slowest first (those without the figure last, in arrival order).
pub fn rank(mut all: Vec<RequestBreakdown>, by: RankBy) -> Vec<RequestBreakdown> {
    all.sort_by(|a, b| match (a.key(by), b.key(by)) {
        (Some(x), Some(y)) => y.total_cmp(&x),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => std::cmp::Ordering::Equal,
    });
    all
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::requests::document::Counts;

    use crate::requests::fixtures::{record, step, MS};

    fn request(id: &str) -> RequestRecord {
        record(id, 0, 0)
    }

    /// A long prompt in three 100 ms chunks (steps 1-3), a short one queued during step 1,
    /// prefilled in step 4 (10 ms), decoding in 5-6 (10 ms each).
    fn doc() -> RequestsDocument {
        let steps = vec![
            step(1, 0, 100, Some((256, "long")), 0),
            step(2, 100, 100, Some((256, "long")), 0),
            step(3, 200, 100, Some((88, "long")), 0),
            step(4, 300, 10, Some((8, "short")), 1),
            step(5, 310, 10, None, 2),
            step(6, 320, 10, None, 2),
        ];
        let long = RequestRecord {
            prompt_tokens: Some(600),
            output_tokens: Some(4),
            arrival_unix_ns: Some(0),
            queued_unix_ns: Some(0),
            first_scheduled_step: Some(1),
            first_scheduled_unix_ns: Some(0),
            prefill_steps: 3,
            prefill_tokens: 600,
            first_token_step: Some(3),
            last_prefill_step: Some(3),
            first_token_unix_ns: Some(300 * MS),
            decode_steps: 3,
            last_token_unix_ns: Some(330 * MS),
            last_step: Some(6),
            finished_step: Some(6),
            finished_unix_ns: Some(330 * MS),
            finish: Some("length".into()),
            ..request("long")
        };
        let short = RequestRecord {
            prompt_tokens: Some(8),
            output_tokens: Some(3),
            arrival_unix_ns: Some(49 * MS),
            queued_unix_ns: Some(50 * MS),
            queued_after_step: 1,
            first_scheduled_step: Some(4),
            first_scheduled_unix_ns: Some(300 * MS),
            prefill_steps: 1,
            prefill_tokens: 8,
            first_token_step: Some(4),
            last_prefill_step: Some(4),
            first_token_unix_ns: Some(310 * MS),
            decode_steps: 2,
            last_token_unix_ns: Some(330 * MS),
            last_step: Some(6),
            finished_step: Some(6),
            finished_unix_ns: Some(330 * MS),
            finish: Some("length".into()),
            ..request("short")
        };
        RequestsDocument {
            pid: 1,
            step_index: 6,
            now_unix_ns: 400 * MS,
            clock: "tsc".into(),
            capacity: Counts {
                requests: 16,
                steps: 16,
            },
            recorded: Counts {
                requests: 2,
                steps: 6,
            },
            evicted_running: 0,
            steps,
            requests: vec![long, short],
        }
    }

    #[test]
    fn a_short_request_queued_behind_a_long_prefill_is_charged_its_chunks() {
        let all = breakdowns("http://h:1", &doc(), RankBy::Ttft, Some(3));
        let short = all.iter().find(|b| b.id == "short").unwrap();
        assert_eq!(short.ttft_ms, Some(261.0));
        // It arrived during step 1 and reached the queue 1 ms later, step 1 still running
        // (an engine that takes requests at any time): it waited in the queue through it.
        assert_eq!(short.intake, Some(Stretch { steps: 0, ms: 1.0 }));
        assert_eq!(
            short.queue,
            Some(Stretch {
                steps: 3,
                ms: 250.0
            })
        );
        assert_eq!(short.prefill, Some(Stretch { steps: 1, ms: 10.0 }));
        assert_eq!(short.decode, Some(Stretch { steps: 2, ms: 20.0 }));
        let costly: Vec<(u64, Lived, bool)> = short
            .costliest
            .iter()
            .map(|c| {
                (
                    c.step,
                    c.role,
                    c.largest_prefill_request.as_deref() == Some("long"),
                )
            })
            .collect();
        assert_eq!(
            costly,
            [
                (1, Lived::Waiting, true),
                (2, Lived::Waiting, true),
                (3, Lived::Waiting, true)
            ]
        );
        let long = all.iter().find(|b| b.id == "long").unwrap();
        assert_eq!(long.queue, Some(Stretch { steps: 0, ms: 0.0 }));
        assert!(long
            .costliest
            .iter()
            .all(|c| c.own_prefill && c.role == Lived::Prefill));
        assert_eq!(
            (long.decode_step_mean_ms, long.itl_max_ms),
            (Some(10.0), Some(10.0))
        );

        // Ranked by queue wait, the short request is first; by TTFT the long one (its own
        // prefill is longer than the wait it caused).
        let by_queue = rank(
            breakdowns("s", &doc(), RankBy::Queue, Some(3)),
            RankBy::Queue,
        );
        assert_eq!(by_queue[0].id, "short");
        let by_ttft = rank(breakdowns("s", &doc(), RankBy::Ttft, Some(3)), RankBy::Ttft);
        assert_eq!(by_ttft[0].id, "long");
        // By ITL only decode steps count.
        let by_itl = breakdowns("s", &doc(), RankBy::Itl, Some(0));
        assert!(by_itl
            .iter()
            .all(|b| b.costliest.iter().all(|c| c.role == Lived::Decode)));
    }

    #[test]
    fn a_step_that_ended_before_the_request_arrived_is_not_waited_through() {
        let waited = |arrival_ms: u64, queued_ms: u64, after: u64| {
            let mut d = doc();
            let short = d.requests.iter_mut().find(|r| r.id == "short").unwrap();
            short.arrival_unix_ns = Some(arrival_ms * MS);
            short.queued_unix_ns = Some(queued_ms * MS);
            short.queued_after_step = after;
            let b = breakdowns("s", &d, RankBy::Queue, Some(0))
                .into_iter()
                .find(|b| b.id == "short")
                .unwrap();
            let steps: Vec<u64> = b.costliest.iter().map(|c| c.step).collect();
            (steps, b.intake.unwrap().steps, b.queue.unwrap().steps)
        };
        // Arrived during step 2, queued once it ended (as vLLM takes requests between steps):
        // step 2 delayed its intake, step 3 its queue; step 1 had ended.
        assert_eq!(waited(150, 200, 2), (vec![2, 3, 4], 1, 1));
        // Arrived and queued during step 2 (an engine that takes requests at any time).
        assert_eq!(waited(150, 150, 2), (vec![2, 3, 4], 0, 2));
        // Arrived as step 2 ended: only step 3.
        assert_eq!(waited(200, 200, 2), (vec![3, 4], 0, 1));
    }

    #[test]
    fn a_preempted_request_is_out_from_its_preemption_to_its_return() {
        let mut d = doc();
        let short = d.requests.iter_mut().find(|r| r.id == "short").unwrap();
        short.preempted_at = vec![5];
        short.resumed_at = vec![6];
        let b = breakdowns("s", &d, RankBy::E2e, Some(0))
            .into_iter()
            .find(|b| b.id == "short")
            .unwrap();
        let roles: Vec<(u64, Lived)> = b.costliest.iter().map(|c| (c.step, c.role)).collect();
        assert_eq!(
            roles,
            [
                (1, Lived::Waiting),
                (2, Lived::Waiting),
                (3, Lived::Waiting),
                (4, Lived::Prefill),
                (5, Lived::Preempted),
                (6, Lived::Decode)
            ]
        );
        assert_eq!(b.e2e_ms, Some(281.0));
    }
}
