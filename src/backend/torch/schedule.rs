//! `torch.profiler.schedule` as vLLM uses it (one repeat): the action each step takes.

/// One step of `torch.profiler.schedule`'s action sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Action {
    /// Not profiling (wait, or the schedule is over).
    None,
    /// Kineto prepared; data discarded.
    Warmup,
    /// Collecting.
    Record,
    /// Collecting; the trace is finished when this step ends.
    RecordAndSave,
}

/// `torch.profiler.schedule(skip_first=0, wait, warmup, active, repeat=1)`, as vLLM builds it
/// when `wait_iterations` or `warmup_iterations` is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct TorchSchedule {
    pub(super) wait: u64,
    pub(super) warmup: u64,
    pub(super) active: u64,
}

impl TorchSchedule {
    pub(super) fn action(&self, step: u64) -> Action {
        let cycle = self.wait + self.warmup + self.active;
        if cycle == 0 || step >= cycle {
            return Action::None;
        }
        if step < self.wait {
            Action::None
        } else if step < self.wait + self.warmup {
            Action::Warmup
        } else if step + 1 < cycle {
            Action::Record
        } else {
            Action::RecordAndSave
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_matches_torch_for_one_repeat() {
        let s = TorchSchedule {
            wait: 1,
            warmup: 2,
            active: 2,
        };
        let got: Vec<Action> = (0..7).map(|k| s.action(k)).collect();
        use Action::*;
        assert_eq!(
            got,
            [None, Warmup, Warmup, Record, RecordAndSave, None, None]
        );
        let one = TorchSchedule {
            wait: 0,
            warmup: 1,
            active: 1,
        };
        assert_eq!(one.action(0), Warmup);
        assert_eq!(one.action(1), RecordAndSave);
        assert_eq!(one.action(2), None);
    }
}
