//! The op table written to `{worker}.profiler_out.txt`: per name, calls, self and total CPU
//! time and device time, sorted by self device time (self CPU time when only the CPU was
//! recorded), as vLLM's `torch_profiler_dump_cuda_time_total` asks of torch's `key_averages()`.
//! Computed on the writer's table thread from the session's events: torch's event list, or,
//! where Kineto's finalize built none (torch's `trace_only`), the CPU events stepscope's
//! serializer kept as it wrote them (a table of CPU time only).
//!
//! The rules are torch's (`torch.autograd.profiler._parse_kineto_results`, `EventList`'s
//! `_populate_cpu_children` and `key_averages()`, `profiler_util._build_table`), and
//! `tests/python/test_op_table.py` holds this table against torch's own on the same events:
//! - events torch leaves out of the table (its `_filter_name` list, hidden events) are not
//!   counted, and not nested: their time stays their parent's own;
//! - `ProfilerStep#N` counts as `ProfilerStep*`;
//! - under torch 2.14 and later, Python frames have no rows and CUPTI's overhead records take
//!   no kernels ([`Rules`]);
//! - an event is asynchronous when Kineto says so or it ended on another thread than it began
//!   on; it has no self CPU time and nests nothing;
//! - self CPU time is an event's duration less that of the events directly nested in it on its
//!   thread (a child begins before its parent ends and ends no later), which can be negative
//!   where children overlap;
//! - an event that is the only child of its parent of the same name is folded into it;
//! - a device event (kernel, copy, memset) is device time of its own name and, when linked to
//!   the CPU op that launched it, device time of that op too ("Self CUDA"), and of every op
//!   around it ("CUDA total"); device user annotations are left out of the device total;
//! - a row is a name on the CPU or on the device, as a user annotation or not: a region's
//!   CPU range and its GPU annotation, or a Triton kernel and the CPU range of its launch, are
//!   two rows of one name.
//!
//! Not reproduced: what `profile_memory` adds (the memory columns, and `[memory]` rows for the
//! records no op holds), the FLOPs column (`with_flops`), and the grouping by input shape vLLM
//! asks for on CPU with `record_shapes`.

use std::fmt::Write as _;
use stepscope_format::hash::FastMap;

/// The column a table is sorted by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortBy {
    /// Self device time (kernels, copies, memsets).
    SelfDevice,
    /// Self CPU time.
    SelfCpu,
}

/// One profiler event, as the op table reads it: torch's `KinetoEvent`'s fields.
#[derive(Debug, Clone, Copy, Default)]
pub struct OpEvent<'a> {
    /// Operator, annotation, Python frame or kernel name.
    pub name: &'a str,
    /// The thread it began on (a GPU stream for a device event).
    pub thread: u64,
    /// The thread it ended on.
    pub end_thread: u64,
    /// Start, nanoseconds.
    pub start_ns: u64,
    /// Duration, nanoseconds.
    pub duration_ns: u64,
    /// Its correlation id.
    pub correlation: u64,
    /// The correlation id of the CPU op it is linked to (a kernel to the op that launched
    /// it); 0 for none.
    pub linked_correlation: u64,
    /// Recorded on a device rather than the CPU.
    pub device: bool,
    /// Kineto's `isAsync()`.
    pub is_async: bool,
    /// torch's `is_hidden_event()`.
    pub hidden: bool,
    /// A user annotation (on the CPU or a device).
    pub user_annotation: bool,
    /// A Python frame (recorded with stacks).
    pub python_function: bool,
    /// One of CUPTI's overhead records (Kineto's `OVERHEAD` activity).
    pub overhead: bool,
}

/// Names torch's table leaves out (`torch.autograd.profiler_util._filter_name`): the memory
/// records and the profiler's and autograd's bookkeeping.
const LEFT_OUT: [&str; 8] = [
    "[memory]",
    "[OutOfMemory]",
    "profiler::_record_function_enter",
    "profiler::_record_function_enter_new",
    "profiler::_record_function_exit",
    "aten::is_leaf",
    "aten::output_nr",
    "aten::_version",
];

