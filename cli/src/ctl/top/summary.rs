//! Each worker's statistics over a span of its timeline: steps per second, step p50/p99/max,
//! the batch's requests and tokens, and stragglers (the rule `stepscope analyze` uses for
//! ranks, over the workers' p50s).

use serde::Serialize;
use stepscope_format::timeline::TimelineStep;

use crate::ctl::answers::WorkerTimeline;
use crate::stats::{percentile, stragglers};

/// One worker's line of `ctl top`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    pub url: String,
    pub worker_name: String,
    pub rank: Option<i64>,
    pub phase: String,
    pub step_index: u64,
    /// Whether the worker keeps a timeline (`"stepscope": {"timeline": ...}`).
    pub timeline: bool,
    /// Steps that began in the window.
    pub steps: usize,
    /// The window's first and last step.
    pub first_step: Option<u64>,
    pub last_step: Option<u64>,
    pub steps_per_s: f64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
    /// The slowest step of the window.
    pub max_step: Option<u64>,
    /// Mean requests per step (prefill and decode).
    pub mean_requests: Option<f64>,
    /// Mean tokens per step.
    pub mean_tokens: Option<f64>,
    /// p50 at least 1.2× the median of the workers' p50s (two workers or more).
    pub straggler: bool,
}

/// Which steps the statistics cover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Span {
    /// Those that began in the last this many ns of each server's clock.
    Last(u64),
    /// Those after this step index (every worker's).
    SinceStep(u64),
}

/// Each worker over the steps `span` covers.
pub fn summarize(workers: &[WorkerTimeline], span: Span) -> Vec<Row> {
    let mut rows: Vec<Row> = workers
        .iter()
        .map(|w| {
            let end = w.now_unix_ns;
            let in_window: Vec<&TimelineStep<String>> = w
                .steps
                .iter()
                .flatten()
                .filter(|s| match span {
                    Span::Last(ns) => {
                        s.start_unix_ns >= end.saturating_sub(ns) && s.start_unix_ns <= end
                    }
                    Span::SinceStep(after) => s.step > after,
                })
                .collect();
            // Steps per second over the window, or over the span the steps cover.
            let seconds = match span {
                Span::Last(ns) => ns as f64 / 1e9,
                Span::SinceStep(_) => match (in_window.first(), in_window.last()) {
                    (Some(a), Some(b)) => {
                        (b.start_unix_ns + b.duration_ns).saturating_sub(a.start_unix_ns) as f64
                            / 1e9
                    }
                    _ => 0.0,
                },
            };
            let mut ms: Vec<f64> = in_window
                .iter()
                .map(|s| s.duration_ns as f64 / 1e6)
                .collect();
            ms.sort_by(f64::total_cmp);
            let n = in_window.len();
            let mean = |f: fn(&TimelineStep<String>) -> u64| {
                (n > 0).then(|| in_window.iter().map(|s| f(s) as f64).sum::<f64>() / n as f64)
            };
            let slowest = in_window.iter().max_by_key(|s| s.duration_ns);
            Row {
                url: w.url.clone(),
                worker_name: w.worker_name.clone(),
                rank: w.rank,
                phase: w.phase.clone(),
                step_index: w.step_index,
                timeline: w.steps.is_some(),
                steps: n,
                first_step: in_window.iter().map(|s| s.step).min(),
                last_step: in_window.iter().map(|s| s.step).max(),
                steps_per_s: if seconds > 0.0 {
                    n as f64 / seconds
                } else {
                    0.0
                },
                p50_ms: percentile(&ms, 50.0),
                p99_ms: percentile(&ms, 99.0),
                max_ms: ms.last().copied(),
                max_step: slowest.map(|s| s.step),
                mean_requests: mean(TimelineStep::requests),
                mean_tokens: mean(TimelineStep::tokens),
                straggler: false,
            }
        })
        .collect();
    let p50s: Vec<Option<f64>> = rows.iter().map(|r| r.p50_ms).collect();
    for (r, straggler) in rows.iter_mut().zip(stragglers(&p50s)) {
        r.straggler = straggler;
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctl::top::render_top;
    use crate::ctl::top::testing::worker;

    #[test]
    fn a_window_counts_its_steps_and_marks_the_straggler() {
        let now = 1_000_000_000_000;
        let workers = [
            worker("a", 0, &[5, 5, 5, 6, 40], now),
            worker("b", 1, &[5, 5, 6, 6, 5], now),
            worker("c", 2, &[9, 9, 9, 9, 9], now),
        ];
        let rows = summarize(&workers, Span::Last(1_000_000_000));
        let by = |n: &str| rows.iter().find(|r| r.worker_name == n).unwrap();
        assert_eq!(by("a").steps, 5);
        assert_eq!(by("a").p50_ms, Some(5.0));
        assert_eq!(by("a").max_ms, Some(40.0));
        assert_eq!(by("a").max_step, Some(5));
        assert_eq!(by("a").p99_ms, Some(40.0));
        assert_eq!(by("a").mean_requests, Some(4.0));
        assert_eq!(by("a").mean_tokens, Some(103.0));
        assert!((by("a").steps_per_s - 5.0).abs() < 1e-9);
        // Median of p50s (5, 5, 9) is 5: 9 >= 6 marks c, not a (its one slow step is no
        // straggler's).
        assert!(by("c").straggler && !by("a").straggler && !by("b").straggler);
        // Only the last 25 ms: the last two steps (starting 20 and 10 ms before now).
        let rows = summarize(&workers, Span::Last(25_000_000));
        assert_eq!(rows[0].steps, 2);
        // After step 3: steps 4 and 5, 10 ms apart, the last 40 ms long: 2 steps in 50 ms.
        let rows = summarize(&workers, Span::SinceStep(3));
        assert_eq!((rows[0].first_step, rows[0].last_step), (Some(4), Some(5)));
        assert!(
            (rows[0].steps_per_s - 40.0).abs() < 1e-9,
            "{}",
            rows[0].steps_per_s
        );
    }

    #[test]
    fn one_worker_is_nobodys_straggler_and_an_off_timeline_shows() {
        let now = 5_000_000_000;
        let mut off = worker("off", 1, &[], now);
        off.steps = None;
        let rows = summarize(
            &[worker("a", 0, &[50, 50], now), off],
            Span::Last(1_000_000_000),
        );
        assert!(!rows[0].straggler);
        assert!(!rows[1].timeline && rows[1].p50_ms.is_none());
        let table = render_top(&rows, &[], Span::Last(1_000_000_000));
        assert!(table.contains("timeline off"), "{table}");
    }
}
