//! The fleet's timelines gathered over one or more polls: every server at once (at most
//! `--concurrency`, each with `--retries`), incrementally (`?since=` the last step seen), the
//! steps of each worker merged once and bounded.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::ctl::answers::{timeline_workers, WorkerTimeline};
use crate::ctl::fleet::{Action, Worker};
use crate::ctl::http::{after_tries, explain_status, explain_transport, get, retrying};
use crate::flags::Engine;
use crate::par::par_map;

/// A server that gave no timeline, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Failure {
    pub url: String,
    pub error: String,
}

/// What the fleet's timelines are, gathered over one or more polls.
#[derive(Default)]
pub(super) struct Gathered {
    workers: BTreeMap<(String, String), WorkerTimeline>,
    pub(super) failures: Vec<Failure>,
    /// Steps kept per worker: what its ring holds is enough.
    keep: usize,
}

impl Gathered {
    /// Nothing gathered yet; up to `keep` steps kept per worker.
    pub(super) fn new(keep: usize) -> Self {
        Gathered {
            keep,
            ..Gathered::default()
        }
    }

    pub(super) fn since(&self, url: &str) -> u64 {
        // One `since` per server: the smallest last step of its workers (their step counts
        // advance together; a worker that lags only re-sends steps already seen).
        self.workers
            .values()
            .filter(|w| w.url == url)
            .map(|w| {
                w.steps
                    .as_ref()
                    .and_then(|s| s.last())
                    .map_or(0, |s| s.step)
            })
            .min()
            .unwrap_or(0)
    }

    pub(super) fn merge(&mut self, fresh: WorkerTimeline) {
        let keep = self.keep.max(1);
        match self.workers.get_mut(&key(&fresh)) {
            Some(old) => {
                let seen = old
                    .steps
                    .as_ref()
                    .and_then(|s| s.last())
                    .map_or(0, |s| s.step);
                if let (Some(steps), Some(new)) = (old.steps.as_mut(), fresh.steps.as_ref()) {
                    steps.extend(new.iter().filter(|s| s.step > seen).cloned());
                    let excess = steps.len().saturating_sub(keep);
                    steps.drain(..excess);
                } else {
                    old.steps = fresh.steps.clone();
                }
                old.phase = fresh.phase;
                old.step_index = fresh.step_index;
                old.now_unix_ns = fresh.now_unix_ns;
                old.rank = fresh.rank;
            }
            None => {
                self.workers.insert(key(&fresh), fresh);
            }
        }
    }

    /// Asks every server (at most `concurrency` at a time) for the steps it has not sent yet.
    pub(super) fn poll(
        &mut self,
        agent: &ureq::Agent,
        engine: Engine,
        servers: &[Worker],
        concurrency: usize,
        retries: u32,
    ) {
        let urls: Vec<(String, u64)> = servers
            .iter()
            .map(|w| (w.url.clone(), self.since(&w.url)))
            .collect();
        let answers = par_map(&urls, concurrency, |(url, since)| {
            fetch(agent, engine, url, *since, retries)
        });
        self.failures.clear();
        for ((url, _), answer) in urls.into_iter().zip(answers) {
            match answer.unwrap_or_else(|| Err("internal error: no result recorded".into())) {
                Ok(workers) => workers.into_iter().for_each(|w| self.merge(w)),
                Err(error) => self.failures.push(Failure { url, error }),
            }
        }
    }

    pub(super) fn list(&self) -> Vec<WorkerTimeline> {
        let mut v: Vec<WorkerTimeline> = self.workers.values().cloned().collect();
        v.sort_by(|a, b| (a.rank, &a.url, &a.worker_name).cmp(&(b.rank, &b.url, &b.worker_name)));
        v
    }
}

fn fetch(
    agent: &ureq::Agent,
    engine: Engine,
    url: &str,
    since: u64,
    retries: u32,
) -> Result<Vec<WorkerTimeline>, String> {
    let full = match engine {
        Engine::Vllm => format!("{url}/stepscope/timeline?since={since}"),
        // Each scheduler's last steps ride on /server_info (no since: repeats are merged).
        Engine::Sglang => format!("{url}/server_info"),
    };
    let (answer, spent) = retrying(retries, || get(agent, &full));
    match answer {
        Ok((200, body)) => timeline_workers(engine, url, &body),
        Ok((s, body)) => Err(after_tries(
            format!(
                "{url}: {}",
                explain_status(engine, Action::Timeline, s, &body)
            ),
            spent,
        )),
        Err(e) => Err(after_tries(explain_transport(&e, url), spent)),
    }
}

fn key(w: &WorkerTimeline) -> (String, String) {
    (w.url.clone(), w.worker_name.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctl::top::testing::worker;

    #[test]
    fn polls_merge_new_steps_once() {
        let now = 1_000_000_000;
        let mut g = Gathered::new(4);
        g.merge(worker("a", 0, &[1, 2, 3], now));
        assert_eq!(g.since("http://h:1"), 3);
        // The next answer repeats step 3 and brings 4..6: 3 once, and only the last 4 kept.
        let mut next = worker("a", 0, &[1, 2, 3, 4, 5, 6], now);
        next.steps.as_mut().unwrap().drain(..2);
        g.merge(next);
        let steps: Vec<u64> = g.list()[0]
            .steps
            .as_ref()
            .unwrap()
            .iter()
            .map(|s| s.step)
            .collect();
        assert_eq!(steps, [3, 4, 5, 6]);
    }
}
