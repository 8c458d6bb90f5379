//! What a session records, from the config ([`SessionOptions`]), and what a capture in
//! progress carries into its trace's header and manifest ([`Session`]).

use std::sync::Arc;

use super::kineto::Options;
use super::op_table;
use super::schedule::TorchSchedule;
use crate::config::{ProfilerConfig, Serializer, TorchActivity};
use crate::schedule::{CutShort, SlowStepSeen};
use crate::trace::{Captured, StepRequests};

/// The capture in progress: what goes into the trace's metadata and the manifest.
pub(super) struct Session {
    /// The worker and the steps captured so far.
    pub(super) captured: Captured,
    pub(super) trace_name: Option<String>,
    pub(super) start_unix_ns: u128,
    /// The slow step this capture follows.
    pub(super) trigger: Option<SlowStepSeen>,
    /// The requests (`stepscope.request_ids`) and work of each captured iteration, in step
    /// order.
    pub(super) steps: Vec<StepRequests>,
    /// Why the capture ended early, when the budget ended it.
    pub(super) cut_short: Option<CutShort>,
    /// What the capture holds in memory at its peak, as the profiler projected it.
    pub(super) held_bytes: u64,
}

/// What a session records, from the config: changeable between sessions
/// ([`Backend::reconfigure`](crate::backend::Backend::reconfigure)), unlike where traces go.
pub(super) struct SessionOptions {
    /// `torch_profiler_activities`; `None`: CPU, and CUDA when libtorch sees a device.
    activities: Option<Vec<TorchActivity>>,
    /// The options with the activities as configured (CUDA added at start when defaulted).
    pub(super) options: Options,
    dump_device_time_total: bool,
    pub(super) schedule: Option<TorchSchedule>,
    /// The config as JSON, for the manifests (shared, never copied on the engine thread).
    pub(super) config: Arc<serde_json::Value>,
}

impl SessionOptions {
    pub(super) fn from_config(config: &ProfilerConfig) -> Self {
        let schedule =
            (config.warmup_iterations > 0 || config.wait_iterations > 0).then_some(TorchSchedule {
                wait: config.wait_iterations,
                warmup: config.warmup_iterations,
                active: config.active_iterations,
            });
        let activities = config.torch_profiler_activities.clone();
        let has = |a| {
            activities
                .as_ref()
                .map_or(a == TorchActivity::Cpu, |l| l.contains(&a))
        };
        let options = Options {
            cpu: has(TorchActivity::Cpu),
            cuda: has(TorchActivity::Cuda),
            xpu: has(TorchActivity::Xpu),
            privateuse1: has(TorchActivity::PrivateUse1),
            record_shapes: config.torch_profiler_record_shapes,
            profile_memory: config.torch_profiler_with_memory,
            with_stack: config.torch_profiler_with_stack,
            with_flops: config.torch_profiler_with_flops,
            with_modules: config.stepscope.torch_with_modules,
            // Decided in resolve(), once the activities are known.
            trace_only: false,
        };
        SessionOptions {
            activities,
            options,
            dump_device_time_total: config.torch_profiler_dump_cuda_time_total,
            schedule,
            config: Arc::new(serde_json::to_value(config).unwrap_or(serde_json::Value::Null)),
        }
    }

    /// The options for a session, with the default activities resolved (CUDA when libtorch
    /// sees a device, as torch.profiler's default). torch's `trace_only` is asked for where the
    /// torch has it and nothing reads what it leaves out: modules need the event tree, memory
    /// and flops args are added with the event list, and the op table reads that list. Python
    /// frames need the tree for their `"Python parent id"`, which stepscope's serializer writes
    /// itself where the capture lacks it and the glue says it does (`writes_python_parents`:
    /// torch 2.13; `cpp/kineto_writer.h`, `PythonParents`); Kineto's own writer does not, nor
    /// the copy `Compare` writes with it. A table of CPU time (CPU the only activity) is made
    /// from the CPU events stepscope's serializer keeps as it writes them (`TableRows`: what
    /// torch's list holds of such a capture, held against torch's table by
    /// `tests/python/test_op_table.py`); a table of device time still reads torch's list (its
    /// device columns are held against torch's only where a GPU is).
    pub(super) fn resolve(
        &mut self,
        cuda_available: bool,
        has_trace_only: bool,
        writes_python_parents: bool,
        serializer: Serializer,
    ) {
        if self.activities.is_none() {
            self.options.cuda = cuda_available;
        }
        let o = &self.options;
        let ours = serializer == Serializer::Stepscope;
        let parents_written = writes_python_parents && ours;
        let table = self.table();
        let rows_kept = ours && table == Some(op_table::SortBy::SelfCpu);
        let needs_events = (o.with_stack && !parents_written)
            || o.with_modules
            || o.profile_memory
            || o.with_flops
            || (table.is_some() && !rows_kept);
        self.options.trace_only = has_trace_only && !needs_events;
    }

