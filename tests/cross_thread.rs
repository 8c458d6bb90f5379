//! Thread rules: backend start/stop requested from another thread happens on the engine thread
//! at its next step; before any step, calls act at once on the caller.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;

use stepscope::{StartOutcome, StopOutcome};
use support::{profiler, steps, Call};

#[test]
fn before_the_first_step_a_start_acts_at_once_on_the_caller() {
    let (p, rec) = profiler("{}");
    let p = Arc::new(p);
    let q = Arc::clone(&p);
    let caller = thread::spawn(move || {
        assert_eq!(q.start().unwrap(), StartOutcome::Started);
        thread::current().id()
    })
    .join()
    .unwrap();
    assert!(p.is_running());
    assert_eq!(
        rec.threads_of(|c| matches!(c, Call::Start { .. })),
        [caller]
    );
}

#[test]
fn cross_thread_start_acts_on_the_engine_thread_at_its_next_step() {
    let (p, rec) = profiler("{}");
    let p = Arc::new(p);
    steps(&p, 1); // this thread is now the engine thread
    let engine = thread::current().id();

    let q = Arc::clone(&p);
    let outcome = thread::spawn(move || q.start().unwrap()).join().unwrap();
    assert_eq!(outcome, StartOutcome::Deferred);
    assert!(
        p.is_active() && !p.is_running(),
        "active at once, running once started"
    );
    assert!(
        rec.calls().is_empty(),
        "no backend call off the engine thread"
    );

    assert_eq!(steps(&p, 2), [true, true]);
    assert_eq!(rec.lifecycle(), [Call::Start { first_step: 2 }]);
    assert!(rec.threads_of(|_| true).iter().all(|t| *t == engine));

    let q = Arc::clone(&p);
    let outcome = thread::spawn(move || q.stop().unwrap()).join().unwrap();
    assert_eq!(outcome, StopOutcome::Deferred);
    // The session is over, but the backend records until the engine thread stops it: status
    // says so (running, stopping), never "not running" while the profiler still records.
    assert!(!p.is_active() && p.is_running());
    let status = p.status();
    assert!(status.running && status.stopping, "{status:?}");
    assert!(
        !p.writes_since(0).settled(),
        "a stop still to be carried out"
    );
    assert_eq!(rec.lifecycle().len(), 1, "stop waits for the engine thread");
    assert_eq!(steps(&p, 1), [false]);
    assert_eq!(rec.lifecycle(), [Call::Start { first_step: 2 }, Call::Stop]);
    assert!(!p.is_running() && !p.status().stopping);
    assert!(p.writes_since(0).settled());
    assert!(rec.threads_of(|_| true).iter().all(|t| *t == engine));
}

#[test]
fn cross_thread_stop_then_start_gives_two_sessions_in_order() {
    let (p, rec) = profiler("{}");
    let p = Arc::new(p);
    steps(&p, 1);
    p.start().unwrap(); // on the engine thread: at once
    steps(&p, 1);
    let q = Arc::clone(&p);
    thread::spawn(move || {
        assert_eq!(q.stop().unwrap(), StopOutcome::Deferred);
        assert_eq!(q.start().unwrap(), StartOutcome::Deferred);
    })
    .join()
    .unwrap();
    assert_eq!(steps(&p, 1), [true]);
    assert_eq!(
        rec.lifecycle(),
        [
            Call::Start { first_step: 2 },
            Call::Stop,
            Call::Start { first_step: 3 }
        ]
    );
}

#[test]
fn cross_thread_start_then_stop_before_a_step_never_touches_the_backend() {
    let (p, rec) = profiler("{}");
    let p = Arc::new(p);
    steps(&p, 1);
    let q = Arc::clone(&p);
    thread::spawn(move || {
        q.start().unwrap();
        assert_eq!(q.stop().unwrap(), StopOutcome::Disarmed);
    })
    .join()
    .unwrap();
    steps(&p, 3);
    assert!(rec.calls().is_empty());
}

#[test]
fn concurrent_control_never_calls_the_backend_off_the_engine_thread() {
    let (p, rec) = profiler(r#"{"max_iterations": 3}"#);
    let p = Arc::new(p);
    steps(&p, 1);
    let engine = thread::current().id();
    let done = Arc::new(AtomicBool::new(false));
    let control = {
        let (p, done) = (Arc::clone(&p), Arc::clone(&done));
        thread::spawn(move || {
            let mut i = 0u64;
            while !done.load(Ordering::Relaxed) {
                if i % 2 == 0 {
                    let _ = p.start();
                } else {
                    let _ = p.stop();
                }
                i += 1;
                thread::yield_now();
            }
        })
    };
    steps(&p, 20_000);
    done.store(true, Ordering::Relaxed);
    control.join().unwrap();
    let _ = p.stop();
    steps(&p, 1);

    assert!(rec.threads_of(|_| true).iter().all(|t| *t == engine));
    // Starts and stops alternate: never two starts without a stop between.
    let mut running = false;
    for c in rec.lifecycle() {
        match c {
            Call::Start { .. } => {
                assert!(!running, "start while running");
                running = true;
            }
            Call::Stop => {
                assert!(running, "stop while stopped");
                running = false;
            }
            _ => unreachable!(),
        }
    }
    assert!(!running && !p.is_running());
}
