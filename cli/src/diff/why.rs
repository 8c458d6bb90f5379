//! Which part of a group's steps moved between two runs: the device timeline per step by part
//! (computation, exposed communication, copies, host wait, dependency wait, other idle; the
//! summary's explanation, see `analyze`), and the launches per step. No I/O.

use serde::Serialize;
use stepscope_format::trace::GpuMean;

/// A part of a step's device timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Part {
    /// Computation kernels.
    Computation,
    /// Communication with no computation beside it.
    ExposedCommunication,
    /// Memcpys and memsets.
    Copies,
    /// Idle, waiting for the host's launches.
    HostWait,
    /// Idle with work queued.
    DependencyWait,
    /// Idle, cause unknown.
    OtherIdle,
}

impl Part {
    /// For the text.
    pub fn as_str(self) -> &'static str {
        match self {
            Part::Computation => "computation",
            Part::ExposedCommunication => "exposed communication",
            Part::Copies => "copies",
            Part::HostWait => "host wait",
            Part::DependencyWait => "dependency wait",
            Part::OtherIdle => "other idle",
        }
    }

    fn of(g: &GpuMean) -> [(Part, f64); 6] {
        [
            (Part::Computation, g.computation_us),
            (Part::ExposedCommunication, g.communication_exposed_us),
            (Part::Copies, g.copies_us),
            (Part::HostWait, g.host_wait_us),
            (Part::DependencyWait, g.dependency_wait_us),
            (Part::OtherIdle, g.other_idle_us),
        ]
    }
}

/// A part's change per step.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Moved {
    /// The part.
    pub part: Part,
    /// After less before, µs per step.
    pub delta_us: f64,
}

/// What moved in a group, per step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuChange {
    /// Before's figures per step.
    pub before: GpuMean,
    /// After's.
    pub after: GpuMean,
    /// The device timeline's change (busy + idle), µs per step.
    pub timeline_delta_us: f64,
    /// The parts that moved by at least [`SHOWN`] of the largest move, largest first.
    pub moved: Vec<Moved>,
    /// Launches per step (kernel launches and graph replays), before and after.
    pub launches: [f64; 2],
    /// Graph replays per step, before and after.
    pub graph_launches: [f64; 2],
    /// `CUDA graphs off` when before replayed graphs and after replays none, `on` the other
    /// way round.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub graphs: Option<&'static str>,
}

/// A part is listed when it moved by at least this share of the largest part's move.
pub const SHOWN: f64 = 0.1;

/// What moved from `before` to `after` (each per step).
pub fn change(before: GpuMean, after: GpuMean) -> GpuChange {
    let (b, a) = (Part::of(&before), Part::of(&after));
    let mut moved: Vec<Moved> = b
        .iter()
        .zip(&a)
        .map(|(&(part, x), &(_, y))| Moved {
            part,
            delta_us: y - x,
        })
        .collect();
    let largest = moved.iter().map(|m| m.delta_us.abs()).fold(0.0, f64::max);
    moved.retain(|m| m.delta_us != 0.0 && m.delta_us.abs() >= SHOWN * largest);
    moved.sort_by(|x, y| y.delta_us.abs().total_cmp(&x.delta_us.abs()));
    let timeline = |p: &[(Part, f64); 6]| p.iter().map(|x| x.1).sum::<f64>();
    let graphs = match (before.graph_launches > 0.0, after.graph_launches > 0.0) {
        (true, false) => Some("CUDA graphs off"),
        (false, true) => Some("CUDA graphs on"),
        _ => None,
    };
    GpuChange {
        timeline_delta_us: timeline(&a) - timeline(&b),
        moved,
        launches: [
            before.kernel_launches + before.graph_launches,
            after.kernel_launches + after.graph_launches,
        ],
        graph_launches: [before.graph_launches, after.graph_launches],
        graphs,
        before,
        after,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parts_that_moved_are_named_largest_first_and_graphs_turned_off_said() {
        let before = GpuMean {
            busy_us: 1000.0,
            computation_us: 1000.0,
            host_wait_us: 100.0,
            kernel_launches: 2.0,
            graph_launches: 1.0,
            ..GpuMean::default()
        };
        let after = GpuMean {
            busy_us: 1050.0,
            computation_us: 1050.0,
            host_wait_us: 2100.0,
            kernel_launches: 412.0,
            ..GpuMean::default()
        };
        let c = change(before, after);
        assert_eq!(c.timeline_delta_us, 2050.0);
        // Host wait +2000; computation +50 is under a tenth of it and not listed.
        assert_eq!(
            c.moved,
            [Moved {
                part: Part::HostWait,
                delta_us: 2000.0
            }]
        );
        assert_eq!(c.launches, [3.0, 412.0]);
        assert_eq!(c.graphs, Some("CUDA graphs off"));
        assert_eq!(change(after, before).graphs, Some("CUDA graphs on"));
        assert_eq!(change(before, before).moved, []);
    }
}