impl OpEvent<'_> {
    /// Counted in the table at all.
    fn counted(&self) -> bool {
        !self.hidden && !LEFT_OUT.contains(&self.name)
    }

    /// Asynchronous, as torch takes it.
    fn asynchronous(&self) -> bool {
        self.is_async || self.thread != self.end_thread
    }

    /// The name it is counted under (torch's `_rewrite_name(with_wildcard=True)`).
    fn key(&self) -> &str {
        if self.name.starts_with("ProfilerStep#") {
            "ProfilerStep*"
        } else {
            self.name
        }
    }

    fn end_ns(&self) -> u64 {
        self.start_ns.saturating_add(self.duration_ns)
    }
}

/// Totals for one name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpTotals {
    /// The name.
    pub name: String,
    /// Occurrences.
    pub calls: u64,
    /// CPU time not spent in nested events, nanoseconds (negative where nested events
    /// overlap, as torch counts it).
    pub self_cpu_ns: i64,
    /// CPU time including nested events, nanoseconds.
    pub cpu_total_ns: u64,
    /// Device time of its own: a device event's duration, a CPU op's kernels'.
    pub self_device_ns: u64,
    /// Device time including that of the ops nested in it.
    pub device_total_ns: u64,
    /// A device event's totals (a kernel's, a copy's): its self device time makes the table's
    /// device total.
    pub on_device: bool,
    /// A user annotation: left out of the device total.
    pub user_annotation: bool,
    /// Asynchronous: its CPU total has no share.
    pub is_async: bool,
    /// Where torch's list has the name first (its events in start order, the longer first):
    /// ties in the sorted column keep this order.
    first: usize,
}

/// What differs between torch versions in `key_averages()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    /// Python frames have rows: torch 2.14 and later leave them out by default
    /// (`include_python_functions=False`: they nest as before, but have no row and no share of
    /// the self CPU total).
    pub python_frames: bool,
    /// CUPTI's overhead records take the kernels linked to their correlation id, as any CPU
    /// event: torch 2.14 and later pass them over (they inherit the correlation id of the op
    /// around them).
    pub overhead_takes_kernels: bool,
}

impl Rules {
    /// The rules of `torch_version` as torch gives it (`2.14.0+cu130`); one that does not read
    /// as a version takes the older rules.
    pub fn of(torch_version: &str) -> Rules {
        let mut parts = torch_version.split(['.', '+']).map(str::parse::<u32>);
        let before_2_14 = match (parts.next(), parts.next()) {
            (Some(Ok(major)), Some(Ok(minor))) => (major, minor) < (2, 14),
            _ => true,
        };
        Rules {
            python_frames: before_2_14,
            overhead_takes_kernels: before_2_14,
        }
    }
}

/// No event (no parent, no child, the end of a list of children).
const NONE: u32 = u32::MAX;

/// Each event's children, as lists threaded through the events' own slots: a child is on one
/// list at a time, so `next` needs one slot an event. The order within a list is not kept (the
/// table sums over children and counts them).
struct Children {
    first: Vec<u32>,
    next: Vec<u32>,
    count: Vec<u32>,
}

impl Children {
    fn new(n: usize) -> Self {
        Children {
            first: vec![NONE; n],
            next: vec![NONE; n],
            count: vec![0; n],
        }
    }

    fn add(&mut self, parent: u32, child: u32) {
        let p = parent as usize;
        self.next[child as usize] = self.first[p];
        self.first[p] = child;
        self.count[p] += 1;
    }

    /// `to` takes `from`'s children in place of its own (its own is `from`, its only child).
    fn hand_over(&mut self, from: u32, to: u32) {
        let (f, t) = (from as usize, to as usize);
        self.first[t] = std::mem::replace(&mut self.first[f], NONE);
        self.count[t] = std::mem::take(&mut self.count[f]);
    }

    fn of(&self, parent: u32) -> impl Iterator<Item = u32> + '_ {
        let mut c = self.first[parent as usize];
        std::iter::from_fn(move || {
            (c != NONE).then(|| {
                let here = c;
                c = self.next[here as usize];
                here
            })
        })
    }
}

