//! The torch backend itself: its state, how it drives Kineto through a capture (prepare,
//! enable, the iterations' ranges, the detach), the trace header and manifest it hands the
//! writer at the stop, and each call of [`Backend`].

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use super::flushed::KinetoCapture;
use super::kineto::{Kineto, Range};
use super::paths::{ensure_writable_dir, trace_dir, trace_id, unix_ns};
use super::schedule::Action;
use super::session::{Session, SessionOptions};
use crate::backend::api::{Backend, CaptureStart, WindowEnd};
use crate::config::ProfilerConfig;
use crate::error::{Error, Result};
use crate::flush::{self, HowToWrite, Job, PendingWrites, Writer};
use crate::iteration::{IterationInfo, RequestIds};
use crate::manifest::Manifest;
use crate::model::ModelShape;
use crate::trace::{Captured, StepRequests, TraceHeader, Trigger};

const NAME: &str = "torch";

/// Kineto's state as this backend drove it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KinetoState {
    Off,
    Prepared,
    Enabled,
}

/// The torch (Kineto) backend. See the module docs.
pub struct TorchBackend {
    recording: SessionOptions,
    step_num: u64,
    action: Action,
    kineto: KinetoState,
    /// The glue to Kineto, found at the first start.
    glue: Option<Kineto>,
    /// Kineto's state object of the enabled session, checked when detaching.
    enabled_id: usize,
    /// Iterations get a `RecordFunction` (only when CPU activity is recorded, as vLLM).
    annotate: bool,
    range: Option<Range>,
    range_open: bool,
    session: Option<Session>,
    local_rank: u32,
    /// Header keys set by the engine (`set_trace_metadata`), added to every trace.
    metadata: Vec<(String, String)>,
    /// The served model's shape (`set_model`), in every trace's header and manifest.
    model: Option<ModelShape>,
    writer: Writer,
    /// `stepscope.min_free_disk_mb`.
    min_free_disk_mb: u64,
    /// Who writes each capture's JSON (`stepscope.serializer`).
    serializer: crate::config::Serializer,
    /// `stepscope.max_capture_mb`, bytes: a window is not begun while the captures not yet
    /// written hold more (0: no limit).
    max_held_bytes: u64,
}

impl std::fmt::Debug for TorchBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TorchBackend")
            .field("dir", &self.writer.dir())
            .field("kineto", &self.kineto)
            .field("action", &self.action)
            .finish_non_exhaustive()
    }
}

impl TorchBackend {
    /// A backend writing to the config's `torch_profiler_dir`, which must be a local
    /// directory that exists or can be created, and is writable.
    pub fn new(config: &ProfilerConfig, local_rank: u32) -> Result<Self> {
        let dir = trace_dir(config)?;
        let writer = Writer::new(flush::Settings {
            dir,
            gzip: config
                .torch_profiler_use_gzip
                .then_some(config.stepscope.gzip_level),
            flush_timeout: config.stepscope.flush_timeout,
        });
        let recording = SessionOptions::from_config(config);
        Ok(TorchBackend {
            annotate: recording.options.cpu,
            recording,
            step_num: 0,
            action: Action::None,
            kineto: KinetoState::Off,
            glue: None,
            enabled_id: 0,
            range: None,
            range_open: false,
            session: None,
            local_rank,
            metadata: Vec::new(),
            model: None,
            writer,
            min_free_disk_mb: config.stepscope.budget.min_free_disk_mb,
            serializer: config.stepscope.serializer,
            max_held_bytes: config.capture_budget().max_growth_bytes,
        })
    }

    /// The directory traces and manifests are written to.
    pub fn dir(&self) -> &Path {
        self.writer.dir()
    }

    /// Moves Kineto from the previous schedule action to the next, as torch.profiler's
    /// action map does for one repeat.
    fn transit(&mut self, next: Action) -> Result<()> {
        let prev = std::mem::replace(&mut self.action, next);
        use Action::*;
        match (prev, next) {
            (None, Warmup) => self.prepare(),
            (None, Record | RecordAndSave) => {
                self.prepare()?;
                self.enable()
            }
            (Warmup, Record | RecordAndSave) => self.enable(),
            // The schedule ended in warmup: nothing was collected, nothing is written.
            (Warmup, None) => self.discard(),
            (Record | RecordAndSave, None) => self.finish(),
            // With one repeat (vLLM's), nothing else changes Kineto's state.
            _ => Ok(()),
        }
    }