    /// Whether the op table is made from the rows stepscope's serializer keeps of the
    /// activities it writes: where there is a table and the finalize builds no event list
    /// (`resolve`).
    pub(super) fn table_from_activities(&self) -> bool {
        self.options.trace_only && self.table().is_some()
    }

    /// vLLM's choice of table: device time when any device activity is recorded (and the dump
    /// is on), else CPU time when CPU is the only activity.
    pub(super) fn table(&self) -> Option<op_table::SortBy> {
        let o = &self.options;
        let devices = [o.cuda, o.xpu, o.privateuse1];
        if devices.iter().any(|d| *d) && self.dump_device_time_total {
            Some(op_table::SortBy::SelfDevice)
        } else if o.cpu && !devices.iter().any(|d| *d) {
            Some(op_table::SortBy::SelfCpu)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    /// Whether a session asks torch for `trace_only`, under a torch that has it (`has`), on a
    /// machine with CUDA or without: a GPU capture without stacks and without the device dump,
    /// with `changes` over it.
    fn trace_only(changes: Value, cuda: bool, has: bool) -> bool {
        trace_only_where(changes, cuda, has, true)
    }

    /// The same, where the glue writes Python parents or not (`parents`).
    fn trace_only_where(changes: Value, cuda: bool, has: bool, parents: bool) -> bool {
        let mut config = json!({
            "profiler": "torch",
            "torch_profiler_dir": "/nonexistent",
            "torch_profiler_with_stack": false,
            "torch_profiler_dump_cuda_time_total": false,
        });
        if let (Some(base), Value::Object(changes)) = (config.as_object_mut(), changes) {
            base.extend(changes);
        }
        let config = ProfilerConfig::from_json_str(&config.to_string()).expect("a valid config");
        let mut options = SessionOptions::from_config(&config);
        options.resolve(cuda, has, parents, config.stepscope.serializer);
        options.options.trace_only
    }

    #[test]
    fn trace_only_is_asked_for_only_where_nothing_reads_torchs_event_list() {
        assert!(trace_only(json!({}), true, true));
        assert!(trace_only(
            json!({"torch_profiler_record_shapes": true}),
            true,
            true
        ));
        // CUDA listed on a machine without it: the activities decide the table, not the device.
        let listed = json!({"torch_profiler_activities": ["CPU", "CUDA"]});
        assert!(trace_only(listed, false, true));
        // Stacks need the event tree for their parents unless stepscope's serializer writes
        // them (the default, where the glue's torch is 2.13); Kineto's own does not, nor the
        // copy Compare writes with it.
        let stacks = json!({"torch_profiler_with_stack": true});
        assert!(trace_only(stacks.clone(), true, true));
        assert!(!trace_only_where(stacks, true, true, false));
        assert!(trace_only_where(json!({}), true, true, false));
        for serializer in ["kineto", "compare"] {
            let by = json!({"torch_profiler_with_stack": true,
                            "stepscope": {"serializer": serializer}});
            assert!(!trace_only(by, true, true), "{serializer}");
            let without = json!({"stepscope": {"serializer": serializer}});
            assert!(trace_only(without, true, true), "{serializer}");
        }
        // Modules need the event tree; memory and flops args come with the list.
        for needs in [
            json!({"stepscope": {"torch_with_modules": true}}),
            json!({"torch_profiler_with_memory": true}),
            json!({"torch_profiler_with_flops": true}),
        ] {
            assert!(!trace_only(needs.clone(), true, true), "{needs}");
        }
        // A table of device time (the device dump on) reads the list; one of CPU time (CPU the
        // only activity: vLLM writes that table regardless) is made from the rows stepscope's
        // serializer keeps, and Kineto's writer keeps none.
        let dump = json!({"torch_profiler_dump_cuda_time_total": true});
        assert!(!trace_only(dump, true, true));
        assert!(trace_only(json!({}), false, true));
        let cpu = json!({"torch_profiler_activities": ["CPU"]});
        assert!(trace_only(cpu.clone(), true, true));
        let by_kineto = json!({"torch_profiler_activities": ["CPU"],
                               "stepscope": {"serializer": "kineto"}});
        assert!(!trace_only(by_kineto, true, true));
        // vLLM's default: stacks, and the dump on; on a CPU, a table of CPU time.
        let default = json!({"torch_profiler_with_stack": true,
                             "torch_profiler_dump_cuda_time_total": true});
        assert!(!trace_only(default.clone(), true, true));
        assert!(trace_only(default.clone(), false, true));
        assert!(!trace_only_where(default, false, true, false));
        // A torch without the switch.
        assert!(!trace_only(json!({}), true, false));
    }
}