/// Per-name totals of `events` under torch's `rules`, in no particular order.
pub fn op_totals(events: &[OpEvent<'_>], rules: Rules) -> Vec<OpTotals> {
    let counted: Vec<&OpEvent<'_>> = events.iter().filter(|e| e.counted()).collect();
    let n = counted.len();
    // Indices as u32 and each event's children as a list threaded through three arrays (first
    // child, next sibling, count), not a Vec per event: the table's thread starts with a cold
    // heap, and every byte it first writes is a page fault (a third of its time in `perf`).
    let Ok(n32) = u32::try_from(n) else {
        return Vec::new();
    };
    let ev = |i: u32| counted[i as usize];
    // torch's event list: by start, the longer first on ties, else in the order given.
    let mut order: Vec<u32> = (0..n32).collect();
    order.sort_by_key(|&i| (ev(i).start_ns, std::cmp::Reverse(ev(i).end_ns())));

    // A kernel's time goes to the CPU op it is linked to (a synchronous CPU event that is not
    // itself linked to another), whatever the kernel's own kind.
    let mut kernels_of: FastMap<u64, u64> = FastMap::default();
    for e in &counted {
        if e.device && e.linked_correlation > 0 {
            *kernels_of.entry(e.linked_correlation).or_default() += e.duration_ns;
        }
    }
    // torch's "frontend" ops: the CPU events kernels and runtime calls are linked to.
    let takes_kernels = |e: &OpEvent<'_>| {
        !e.device
            && !e.asynchronous()
            && e.linked_correlation == 0
            && (rules.overhead_takes_kernels || !e.overhead)
    };
    let own_device = |e: &OpEvent<'_>| -> u64 {
        if e.device {
            if e.asynchronous() {
                0
            } else {
                e.duration_ns
            }
        } else if takes_kernels(e) {
            kernels_of.get(&e.correlation).copied().unwrap_or(0)
        } else {
            0
        }
    };

    // A CPU event linked to an op (a runtime call that launched its kernel) nests on that
    // op's thread.
    let op_threads: FastMap<u64, u64> = counted
        .iter()
        .filter(|e| takes_kernels(e))
        .map(|e| (e.correlation, e.thread))
        .collect();
    let thread_of = |e: &OpEvent<'_>| {
        if e.linked_correlation > 0 {
            op_threads
                .get(&e.linked_correlation)
                .copied()
                .unwrap_or(e.thread)
        } else {
            e.thread
        }
    };

    // Nesting, per thread: in the list's order, an event's parent is the innermost open one
    // it begins inside and does not outlast.
    let mut parent: Vec<u32> = vec![NONE; n];
    let mut by_thread: Vec<(u64, u32)> = order
        .iter()
        .filter(|&&i| !ev(i).device && !ev(i).asynchronous())
        .map(|&i| (thread_of(ev(i)), i))
        .collect();
    by_thread.sort_by_key(|&(t, _)| t); // stable: each thread's in list order
    let mut stack: Vec<u32> = Vec::new();
    let mut thread = None;
    for &(t, i) in &by_thread {
        let e = ev(i);
        if thread != Some(t) {
            stack.clear();
            thread = Some(t);
        }
        while let Some(&top) = stack.last() {
            let p = ev(top);
            if e.start_ns < p.end_ns() && e.end_ns() <= p.end_ns() {
                parent[i as usize] = top;
                break;
            }
            stack.pop();
        }
        stack.push(i);
    }
    drop(by_thread);

    // torch then folds an event into its parent of the same name when it is that parent's
    // only child (`EventList._remove_dup_nodes`: an op calling its own overload): the parent
    // takes its children and its kernels (in place of its own), and it is no longer counted.
    let mut children = Children::new(n);
    for &i in &order {
        if parent[i as usize] != NONE {
            children.add(parent[i as usize], i);
        }
    }
    let mut own: Vec<u64> = counted.iter().map(|e| own_device(e)).collect();
    let mut folded = vec![false; n];
    loop {
        let mut changed = false;
        for &i in &order {
            let p = parent[i as usize];
            if p == NONE
                || folded[i as usize]
                || children.count[p as usize] != 1
                || ev(p).key() != ev(i).key()
            {
                continue;
            }
            children.hand_over(i, p);
            for c in children.of(p) {
                parent[c as usize] = p;
            }
            own[p as usize] = own[i as usize];
            folded[i as usize] = true;
            changed = true;
        }
        if !changed {
            break;
        }
    }

    let duration = |i: u32| i64::try_from(ev(i).duration_ns).unwrap_or(i64::MAX);
    let self_cpu: Vec<i64> = (0..n32)
        .map(|i| {
            let e = ev(i);
            if e.device || e.asynchronous() {
                0
            } else {
                children
                    .of(i)
                    .fold(duration(i), |s, c| s.saturating_sub(duration(c)))
            }
        })
        .collect();
    // Children come after their parents in the list: walking it backwards, each child's
    // device total is complete when it is added to its parent's.
    let mut device_total = own.clone();
    for &i in order.iter().rev() {
        for c in children.of(i) {
            device_total[i as usize] =
                device_total[i as usize].saturating_add(device_total[c as usize]);
        }
    }

    // torch's rows: a name on the CPU or a device, as a user annotation or not; made in the
    // list's order, as torch's averages are, so that a row's first event decides.
    let mut rows: FastMap<(&str, bool, bool), OpTotals> = FastMap::default();
    for (rank, &i) in order.iter().enumerate() {
        let e = ev(i);
        let i = i as usize;
        if folded[i] || (e.python_function && !rules.python_frames) {
            continue;
        }
        let row = (e.key(), e.device, e.user_annotation);
        let s = rows.entry(row).or_insert_with(|| OpTotals {
            name: e.key().to_string(),
            on_device: e.device,
            user_annotation: e.user_annotation,
            is_async: e.asynchronous(),
            first: rank,
            ..OpTotals::default()
        });
        s.calls += 1;
        s.self_cpu_ns = s.self_cpu_ns.saturating_add(self_cpu[i]);
        if !e.device {
            s.cpu_total_ns += e.duration_ns;
        }
        s.self_device_ns += own[i];
        s.device_total_ns += device_total[i];
    }
    rows.into_values().collect()
}