    /// The glue, found and loaded at the first start (an error names the torch found and the
    /// versions this stepscope has glue for).
    fn glue(&mut self) -> Result<Kineto> {
        match self.glue {
            Some(k) => Ok(k),
            None => {
                let k = Kineto::get()?;
                self.glue = Some(k);
                Ok(k)
            }
        }
    }

    fn prepare(&mut self) -> Result<()> {
        self.glue()?.prepare(&self.recording.options)?;
        self.kineto = KinetoState::Prepared;
        Ok(())
    }

    fn enable(&mut self) -> Result<()> {
        let id = self
            .glue()?
            .enable(&self.recording.options)
            .inspect_err(|_| self.kineto = KinetoState::Off)?;
        self.kineto = KinetoState::Enabled;
        self.enabled_id = id;
        Ok(())
    }

    /// Ends a session that never collected (stopped during warmup): Kineto only lets a
    /// prepared profiler go through enable and disable.
    fn discard(&mut self) -> Result<()> {
        if self.kineto == KinetoState::Prepared {
            self.enable()?;
        }
        if self.kineto == KinetoState::Enabled {
            self.kineto = KinetoState::Off;
            self.glue()?.detach(self.enabled_id)?.finalize()?;
        }
        Ok(())
    }

    /// Disables Kineto and hands the session's result to the writer.
    fn finish(&mut self) -> Result<()> {
        // Record actions follow an enable; a failed enable left Kineto off.
        if self.kineto != KinetoState::Enabled {
            return Ok(());
        }
        let glue = self.glue()?;
        self.end_range();
        let stop_unix_ns = unix_ns();
        // The requests leave the session for the header, then the manifest: moved, not copied.
        let steps = self
            .session
            .as_mut()
            .map(|s| std::mem::take(&mut s.steps))
            .unwrap_or_default();
        let session = self.session.as_ref();
        let captured = session.map_or_else(
            || Captured {
                local_rank: self.local_rank,
                ..Captured::default()
            },
            |s| s.captured.clone(),
        );
        let mut header = TraceHeader {
            version: crate::VERSION.into(),
            captured: captured.clone(),
            trigger: session
                .and_then(|s| s.trigger)
                .map(|slow_step| Trigger { slow_step }),
            steps,
            cut_short: session.and_then(|s| s.cut_short),
            model: self.model.clone(),
            stop_unix_ns: u64::try_from(stop_unix_ns).ok(),
        };
        // Metadata only enters the trace while the profiler is live, so before disabling.
        // torch.profiler's own keys first (a fresh trace id, the options recorded), then the
        // engine's (vLLM's version, torch.distributed's rank), then stepscope's.
        let o = &self.recording.options;
        let flags = [
            ("profile_memory", o.profile_memory),
            ("with_stack", o.with_stack),
            ("record_shapes", o.record_shapes),
            ("with_flops", o.with_flops),
            // Not torch.profiler's: the finalize built no event list nor tree (see resolve()).
            ("trace_only", o.trace_only),
        ];
        let trace_id = format!("\"{}\"", trace_id());
        let entries = std::iter::once(("trace_id", trace_id.as_str()))
            .chain(flags.iter().filter(|(_, on)| *on).map(|(k, _)| (*k, "1")))
            .chain(self.metadata.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        // Serialized once (a header for every trace; the ids only with request_ids).
        let stepscope = serde_json::to_string(&header)
            .map_err(|e| Error::backend(NAME, format!("serializing the trace header: {e}")))?;
        for (key, value) in entries.chain(std::iter::once(("stepscope", stepscope.as_str()))) {
            if let Err(e) = glue.add_metadata(key, value) {
                log::warn!("stepscope: {e}");
            }
        }
        self.kineto = KinetoState::Off;
        // Only the cheap half of disableProfiler here; the writer finalizes the session.
        let detached = glue.detach(self.enabled_id)?;
        let manifest = Manifest {
            captured,
            start_time_unix_ns: session.map_or(0, |s| s.start_unix_ns),
            stop_time_unix_ns: stop_unix_ns,
            config: Arc::clone(&self.recording.config),
            trigger: header.trigger,
            cut_short: header.cut_short,
            metadata: (!self.metadata.is_empty()).then(|| {
                self.metadata
                    .iter()
                    .filter_map(|(k, v)| Some((k.clone(), serde_json::from_str(v).ok()?)))
                    .collect()
            }),
            steps: Some(std::mem::take(&mut header.steps)).filter(|s| !s.is_empty()),
            model: header.model.take(),
            ..Manifest::default()
        };
        let how = HowToWrite {
            // Kineto writes the annotations' kwinputs (the requests) only with shapes.
            requests_into_args: manifest.steps.is_some() && !o.record_shapes,
            trace_name: session.and_then(|s| s.trace_name.clone()),
            return_freed_memory: self.max_held_bytes > 0,
        };
        self.writer.submit(Job {
            session: Box::new(KinetoCapture {
                session: detached,
                table: self.recording.table(),
                table_from_activities: self.recording.table_from_activities(),
                serializer: self.serializer,
                stop_unix_ns: header.stop_unix_ns,
            }),
            time_ns: stop_unix_ns,
            queued: Instant::now(),
            manifest,
            held_bytes: session.map_or(0, |s| s.held_bytes),
            how,
        })
    }

    fn toggle(&mut self, enable: bool) -> Result<()> {
        if self.kineto != KinetoState::Enabled {
            return Ok(());
        }
        self.glue()?.toggle(enable, &self.recording.options)
    }

    fn end_range(&mut self) {
        if !self.range_open {
            return;
        }
        self.range_open = false;
        if let Some(range) = self.range.as_mut() {
            if let Err(e) = range.end() {
                log::warn!("stepscope: {e}");
            }
        }
    }
}

impl Backend for TorchBackend {
    fn name(&self) -> &str {
        NAME
    }

