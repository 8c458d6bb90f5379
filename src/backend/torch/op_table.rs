//! The op table written to `{worker}.profiler_out.txt`: per name, calls, self and total CPU
//! time and device time, sorted by self device time (self CPU time when only the CPU was
//! recorded), as vLLM's `torch_profiler_dump_cuda_time_total` asks of torch's `key_averages()`.
//! Computed on the writer thread from the session's events.
//!
//! Self CPU time is an event's duration less that of the events directly nested in it on the
//! same thread; device events (kernels, copies) count as device time of their own name.

use std::collections::HashMap;
use std::fmt::Write as _;

/// The column a table is sorted by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortBy {
    /// Self device time (kernels, copies, memsets).
    SelfDevice,
    /// Self CPU time.
    SelfCpu,
}

/// one profiler event, as the op table reads it.
#[derive(Debug, Clone, Copy)]
pub struct OpEvent<'a> {
    /// Operator, annotation or kernel name.
    pub name: &'a str,
    /// Recording thread (CPU events).
    pub thread: u64,
    /// Start, nanoseconds.
    pub start_ns: u64,
    /// Duration, nanoseconds.
    pub duration_ns: u64,
    /// Recorded on a device rather than the CPU.
    pub device: bool,
    /// Asynchronous: does not nest on its thread.
    pub is_async: bool,
}

/// Totals for one name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpTotals {
    /// The name.
    pub name: String,
    /// Occurrences.
    pub calls: u64,
    /// CPU time not spent in nested events, nanoseconds.
    pub self_cpu_ns: u64,
    /// CPU time including nested events, nanoseconds.
    pub cpu_total_ns: u64,
    /// Device time, nanoseconds.
    pub self_device_ns: u64,
}