/// torch's `_format_time`, from nanoseconds.
fn fmt_time(ns: f64) -> String {
    let us = ns / 1e3;
    if us >= 1e6 {
        format!("{:.3}s", us / 1e6)
    } else if us >= 1e3 {
        format!("{:.3}ms", us / 1e3)
    } else {
        format!("{us:.3}us")
    }
}

/// torch's `_format_time_share`.
fn fmt_share(part: f64, total: f64) -> String {
    if total == 0.0 {
        "NaN".to_string()
    } else {
        format!("{:.2}%", part * 100.0 / total)
    }
}

/// The widest name column torch's table allows (`max_name_column_width`).
const NAME_WIDTH: usize = 55;
/// torch's width of every other column.
const COLUMN_WIDTH: usize = 12;

impl SortBy {
    /// The rows vLLM asks torch's table for under this sort: its default of 100 by device
    /// time, 50 by CPU time (`vllm/profiler/wrapper.py`).
    pub fn row_limit(self) -> usize {
        match self {
            SortBy::SelfDevice => 100,
            SortBy::SelfCpu => 50,
        }
    }

    /// The sort by the name torch's `table(sort_by=...)` gives it: `self_device_time_total`
    /// (or its older name `self_cuda_time_total`) and `self_cpu_time_total`.
    pub fn from_torch_key(key: &str) -> Option<Self> {
        match key {
            "self_device_time_total" | "self_cuda_time_total" => Some(SortBy::SelfDevice),
            "self_cpu_time_total" => Some(SortBy::SelfCpu),
            _ => None,
        }
    }
}

