//! Shared helpers for the integration tests.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::sync::Arc;
use std::thread::ThreadId;

use parking_lot::Mutex;
use stepscope::backend::{Backend, CaptureStart};
use stepscope::{Error, IterationInfo, ProfilerConfig, Result, WorkerProfiler};

/// One call a backend received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    Start { first_step: u64 },
    Stop,
    Advance,
    Begin { step: u64, info: IterationInfo },
    End,
    Pause,
    Resume,
}

/// A captured step and the request ids it was told.
pub type StepRequests = (u64, Vec<String>);

/// A backend that records every call with the thread it came on, and fails starts on request.
#[derive(Clone, Default)]
pub struct Recording {
    pub calls: Arc<Mutex<Vec<(Call, ThreadId)>>>,
    /// Outcomes for the next starts: `false` fails one. Empty: starts succeed.
    pub start_plan: Arc<Mutex<VecDeque<bool>>>,
    pub fail_stops: Arc<Mutex<bool>>,
    /// The annotation name of each `Begin`, in order.
    pub names: Arc<Mutex<Vec<String>>>,
    /// The slow step each start followed (`None` for starts no trigger made).
    pub triggers: Arc<Mutex<Vec<Option<stepscope::SlowStepSeen>>>>,
    /// The requests each captured step was told, in order.
    pub requests: Arc<Mutex<Vec<StepRequests>>>,
    /// The capture budget's cuts, in order.
    pub cuts: Arc<Mutex<Vec<stepscope::schedule::CutShort>>>,
}

impl Recording {
    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().iter().map(|(c, _)| c.clone()).collect()
    }

    /// Only starts and stops, the calls that matter to the schedule.
    pub fn lifecycle(&self) -> Vec<Call> {
        self.calls()
            .into_iter()
            .filter(|c| {
                matches!(
                    c,
                    Call::Start { .. } | Call::Stop | Call::Pause | Call::Resume
                )
            })
            .collect()
    }

    pub fn threads_of(&self, pred: impl Fn(&Call) -> bool) -> Vec<ThreadId> {
        self.calls
            .lock()
            .iter()
            .filter(|(c, _)| pred(c))
            .map(|(_, t)| *t)
            .collect()
    }

    pub fn fail_next_start(&self) {
        self.start_plan.lock().push_back(false);
    }

    /// Arms exactly one failing start, replacing any unused plan (the property tests' models
    /// hold one armed failure at a time).
    pub fn fail_only_next_start(&self) {
        let mut plan = self.start_plan.lock();
        plan.clear();
        plan.push_back(false);
    }

    /// Drops an unused plan: starts succeed again.
    pub fn clear_start_plan(&self) {
        self.start_plan.lock().clear();
    }

    /// Steps whose iteration was annotated.
    pub fn captured_steps(&self) -> Vec<u64> {
        self.calls()
            .into_iter()
            .filter_map(|c| match c {
                Call::Begin { step, .. } => Some(step),
                _ => None,
            })
            .collect()
    }

    fn push(&self, c: Call) {
        self.calls.lock().push((c, std::thread::current().id()));
    }
}

impl Backend for Recording {
    fn name(&self) -> &str {
        "recording"
    }
    fn start(&mut self, capture: &CaptureStart<'_>) -> Result<()> {
        self.push(Call::Start {
            first_step: capture.first_step,
        });
        self.triggers.lock().push(capture.trigger);
        if self.start_plan.lock().pop_front() == Some(false) {
            return Err(Error::backend("recording", "start failed on request"));
        }
        Ok(())
    }
    fn stop(&mut self) -> Result<()> {
        self.push(Call::Stop);
        if *self.fail_stops.lock() {
            return Err(Error::backend("recording", "stop failed on request"));
        }
        Ok(())
    }
    fn advance(&mut self) {
        self.push(Call::Advance);
    }
    fn pause(&mut self) -> Result<()> {
        self.push(Call::Pause);
        Ok(())
    }
    fn resume(&mut self) -> Result<()> {
        self.push(Call::Resume);
        Ok(())
    }
    fn begin_iteration(&mut self, step: u64, info: &IterationInfo, name: &str) {
        self.names.lock().push(name.to_string());
        self.push(Call::Begin { step, info: *info });
    }
    fn end_iteration(&mut self) {
        self.push(Call::End);
    }
    fn window_ends(&mut self, end: &stepscope::backend::WindowEnd) {
        if let Some(cut) = end.cut_short {
            self.cuts.lock().push(cut);
        }
    }
    fn record_requests(&mut self, step: u64, requests: &dyn stepscope::RequestIds) {
        let mut ids = Vec::new();
        requests.for_each_id(&mut |id| ids.push(id.to_string()));
        self.requests.lock().push((step, ids));
    }
}

/// A backend that only reads each iteration's name, as a trace backend does: the profiler's
/// own cost with names formatted (`benches/step.rs`, `tests/no_alloc.rs`).
pub struct ReadsNames;

impl Backend for ReadsNames {
    fn name(&self) -> &str {
        "reads-names"
    }
    fn start(&mut self, _: &CaptureStart<'_>) -> Result<()> {
        Ok(())
    }
    fn stop(&mut self) -> Result<()> {
        Ok(())
    }
    fn begin_iteration(&mut self, _step: u64, _info: &IterationInfo, name: &str) {
        std::hint::black_box(name);
    }
}

/// A profiler over a recording backend, with config JSON.
pub fn profiler(config_json: &str) -> (WorkerProfiler, Recording) {
    let cfg = ProfilerConfig::from_json_str(config_json).expect("valid test config");
    let rec = Recording::default();
    let p = WorkerProfiler::with_backend(&cfg, "test-worker", Box::new(rec.clone()));
    (p, rec)
}

/// Steps `n` times with unknown counts; returns whether each step was captured.
pub fn steps(p: &WorkerProfiler, n: usize) -> Vec<bool> {
    (0..n)
        .map(|_| p.step(&IterationInfo::default()).is_captured())
        .collect()
}
