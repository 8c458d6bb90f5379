//! The explanation's figures as they are serialized (in a summary's steps and in `analyze`'s
//! and `diff`'s output): [`GpuTime`] and its parts, the [`Verdict`], a group's means
//! ([`GpuMean`]), a stream's idle time ([`StreamIdle`]), and what a kernel's time counts as
//! ([`KernelKind`]). What each figure means, and how it is computed, is in `explain.rs`.

use serde::{Deserialize, Serialize};

/// What a device event's time counts as, as Holistic Trace Analysis classifies kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KernelKind {
    /// Compute kernels.
    Computation,
    /// Collectives (NCCL, gloo).
    Communication,
    /// Memcpy and memset.
    Memory,
}

impl KernelKind {
    /// The kind of a kernel by its name.
    pub fn of(name: &str) -> Self {
        if name.starts_with("nccl") || name.contains("gloo:") {
            KernelKind::Communication
        } else if name.contains("Memcpy") || name.contains("Memset") {
            KernelKind::Memory
        } else {
            KernelKind::Computation
        }
    }

    /// `computation`, `communication` or `memory`.
    pub fn as_str(self) -> &'static str {
        match self {
            KernelKind::Computation => "computation",
            KernelKind::Communication => "communication",
            KernelKind::Memory => "memory",
        }
    }
}

/// The classes of [`OpClass`](super::explain::OpClass): the slots of a [`BusySplit`].
pub(super) const CLASSES: usize = 7;

/// Device time by class: the classes of [`OpClass`](super::explain::OpClass), each instant
/// counted once, so they add up to the busy time. `communication_us` is the exposed part.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct BusySplit {
    /// Compute kernels, µs.
    pub computation_us: f64,
    /// Collectives with no computation running beside them (exposed), µs.
    pub communication_us: f64,
    /// Host-to-device copies, µs.
    pub memcpy_h2d_us: f64,
    /// Device-to-host copies, µs.
    pub memcpy_d2h_us: f64,
    /// Device-to-device copies, µs.
    pub memcpy_d2d_us: f64,
    /// Other copies (peer-to-peer, host-to-host, kernels named as copies), µs.
    pub memcpy_other_us: f64,
    /// Memsets, µs.
    pub memset_us: f64,
}

impl BusySplit {
    pub(super) fn slot(&mut self, class: usize) -> &mut f64 {
        match class {
            0 => &mut self.computation_us,
            1 => &mut self.communication_us,
            2 => &mut self.memcpy_h2d_us,
            3 => &mut self.memcpy_d2h_us,
            4 => &mut self.memcpy_d2d_us,
            5 => &mut self.memcpy_other_us,
            _ => &mut self.memset_us,
        }
    }

    /// Memcpys and memsets, µs.
    pub fn copies_us(&self) -> f64 {
        self.memcpy_h2d_us
            + self.memcpy_d2h_us
            + self.memcpy_d2d_us
            + self.memcpy_other_us
            + self.memset_us
    }

    fn add(&mut self, o: &BusySplit) {
        let mut o = *o;
        for c in 0..CLASSES {
            *self.slot(c) += *o.slot(c);
        }
    }
}

/// Device idle time by cause (see `explain.rs`).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct IdleSplit {
    /// The next event was launched after the device went idle, µs.
    pub host_wait_us: f64,
    /// The next event was queued before the device went idle, yet did not start, µs.
    pub dependency_wait_us: f64,
    /// The next event's launch is not in the trace, µs.
    pub other_us: f64,
}

impl IdleSplit {
    /// All idle time, µs.
    pub fn total_us(&self) -> f64 {
        self.host_wait_us + self.dependency_wait_us + self.other_us
    }
}

/// Runtime calls and what they put on the device.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct LaunchStats {
    /// Kernel launch calls.
    pub kernel_launches: u64,
    /// `cudaGraphLaunch` replays.
    pub graph_launches: u64,
    /// Device events the replays ran.
    pub graph_kernels: u64,
    /// Memcpy and memset calls.
    pub copy_launches: u64,
    /// Events whose launch delay was measured (launched by a kernel launch or async copy).
    pub delays: u64,
    /// Median launch delay, µs (linear interpolation, as numpy's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_median_us: Option<f64>,
    /// 90th percentile launch delay, µs (linear interpolation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_p90_us: Option<f64>,
    /// Of those events, the ones that ran for less time than their launch call took.
    pub short: u64,
}

/// What bounds a step (see [`Verdict`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Bound {
    /// The device waited for the host's launches most.
    Host,
    /// Computation kernels ran most.
    Compute,
    /// Exposed communication ran most.
    Communication,
    /// Copies and sets ran most.
    Copy,
    /// Queued work waited on its dependencies most.
    Dependency,
}

impl Bound {
    /// `host-bound`, …
    pub fn as_str(self) -> &'static str {
        match self {
            Bound::Host => "host-bound",
            Bound::Compute => "compute-bound",
            Bound::Communication => "communication-bound",
            Bound::Copy => "copy-bound",
            Bound::Dependency => "dependency-bound",
        }
    }

    /// The figure that decides it, as printed: `host wait`, …
    pub fn figure(self) -> &'static str {
        match self {
            Bound::Host => "host wait",
            Bound::Compute => "computation",
            Bound::Communication => "exposed communication",
            Bound::Copy => "copies",
            Bound::Dependency => "dependency wait",
        }
    }
}