    fn preflight(&self) -> Result<()> {
        let dir = self.writer.dir();
        if self.min_free_disk_mb > 0 {
            match crate::sys::free_disk(dir) {
                Ok(free) if free >> 20 < self.min_free_disk_mb => {
                    return Err(Error::refused(
                        "stepscope.min_free_disk_mb",
                        format!(
                            "{} has {} MB free, under the {} MB a capture needs to begin: free \
                             some space, point torch_profiler_dir elsewhere, or lower \
                             stepscope.min_free_disk_mb (0: no check)",
                            dir.display(),
                            free >> 20,
                            self.min_free_disk_mb
                        ),
                    ))
                }
                Ok(_) => {}
                Err(e) => log::debug!("stepscope: free space of {}: {e}", dir.display()),
            }
        }
        let held = self.writer.held_bytes();
        if self.max_held_bytes > 0 && held > self.max_held_bytes {
            return Err(Error::refused(
                "stepscope.max_capture_mb",
                format!(
                    "the captures still being written hold {} MB, \
                     over the {} MB a window may hold: this window is not begun (the engine \
                     goes on); start again once they are on disk (status: pending_writes)",
                    held >> 20,
                    self.max_held_bytes >> 20
                ),
            ));
        }
        Ok(())
    }

    fn window_ends(&mut self, end: &WindowEnd) {
        if let Some(session) = self.session.as_mut() {
            session.cut_short = end.cut_short;
            session.held_bytes = end.held_bytes.unwrap_or(0);
        }
    }

    fn start(&mut self, capture: &CaptureStart<'_>) -> Result<()> {
        // The directory may have gone since the profiler was made.
        ensure_writable_dir(self.writer.dir())?;
        self.preflight()?;
        // Leftovers of processes that died writing here; off the engine thread.
        let dir = self.writer.dir().to_path_buf();
        let _ = std::thread::Builder::new()
            .name("stepscope-clean".into())
            .spawn(move || flush::clean_stale(&dir));
        // Kineto runs one session at a time in a process: a start right after a stop (this
        // profiler's or another's) waits for that session to be finalized (normally well
        // under a second).
        self.writer.wait_finalized()?;
        let glue = self.glue()?;
        self.recording.resolve(
            glue.cuda_available(),
            glue.has_trace_only(),
            glue.writes_python_parents(),
            self.serializer,
        );
        self.session = Some(Session {
            captured: Captured {
                worker_name: capture.worker_name.to_string(),
                local_rank: self.local_rank,
                ..Captured::default()
            },
            trace_name: capture.trace_name.map(str::to_string),
            start_unix_ns: unix_ns(),
            trigger: capture.trigger,
            steps: Vec::new(),
            cut_short: None,
            held_bytes: 0,
        });
        self.step_num = 0;
        self.action = Action::None;
        let first = self
            .recording
            .schedule
            .map_or(Action::Record, |s| s.action(0));
        let result = self.transit(first);
        if result.is_err() {
            self.action = Action::None;
            self.kineto = KinetoState::Off;
            self.session = None;
        }
        result
    }

