//! The capture budget (`"stepscope": {"max_capture_mb", "max_capture_s"}`) through the public
//! API with a recording backend: a window over it ends at the next step boundary through the
//! full stop, says why, and the next start works. The limits are crossed by what the test does
//! (memory it touches, time it sleeps), so each outcome is bounded whatever the machine's speed.

mod support;

use std::time::Duration;

use stepscope::schedule::CutBy;
use stepscope::{IterationInfo, ProfilerConfig, StartOutcome};
use support::{profiler, Call};

const DECODE: IterationInfo = IterationInfo::new(0, 0, 8, 8);

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
    let (p, rec) = profiler(r#"{"stepscope": {"max_capture_mb": 16, "max_capture_s": 0}}"#);
    p.start().unwrap();
    // Each captured step keeps 4 MB more, touched: the process is past 16 MB within a few
    // steps, and the first measurement, in step 32, ends the window.
    let mut held: Vec<Vec<u8>> = Vec::new();
    for _ in 0..64 {
        let _it = p.step(&DECODE);
        if !p.is_active() {
            break;
        }
        held.push(vec![7u8; 4 << 20]);
    }
    assert!(!p.is_active(), "the memory budget never ended the window");
    let cut = rec.cuts.lock()[0];
    assert_eq!((cut.by, cut.limit_mb), (CutBy::Memory, 16));
    assert!(cut.grew_mb.is_some_and(|mb| mb > 16.0), "{cut:?}");
    assert_eq!((cut.step, held.len()), (32, 31));
    assert_eq!(p.status().last_cut, Some(cut));
    drop(held);
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
