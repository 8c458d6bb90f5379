//! The capture budget (`"stepscope": {"max_capture_mb", "max_capture_s"}`) through the public
//! API with a recording backend: a window over it ends at the next step boundary through the
//! full stop, says why, and the next start works. The limits are crossed by what the test does
//! (memory it touches, time it sleeps), so each outcome is bounded whatever the machine's speed.

mod support;

use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use parking_lot::Mutex;

use stepscope::schedule::CutBy;
use stepscope::{IterationInfo, ProfilerConfig, StartOutcome, WorkerProfiler};
use support::{profiler, Call};

const DECODE: IterationInfo = IterationInfo::new(0, 0, 8, 8);

/// The tests that measure the process's memory, one at a time: what one allocates or frees
/// would be another's growth.
static MEMORY: Mutex<()> = Mutex::new(());

/// Steps the engine up to 64 times, until the window ends; after each step still captured,
/// `each` gets its index (what the test does in that step's iteration).
fn steps_until_cut(p: &WorkerProfiler, mut each: impl FnMut(u64)) {
    for _ in 0..64 {
        let _it = p.step(&DECODE);
        if !p.is_active() {
            return;
        }
        each(p.step_index());
    }
}

#[test]
fn a_window_over_its_time_budget_ends_through_the_full_stop_and_the_next_start_works() {
    let (p, rec) = profiler(r#"{"stepscope": {"max_capture_s": 0.2, "max_capture_mb": 0}}"#);
    assert_eq!(p.status().max_capture_s, 0.2);
    p.start().unwrap();
    // The budget measures every 32nd step of a window; every step lasts at least 10 ms, so at
    // the first measurement, in step 32, the window has run at least 310 ms.
    let mut ended_in = None;
    for _ in 0..64 {
        let it = p.step(&DECODE);
        if !p.is_active() {
            ended_in = Some(p.step_index());
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
        drop(it);
    }
    let step = ended_in.expect("the time budget ended the window");
    assert_eq!(step, 32, "the first measurement ends it");
    let cuts = rec.cuts.lock().clone();
    assert_eq!(cuts.len(), 1, "{cuts:?}");
    let cut = cuts[0];
    assert_eq!((cut.by, cut.step), (CutBy::Time, step));
    assert!(cut.seconds > 0.2 && cut.limit_s == 0.2, "{cut:?}");
    assert_eq!(
        cut.grew_mb, None,
        "memory is not measured with max_capture_mb 0"
    );
    // The full stop: the step the window ended in is not captured, the backend stopped once.
    let lifecycle = rec.lifecycle();
    assert_eq!(lifecycle.iter().filter(|c| **c == Call::Stop).count(), 1);
    assert_eq!(rec.captured_steps().last(), Some(&(step - 1)));
    let status = p.status();
    assert_eq!((status.phase, status.last_cut), ("idle", Some(cut)));
    // The engine goes on, and the next start works.
    assert!(!p.step(&DECODE).is_captured());
    assert!(matches!(p.start(), Ok(StartOutcome::Started)));
    assert!(p.step(&DECODE).is_captured());
    p.stop().unwrap();
}

#[test]
fn a_window_over_its_memory_budget_ends_naming_how_much_the_process_grew() {
    let _alone = MEMORY.lock();
    let (p, rec) = profiler(r#"{"stepscope": {"max_capture_mb": 16, "max_capture_s": 0}}"#);
    p.start().unwrap();
    // Each captured step keeps 4 MB more, touched: the process is past 16 MB within a few
    // steps, and the first measurement, in step 32, ends the window.
    let mut held: Vec<Vec<u8>> = Vec::new();
    steps_until_cut(&p, |_| held.push(vec![7u8; 4 << 20]));
    assert!(!p.is_active(), "the memory budget never ended the window");
    let cut = rec.cuts.lock()[0];
    assert_eq!((cut.by, cut.limit_mb), (CutBy::Memory, 16));
    assert!(cut.grew_mb.is_some_and(|mb| mb > 16.0), "{cut:?}");
    assert_eq!((cut.step, held.len()), (32, 31));
    assert_eq!(p.status().last_cut, Some(cut));
    drop(held);
}

/// What the process frees during a window is the window's to reuse, and not growth when it is
/// used again, except what earlier captures free behind the engine (their buffers go after
/// their trace is on disk): a window begun while its backend says so is measured, from the
/// first reading once that is done, from the lower of its start's memory and the memory then.
#[test]
fn a_window_begun_while_earlier_captures_are_freed_is_measured_from_after_the_free() {
    let _alone = MEMORY.lock();
    for settling in [false, true] {
        let (p, rec) = profiler(r#"{"stepscope": {"max_capture_mb": 16, "max_capture_s": 0}}"#);
        // What an earlier capture holds until it is freed: 64 MB, touched.
        let mut earlier = Some(vec![7u8; 64 << 20]);
        rec.settling.store(settling, SeqCst);
        p.start().unwrap();
        let mut held: Vec<Vec<u8>> = Vec::new();
        steps_until_cut(&p, |step| match step {
            // Freed after the window's start, before its first reading (in step 32).
            1 => {
                drop(earlier.take());
                rec.settling.store(false, SeqCst);
            }
            // The next reading is the next check's, in step 64, once a millisecond has passed
            // since this one's.
            32 => std::thread::sleep(Duration::from_millis(2)),
            // 31 MB more: over the budget from after the free, 33 MB under it from the start.
            33..=63 => held.push(vec![7u8; 1 << 20]),
            _ => {}
        });
        let cuts = rec.cuts.lock().clone();
        if settling {
            assert!(!p.is_active(), "the window was measured from its start");
            assert_eq!(cuts.len(), 1, "{cuts:?}");
            assert_eq!((cuts[0].by, cuts[0].step), (CutBy::Memory, 64));
            assert!(cuts[0].grew_mb.is_some_and(|mb| mb > 16.0), "{cuts:?}");
        } else {
            // Its own memory, freed in its first step: measured from its start, as before.
            assert!(p.is_running() && cuts.is_empty(), "{cuts:?}");
            p.stop().unwrap();
        }
        drop(held);
    }
}

#[test]
fn zero_turns_the_limits_off_and_the_defaults_are_on() {
    let (p, rec) = profiler(r#"{"stepscope": {"max_capture_mb": 0, "max_capture_s": 0}}"#);
    p.start().unwrap();
    for _ in 0..5 {
        let _it = p.step(&DECODE);
    }
    assert!(p.is_running() && rec.cuts.lock().is_empty());
    let status = p.status();
    assert_eq!((status.max_capture_mb, status.max_capture_s), (0, 0.0));

    let defaults = ProfilerConfig::default().stepscope.budget;
    assert!(
        (256..=2048).contains(&defaults.max_capture_mb),
        "{defaults:?}"
    );
    assert_eq!(defaults.max_capture, Duration::from_secs(300));
    assert_eq!(defaults.min_free_disk_mb, 1024);
    let (p, _) = profiler("{}");
    assert_eq!(p.status().max_capture_mb, defaults.max_capture_mb);
}

#[test]
fn budget_keys_are_validated_with_an_error_naming_them() {
    for (json, key) in [
        (
            r#"{"stepscope": {"max_capture_mb": -1}}"#,
            "stepscope.max_capture_mb",
        ),
        (
            r#"{"stepscope": {"max_capture_mb": 1.5}}"#,
            "stepscope.max_capture_mb",
        ),
        (
            r#"{"stepscope": {"max_capture_s": "1"}}"#,
            "stepscope.max_capture_s",
        ),
        (
            r#"{"stepscope": {"max_capture_s": -2}}"#,
            "stepscope.max_capture_s",
        ),
        (
            r#"{"stepscope": {"min_free_disk_mb": -1}}"#,
            "stepscope.min_free_disk_mb",
        ),
    ] {
        let e = ProfilerConfig::from_json_str(json).expect_err(json);
        assert_eq!(e.field(), Some(key), "{json}: {e}");
    }
}
