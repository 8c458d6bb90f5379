//! The per-iteration path allocates nothing: idle, in the delay, and while capturing with a
//! backend that reads the iteration names (after the name buffer has grown once).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

mod support;

use stepscope::{IterationInfo, ProfilerConfig, StartOptions, WorkerProfiler};
use support::ReadsNames;

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator; only counts calls made on this thread.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

fn steps_allocate(p: &WorkerProfiler, n: u32) -> u64 {
    let before = allocations();
    for i in 0..n {
        let _it = p.step(&IterationInfo::new(i % 2, 4096 + i, 255, 255));
    }
    allocations() - before
}

#[test]
fn steps_do_not_allocate_in_any_state() {
    let cfg = ProfilerConfig::from_json_str(r#"{"detailed_trace_annotation": false}"#).unwrap();
    let p = WorkerProfiler::with_backend(&cfg, "w", Box::new(ReadsNames));
    // The first step registers the engine thread (ThreadId is not allocated, but be fair).
    drop(p.step(&IterationInfo::default()));
    assert_eq!(steps_allocate(&p, 1000), 0, "idle");

    p.start_with(StartOptions {
        delay_iterations: Some(1_000_000),
        max_iterations: None,
        ..StartOptions::default()
    })
    .unwrap();
    assert_eq!(steps_allocate(&p, 1000), 0, "armed, in the delay");
    p.stop().unwrap();

    p.start().unwrap();
    assert!(p.is_running());
    // Names up to the longest one seen fit the reused buffer.
    steps_allocate(&p, 2);
    assert_eq!(steps_allocate(&p, 1000), 0, "running, names formatted");
    p.stop().unwrap();
}

#[test]
fn steps_do_not_allocate_with_the_timeline_on() {
    let cfg = ProfilerConfig::from_json_str(
        r#"{"detailed_trace_annotation": false, "stepscope": {"timeline": {"steps": 64}}}"#,
    )
    .unwrap();
    let p = WorkerProfiler::with_backend(&cfg, "w", Box::new(ReadsNames));
    drop(p.step(&IterationInfo::default()));
    // More steps than the ring holds: it wraps without allocating.
    assert_eq!(steps_allocate(&p, 1000), 0, "idle, timeline on");
    p.start().unwrap();
    steps_allocate(&p, 2);
    assert_eq!(steps_allocate(&p, 1000), 0, "running, timeline on");
    p.stop().unwrap();
    assert_eq!(p.timeline(0).map(|t| t.len()), Some(64));
}

#[test]
fn the_request_log_records_without_allocating() {
    use stepscope::config::RequestLogSize;
    use stepscope::requests::{Finish, RequestLog};

    let mut log = RequestLog::new(RequestLogSize {
        requests: 64,
        steps: 64,
    });
    // Ids made up front, as an engine holds them; 200 requests through a ring of 64.
    let ids: Vec<String> = (0..200)
        .map(|i| format!("cmpl-{i:032x}-0-abcdef01"))
        .collect();
    let before = allocations();
    for (n, id) in ids.iter().enumerate() {
        log.arrived(id, 300, Some(1));
        let s = log.begin_step(3);
        log.scheduled(s, id, 128, 0);
        log.preempted(s, id);
        log.end_step(s);
        let s = log.begin_step(0);
        log.scheduled(s, id, 172, 128);
        log.end_step(s);
        log.produced(s, id, 1);
        if n % 2 == 0 {
            log.finished(Some(s), id, Finish::Length);
        } else {
            log.finished(None, id, Finish::Abort);
        }
    }
    assert_eq!(allocations() - before, 0);
    // It recorded them: the last 64 requests, each preempted once and back.
    let d = log.document(0);
    assert_eq!(d.requests.len(), 64);
    assert!(d
        .requests
        .iter()
        .all(|r| r.preempted_at.len() == 1 && r.resumed_at.len() == 1));
}