/// The table of `events` as `torch_version`'s `key_averages().table()` gives it: their totals
/// ([`op_totals`] under [`Rules::of`] that version), at most `limit` rows (vLLM's:
/// [`SortBy::row_limit`]), in torch's layout ([`table`]).
pub fn render(
    events: &[OpEvent<'_>],
    sort: SortBy,
    limit: usize,
    device: &str,
    torch_version: &str,
) -> String {
    table(
        &op_totals(events, Rules::of(torch_version)),
        sort,
        limit,
        device,
    )
}

/// The table, at most `limit` rows, sorted by `sort` (descending; ties in the order torch's
/// list has them), in the layout of torch's `key_averages().table()` as vLLM writes it to
/// `profiler_out.txt`: the same columns, widths, truncation and totals. Device columns appear
/// when any device time was recorded, named after `device` (`CUDA`, `XPU`).
pub fn table(stats: &[OpTotals], sort: SortBy, limit: usize, device: &str) -> String {
    let key = |s: &OpTotals| match sort {
        SortBy::SelfDevice => i128::from(s.self_device_ns),
        SortBy::SelfCpu => i128::from(s.self_cpu_ns),
    };
    let mut rows: Vec<&OpTotals> = stats.iter().collect();
    rows.sort_by(|a, b| key(b).cmp(&key(a)).then_with(|| a.first.cmp(&b.first)));
    if rows.is_empty() {
        return String::new();
    }
    let self_cpu_total: f64 = stats.iter().map(|s| s.self_cpu_ns as f64).sum();
    let device_total: f64 = stats
        .iter()
        .filter(|s| s.on_device && !s.user_annotation)
        .map(|s| s.self_device_ns as f64)
        .sum();
    let has_device = stats.iter().any(|s| s.self_device_ns > 0);

    // torch sizes the name column by every name, shown or not.
    let name_width = (stats
        .iter()
        .map(|r| r.name.chars().count())
        .max()
        .unwrap_or(0)
        + 4)
    .min(NAME_WIDTH);
    rows.truncate(limit);
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
        let calls = r.calls.max(1) as f64;
        let cpu_total = r.cpu_total_ns as f64;
        let mut cells = vec![
            name,
            fmt_share(r.self_cpu_ns as f64, self_cpu_total),
            fmt_time(r.self_cpu_ns as f64),
            // torch gives an asynchronous event's CPU total no share.
            if r.is_async {
                "0".to_string()
            } else {
                fmt_share(cpu_total, self_cpu_total)
            },
            fmt_time(cpu_total),
            fmt_time(cpu_total / calls),
        ];
        if has_device {
            cells.extend([
                fmt_time(r.self_device_ns as f64),
                fmt_share(r.self_device_ns as f64, device_total),
                fmt_time(r.device_total_ns as f64),
                fmt_time(r.device_total_ns as f64 / calls),
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
            end_thread: thread,
            start_ns: start,
            duration_ns: dur,
            ..OpEvent::default()
        }
    }

    /// torch 2.13's rules.
    const OLD: Rules = Rules {
        python_frames: true,
        overhead_takes_kernels: true,
    };

    /// The totals of `name`.
    fn named(stats: &[OpTotals], name: &str) -> OpTotals {
        let found = stats.iter().find(|s| s.name == name);
        found.unwrap_or_else(|| panic!("no row {name}")).clone()
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
        let stats = op_totals(&events, OLD);
        let get = |n: &str| named(&stats, n);
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
    fn torchs_rules_for_what_counts_and_how_it_nests() {
        let rows = |events: &[OpEvent<'_>]| {
            let mut s = op_totals(events, OLD);
            s.sort_by(|a, b| a.name.cmp(&b.name));
            s
        };
        // Left out: not a row, and not a child (the parent keeps its time); so is a hidden event.
        let s = rows(&[
            cpu("op", 1, 0, 100),
            cpu("aten::is_leaf", 1, 10, 20),
            OpEvent {
                hidden: true,
                ..cpu("secret", 1, 40, 20)
            },
        ]);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].self_cpu_ns, 100);
        // ProfilerStep#N counts as one name.
        let s = rows(&[
            cpu("ProfilerStep#3", 1, 0, 10),
            cpu("ProfilerStep#4", 1, 20, 10),
        ]);
        assert_eq!((s[0].name.as_str(), s[0].calls), ("ProfilerStep*", 2));
        // Ended on another thread: asynchronous, no self time, nests nothing.
        let s = rows(&[
            OpEvent {
                end_thread: 2,
                ..cpu("async", 1, 0, 100)
            },
            cpu("inside", 1, 10, 20),
        ]);
        assert_eq!((s[0].name.as_str(), s[0].self_cpu_ns), ("async", 0));
        assert_eq!(s[0].cpu_total_ns, 100);
        assert!(s[0].is_async);
        assert_eq!(s[1].self_cpu_ns, 20);
        // Overlapping children (b begins in a and outlasts it, so both are the parent's): the
        // parent's self time goes negative, as torch's does.
        let s = rows(&[
            cpu("parent", 1, 0, 100),
            cpu("a", 1, 0, 80),
            cpu("b", 1, 10, 90),
        ]);
        assert_eq!(named(&s, "parent").self_cpu_ns, -70);
        let s = rows(&[
            cpu("p", 1, 0, 100),
            cpu("c", 1, 0, 100),
            cpu("d", 1, 0, 100),
        ]);
        // d nests in c, c in p: each self is 0 but the innermost's.
        assert_eq!(
            s.iter().map(|r| r.self_cpu_ns).collect::<Vec<_>>(),
            [0, 100, 0]
        );
        let s = rows(&[
            cpu("p", 1, 0, 100),
            cpu("x", 1, 0, 60),
            cpu("y", 1, 60, 40),
            cpu("z", 1, 60, 40),
        ]);
        // y and z both lie in p after x ends (z inside y): p's own is 100 - 60 - 40 = 0.
        assert_eq!(named(&s, "p").self_cpu_ns, 0);
        // An event starting where the open one ends is not its child.
        let s = rows(&[cpu("p", 1, 0, 10), cpu("after", 1, 10, 0)]);
        assert_eq!(named(&s, "p").self_cpu_ns, 10);
    }

    #[test]
    fn rules_change_at_torch_2_14() {
        for (version, older) in [
            ("2.13.0", true),
            ("2.11.0+cu130", true),
            ("2.14.0+cu130", false),
            ("2.15.1", false),
            ("3.0.0", false),
            ("nightly", true),
        ] {
            let rules = Rules::of(version);
            assert_eq!(rules.python_frames, older, "{version}");
            assert_eq!(rules.overhead_takes_kernels, older, "{version}");
        }
        // Left out, a frame still nests: its op's self time is its own, and the frame has no
        // share of the total.
        let events = [
            OpEvent {
                python_function: true,
                ..cpu("model.py(3): forward", 1, 0, 100)
            },
            cpu("aten::mm", 1, 10, 30),
        ];
        let s = op_totals(&events, Rules::of("2.14.0"));
        assert_eq!(s.len(), 1);
        assert_eq!((s[0].name.as_str(), s[0].self_cpu_ns), ("aten::mm", 30));
        assert_eq!(op_totals(&events, OLD).len(), 2);
    }

    #[test]
    fn kernels_count_for_the_ops_that_launched_them() {
        let op = |name, start, dur, corr| OpEvent {
            correlation: corr,
            ..cpu(name, 1, start, dur)
        };
        let kernel = |name, start, dur, linked| OpEvent {
            device: true,
            thread: 7,
            end_thread: 7,
            linked_correlation: linked,
            ..cpu(name, 7, start, dur)
        };
        let events = [
            op("outer", 0, 100, 1),
            op("aten::mm", 10, 30, 2),
            kernel("gemm", 50, 40, 2),
            kernel("gemm", 95, 40, 2),
            kernel("relu_kernel", 140, 5, 1),
            OpEvent {
                user_annotation: true,
                ..kernel("gpu_annotation", 40, 200, 0)
            },
        ];
        let s = op_totals(&events, OLD);
        let get = |n: &str| named(&s, n);
        // The op's own kernels are its self device time; the total adds its children's.
        assert_eq!(get("aten::mm").self_device_ns, 80);
        assert_eq!(get("aten::mm").device_total_ns, 80);
        assert_eq!(get("outer").self_device_ns, 5);
        assert_eq!(get("outer").device_total_ns, 85);
        assert_eq!(get("gemm").self_device_ns, 80);
        assert_eq!((get("gemm").calls, get("gemm").cpu_total_ns), (2, 0));
        let t = table(&s, SortBy::SelfDevice, 10, "CUDA");
        // The device total is the device events' own time, user annotations left out.
        assert!(t.ends_with("Self CUDA time total: 0.085us\n"), "{t}");
        let first = t.lines().nth(3).unwrap();
        assert!(first.trim_start().starts_with("gpu_annotation"), "{t}");
    }

    #[test]
    fn table_sorts_and_limits() {
        let events = [
            cpu("a", 1, 0, 10),
            cpu("b", 1, 20, 30),
            cpu("b", 1, 60, 30),
            cpu("c", 1, 100, 5),
        ];
        let t = table(&op_totals(&events, OLD), SortBy::SelfCpu, 2, "CUDA");
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
        let t = table(&op_totals(&events, OLD), SortBy::SelfCpu, 10, "CUDA");
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
        let t = table(&op_totals(&[kernel], OLD), SortBy::SelfDevice, 10, "CUDA");
        assert!(
            t.contains("Self CUDA %") && t.contains("CUDA time avg"),
            "{t}"
        );
        assert!(t.ends_with("Self CUDA time total: 4.000us\n"), "{t}");
    }
}