/// A step's verdict: the largest part of its device timeline and its share.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct Verdict {
    /// What bounds it.
    pub bound: Bound,
    /// The deciding part, µs.
    pub part_us: f64,
    /// The device timeline it is a share of (busy + idle), µs.
    pub of_us: f64,
}

impl Verdict {
    /// `part_us / of_us`.
    pub fn share(&self) -> f64 {
        if self.of_us > 0.0 {
            self.part_us / self.of_us
        } else {
            0.0
        }
    }
}

/// Where a step's (or a trace's) device time went; see `explain.rs`.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct GpuTime {
    /// Union of the work's intervals per device, summed over devices, µs.
    pub busy_us: f64,
    /// Busy by class.
    pub busy: BusySplit,
    /// Communication running beside computation, µs (exposed is `busy.communication_us`).
    pub communication_overlapped_us: f64,
    /// Device idle time by cause.
    pub idle: IdleSplit,
    /// CPU time in synchronize calls, µs.
    pub sync_us: f64,
    /// Launches.
    pub launches: LaunchStats,
    /// What bounds it ([`GpuTime::judge`] of the figures above; absent with no device time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<Verdict>,
}

impl GpuTime {
    /// Busy plus idle: the device timeline the step accounts for, µs.
    pub fn timeline_us(&self) -> f64 {
        self.busy_us + self.idle.total_us()
    }

    /// The verdict: the largest of host wait, computation, exposed communication, copies and
    /// dependency wait (in that order on a tie); `None` with no device time.
    pub fn judge(&self) -> Option<Verdict> {
        let of = self.timeline_us();
        if of <= 0.0 {
            return None;
        }
        let parts = [
            (Bound::Host, self.idle.host_wait_us),
            (Bound::Compute, self.busy.computation_us),
            (Bound::Communication, self.busy.communication_us),
            (Bound::Copy, self.busy.copies_us()),
            (Bound::Dependency, self.idle.dependency_wait_us),
        ];
        let mut best = parts[0];
        for p in &parts[1..] {
            if p.1 > best.1 {
                best = *p;
            }
        }
        Some(Verdict {
            bound: best.0,
            part_us: best.1,
            of_us: of,
        })
    }

    /// Adds another's additive figures (the delay quantiles are not: they are dropped).
    pub fn add(&mut self, o: &GpuTime) {
        self.busy_us += o.busy_us;
        self.busy.add(&o.busy);
        self.communication_overlapped_us += o.communication_overlapped_us;
        self.idle.host_wait_us += o.idle.host_wait_us;
        self.idle.dependency_wait_us += o.idle.dependency_wait_us;
        self.idle.other_us += o.idle.other_us;
        self.sync_us += o.sync_us;
        let (l, m) = (&mut self.launches, &o.launches);
        l.kernel_launches += m.kernel_launches;
        l.graph_launches += m.graph_launches;
        l.graph_kernels += m.graph_kernels;
        l.copy_launches += m.copy_launches;
        l.delays += m.delays;
        l.short += m.short;
        l.delay_median_us = None;
        l.delay_p90_us = None;
        self.verdict = self.judge();
    }

    /// Every additive figure divided by `n` (per step of a group); counts become means.
    pub fn per(&self, n: usize) -> GpuMean {
        let n = n.max(1) as f64;
        GpuMean {
            busy_us: self.busy_us / n,
            computation_us: self.busy.computation_us / n,
            communication_exposed_us: self.busy.communication_us / n,
            communication_overlapped_us: self.communication_overlapped_us / n,
            copies_us: self.busy.copies_us() / n,
            host_wait_us: self.idle.host_wait_us / n,
            dependency_wait_us: self.idle.dependency_wait_us / n,
            other_idle_us: self.idle.other_us / n,
            sync_us: self.sync_us / n,
            kernel_launches: self.launches.kernel_launches as f64 / n,
            graph_launches: self.launches.graph_launches as f64 / n,
            graph_kernels: self.launches.graph_kernels as f64 / n,
        }
    }
}

/// A group's [`GpuTime`] per step (means over its steps), as `analyze` and `diff` compare it.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct GpuMean {
    /// Busy, µs.
    pub busy_us: f64,
    /// Computation, µs.
    pub computation_us: f64,
    /// Exposed communication, µs.
    pub communication_exposed_us: f64,
    /// Overlapped communication, µs.
    pub communication_overlapped_us: f64,
    /// Memcpys and memsets, µs.
    pub copies_us: f64,
    /// Host wait, µs.
    pub host_wait_us: f64,
    /// Dependency wait, µs.
    pub dependency_wait_us: f64,
    /// Other idle, µs.
    pub other_idle_us: f64,
    /// Synchronize calls' CPU time, µs.
    pub sync_us: f64,
    /// Kernel launches.
    pub kernel_launches: f64,
    /// Graph replays.
    pub graph_launches: f64,
    /// Kernels the replays ran.
    pub graph_kernels: f64,
}

/// One stream's idle time by HTA's rule (see `explain.rs`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StreamIdle {
    /// The device.
    pub device: i64,
    /// The stream.
    pub stream: i64,
    /// Events on it.
    pub events: u64,
    /// Summed duration of its events, µs.
    pub busy_us: f64,
    /// HTA's host wait, µs.
    pub host_wait_us: f64,
    /// HTA's kernel wait (queued, a gap under [`KERNEL_WAIT_US`](super::KERNEL_WAIT_US)), µs.
    pub kernel_wait_us: f64,
    /// HTA's other, µs.
    pub other_us: f64,
}