/// Per-name totals of `events`, in no particular order.
pub fn op_totals(events: &[OpEvent<'_>]) -> Vec<OpTotals> {
    // Self time: per thread, events in start order (longer first on ties), each one's direct
    // parent is the innermost open event that contains it.
    let mut self_ns: Vec<u64> = events.iter().map(|e| e.duration_ns).collect();
    let mut order: Vec<usize> = (0..events.len())
        .filter(|&i| !events[i].device && !events[i].is_async)
        .collect();
    order.sort_by(|&a, &b| {
        let (ea, eb) = (&events[a], &events[b]);
        (ea.thread, ea.start_ns, std::cmp::Reverse(ea.duration_ns)).cmp(&(
            eb.thread,
            eb.start_ns,
            std::cmp::Reverse(eb.duration_ns),
        ))
    });
    let mut stack: Vec<usize> = Vec::new();
    let mut thread = None;
    for &i in &order {
        let e = &events[i];
        if thread != Some(e.thread) {
            stack.clear();
            thread = Some(e.thread);
        }
        let end = e.start_ns.saturating_add(e.duration_ns);
        while let Some(&top) = stack.last() {
            let t = &events[top];
            if t.start_ns.saturating_add(t.duration_ns) >= end && t.start_ns <= e.start_ns {
                break;
            }
            stack.pop();
        }
        if let Some(&parent) = stack.last() {
            self_ns[parent] = self_ns[parent].saturating_sub(e.duration_ns);
        }
        stack.push(i);
    }

    let mut by_name: HashMap<&str, OpTotals> = HashMap::new();
    for (i, e) in events.iter().enumerate() {
        let s = by_name.entry(e.name).or_insert_with(|| OpTotals {
            name: e.name.to_string(),
            ..OpTotals::default()
        });
        s.calls += 1;
        if e.device {
            s.self_device_ns += e.duration_ns;
        } else {
            s.cpu_total_ns += e.duration_ns;
            s.self_cpu_ns += self_ns[i];
        }
    }
    by_name.into_values().collect()
}

/// torch's `_format_time`, from nanoseconds.
fn fmt_time(ns: u64) -> String {
    let us = ns as f64 / 1e3;
    if us >= 1e6 {
        format!("{:.3}s", us / 1e6)
    } else if us >= 1e3 {
        format!("{:.3}ms", us / 1e3)
    } else {
        format!("{us:.3}us")
    }
}

/// torch's `_format_time_share`.
fn fmt_share(part: u64, total: u64) -> String {
    if total == 0 {
        "NaN".to_string()
    } else {
        format!("{:.2}%", part as f64 * 100.0 / total as f64)
    }
}

/// The widest name column torch's table allows (`max_name_column_width`).
const NAME_WIDTH: usize = 55;
/// torch's width of every other column.
const COLUMN_WIDTH: usize = 12;

/// The table, at most `limit` rows, sorted by `sort` (descending, then by name), in the
/// layout of torch's `key_averages().table()` as vLLM writes it to `profiler_out.txt`: the
/// same columns, widths, truncation and totals. Device columns appear when any device time
/// was recorded, named after `device` (`CUDA`, `XPU`). A CPU op's device total is not known
/// here (Kineto's correlation is not read back), so device columns count device events only.
pub fn table(stats: &[OpTotals], sort: SortBy, limit: usize, device: &str) -> String {
    let key = |s: &OpTotals| match sort {
        SortBy::SelfDevice => s.self_device_ns,
        SortBy::SelfCpu => s.self_cpu_ns,
    };
    let mut rows: Vec<&OpTotals> = stats.iter().collect();
    rows.sort_by(|a, b| key(b).cmp(&key(a)).then_with(|| a.name.cmp(&b.name)));
    rows.truncate(limit);
    if rows.is_empty() {
        return String::new();
    }
    let self_cpu_total: u64 = stats.iter().map(|s| s.self_cpu_ns).sum();
    let device_total: u64 = stats.iter().map(|s| s.self_device_ns).sum();
    let has_device = device_total > 0;

    let name_width = (rows
        .iter()
        .map(|r| r.name.chars().count())
        .max()
        .unwrap_or(0)
        + 4)
    .min(NAME_WIDTH);
    let mut headers = vec![
        "Name".to_string(),
        "Self CPU %".into(),
        "Self CPU".into(),
        "CPU total %".into(),
        "CPU total".into(),
        "CPU time avg".into(),
    ];
    if has_device {
        headers.extend([
            format!("Self {device}"),
            format!("Self {device} %"),
            format!("{device} total"),
            format!("{device} time avg"),
        ]);
    }
    headers.push("# of Calls".into());
    let widths: Vec<usize> = std::iter::once(name_width)
        .chain(std::iter::repeat_n(COLUMN_WIDTH, headers.len() - 1))
        .collect();
    let line = |cells: &[String], out: &mut String| {
        for (cell, w) in cells.iter().zip(&widths) {
            let _ = write!(out, "{cell:>w$}  ");
        }
        out.push('\n');
    };
    let rule: String = widths.iter().map(|w| "-".repeat(*w) + "  ").collect();

    let mut out = String::new();
    let _ = writeln!(out, "{rule}");
    line(&headers, &mut out);
    let _ = writeln!(out, "{rule}");
    for r in rows {
        let name: String = if r.name.chars().count() >= NAME_WIDTH - 3 {
            r.name
                .chars()
                .take(NAME_WIDTH - 3)
                .chain("...".chars())
                .collect()
        } else {
            r.name.clone()
        };
        let calls = r.calls.max(1);
        let mut cells = vec![
            name,
            fmt_share(r.self_cpu_ns, self_cpu_total),
            fmt_time(r.self_cpu_ns),
            fmt_share(r.cpu_total_ns, self_cpu_total),
            fmt_time(r.cpu_total_ns),
            fmt_time(r.cpu_total_ns / calls),
        ];
        if has_device {
            cells.extend([
                fmt_time(r.self_device_ns),
                fmt_share(r.self_device_ns, device_total),
                fmt_time(r.self_device_ns),
                fmt_time(r.self_device_ns / calls),
            ]);
        }
        cells.push(r.calls.to_string());
        line(&cells, &mut out);
    }
    let _ = writeln!(out, "{rule}");
    let _ = writeln!(out, "Self CPU time total: {}", fmt_time(self_cpu_total));
    if has_device {
        let _ = writeln!(out, "Self {device} time total: {}", fmt_time(device_total));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpu(name: &str, thread: u64, start: u64, dur: u64) -> OpEvent<'_> {
        OpEvent {
            name,
            thread,
            start_ns: start,
            duration_ns: dur,
            device: false,
            is_async: false,
        }
    }

    #[test]
    fn self_time_subtracts_direct_children_only() {
        // outer [0,100) > mid [10,60) > leaf [20,30); sibling [70,90) in outer; another
        // thread's event overlapping in time is not a child.
        let events = [
            cpu("outer", 1, 0, 100),
            cpu("mid", 1, 10, 50),
            cpu("leaf", 1, 20, 10),
            cpu("sib", 1, 70, 20),
            cpu("other", 2, 5, 90),
            OpEvent {
                device: true,
                ..cpu("kernel", 0, 15, 40)
            },
        ];
        let stats = op_totals(&events);
        let get = |n: &str| stats.iter().find(|s| s.name == n).unwrap().clone();
        assert_eq!(get("outer").self_cpu_ns, 30);
        assert_eq!(get("outer").cpu_total_ns, 100);
        assert_eq!(get("mid").self_cpu_ns, 40);
        assert_eq!(get("leaf").self_cpu_ns, 10);
        assert_eq!(get("sib").self_cpu_ns, 20);
        assert_eq!(get("other").self_cpu_ns, 90);
        assert_eq!(get("kernel").self_device_ns, 40);
        assert_eq!(get("kernel").cpu_total_ns, 0);
    }

    #[test]
    fn table_sorts_and_limits() {
        let events = [
            cpu("a", 1, 0, 10),
            cpu("b", 1, 20, 30),
            cpu("b", 1, 60, 30),
            cpu("c", 1, 100, 5),
        ];
        let t = table(&op_totals(&events), SortBy::SelfCpu, 2, "CUDA");
        let rows: Vec<&str> = t
            .lines()
            .filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_lowercase()))
            .collect();
        assert_eq!(rows.len(), 2, "{t}");
        assert!(
            rows[0].trim_start().starts_with("b ") && rows[0].trim_end().ends_with(" 2"),
            "{t}"
        );
        assert!(rows[1].trim_start().starts_with("a "), "{t}");
        assert!(t.contains("Self CPU time total: 0.075us"), "{t}");
    }

    #[test]
    fn table_has_torchs_layout() {
        // torch's key_averages().table() for the same totals: right-aligned cells, the name
        // column 4 wider than the longest name, 12 for the others, two spaces after each.
        let long = "x".repeat(60);
        let events = [cpu("aten::mm", 1, 0, 1500), cpu(&long, 1, 2000, 500)];
        let t = table(&op_totals(&events), SortBy::SelfCpu, 10, "CUDA");
        let lines: Vec<&str> = t.lines().collect();
        let rule = format!("{}  {}", "-".repeat(55), "------------  ".repeat(6));
        assert_eq!(lines[0], rule);
        assert_eq!(
            lines[1],
            format!(
                "{:>55}  {:>12}  {:>12}  {:>12}  {:>12}  {:>12}  {:>12}  ",
                "Name",
                "Self CPU %",
                "Self CPU",
                "CPU total %",
                "CPU total",
                "CPU time avg",
                "# of Calls"
            )
        );
        assert_eq!(
            lines[3],
            format!(
                "{:>55}  {:>12}  {:>12}  {:>12}  {:>12}  {:>12}  {:>12}  ",
                "aten::mm", "75.00%", "1.500us", "75.00%", "1.500us", "1.500us", "1"
            )
        );
        assert!(lines[4]
            .trim_start()
            .starts_with(&format!("{}...", "x".repeat(52))));
        assert_eq!(lines[6], "Self CPU time total: 2.000us");
        // Device time adds torch's four device columns, named after the device.
        let kernel = OpEvent {
            device: true,
            ..cpu("gemm", 0, 0, 4000)
        };
        let t = table(&op_totals(&[kernel]), SortBy::SelfDevice, 10, "CUDA");
        assert!(
            t.contains("Self CUDA %") && t.contains("CUDA time avg"),
            "{t}"
        );
        assert!(t.ends_with("Self CUDA time total: 4.000us\n"), "{t}");
    }
}