    fn stop(&mut self) -> Result<()> {
        self.end_range();
        let result = self.transit(Action::None);
        self.kineto = KinetoState::Off;
        self.session = None;
        result
    }

    fn advance(&mut self) {
        let Some(schedule) = self.recording.schedule else {
            return;
        };
        self.step_num += 1;
        if let Err(e) = self.transit(schedule.action(self.step_num)) {
            // The schedule's own stop (or start) failed; the next start begins afresh.
            log::warn!("stepscope: {e}");
            self.kineto = KinetoState::Off;
        }
    }

    fn begin_iteration(&mut self, step: u64, info: &IterationInfo, name: &str) {
        if self.kineto != KinetoState::Enabled {
            return;
        }
        if let Some(s) = self.session.as_mut() {
            s.captured.add(step);
            if let Some(work) = info.work() {
                // Beside the step's requests when `record_requests` listed them just before.
                match s.steps.last_mut().filter(|r| r.step == step) {
                    Some(r) => r.work = Some(work),
                    None => s.steps.push(StepRequests {
                        step,
                        work: Some(work),
                        ..StepRequests::default()
                    }),
                }
            }
        }
        if !self.annotate {
            return;
        }
        if self.range.is_none() {
            let Some(glue) = self.glue else { return };
            match glue.new_range() {
                Ok(r) => self.range = Some(r),
                Err(e) => {
                    log::warn!("stepscope: {e}");
                    self.annotate = false;
                    return;
                }
            }
        }
        let requests = self
            .session
            .as_ref()
            .and_then(|s| s.steps.last())
            .filter(|r| r.step == step)
            .map_or(&[][..], |r| r.requests.as_slice());
        if let Some(range) = self.range.as_mut() {
            match range.begin(name, step, requests) {
                Ok(()) => self.range_open = true,
                Err(e) => log::warn!("stepscope: {e}"),
            }
        }
    }

    fn record_requests(&mut self, step: u64, requests: &dyn RequestIds) {
        if self.kineto != KinetoState::Enabled {
            return;
        }
        if let Some(s) = self.session.as_mut() {
            let mut ids = Vec::with_capacity(requests.count());
            requests.for_each_id(&mut |id| ids.push(id.to_string()));
            let (mut tokens, mut prefill) = (Vec::new(), Vec::new());
            if !requests.for_each_share(&mut |share| {
                tokens.push(share.tokens);
                prefill.push(share.prefill);
            }) || tokens.len() != ids.len()
            {
                (tokens, prefill) = (Vec::new(), Vec::new());
            }
            s.steps.push(StepRequests {
                step,
                requests: ids,
                tokens,
                prefill,
                work: None,
            });
        }
    }

    fn uses_names(&self) -> bool {
        self.annotate
    }

    fn set_model(&mut self, model: &ModelShape) {
        self.model = Some(model.clone());
    }

    fn set_trace_metadata(&mut self, key: &str, json_value: &str) {
        match self.metadata.iter_mut().find(|(k, _)| k == key) {
            Some(entry) => json_value.clone_into(&mut entry.1),
            None => self
                .metadata
                .push((key.to_string(), json_value.to_string())),
        }
    }

    fn end_iteration(&mut self) {
        self.end_range();
    }

    fn pending_writes(&self) -> Option<PendingWrites> {
        Some(self.writer.pending())
    }

    // Kineto's toggle_collection_dynamic: CPU ops and CUDA activity stop being recorded over
    // the iterations of stages not chosen; the session (and its trace) goes on.
    fn pause(&mut self) -> Result<()> {
        self.toggle(false)
    }

    fn resume(&mut self) -> Result<()> {
        self.toggle(true)
    }

    fn reconfigure(&mut self, config: &ProfilerConfig) -> Result<()> {
        self.recording = SessionOptions::from_config(config);
        self.min_free_disk_mb = config.stepscope.budget.min_free_disk_mb;
        self.max_held_bytes = config.capture_budget().max_growth_bytes;
        self.annotate = self.recording.options.cpu;
        if let Some(glue) = self.glue {
            self.recording.resolve(
                glue.cuda_available(),
                glue.has_trace_only(),
                glue.writes_python_parents(),
                self.serializer,
            );
        }
        Ok(())
    }
}

impl Drop for TorchBackend {
    fn drop(&mut self) {
        if self.kineto != KinetoState::Off {
            if let Err(e) = Backend::stop(self) {
                log::warn!("stepscope: stopping the torch profiler at drop: {e}");
            }
        }
        // The writer waits for pending traces (up to flush_timeout_s) in its own drop.
    }
}
