/*
 * stepscope C ABI: an engine-side profiler that captures chosen engine iterations with vLLM's
 * WorkerProfiler semantics (delay_iterations, max_iterations with its `> N` cutoff, per-session
 * overrides, the stop by itself), one stepscope_step() per engine iteration.
 *
 * Threads: call stepscope_step/stepscope_step_end on the engine thread. start/stop may come from
 * any thread; once the engine thread has stepped, backend work they ask for happens on the
 * engine thread at its next step (CUDA contexts need this).
 *
 * Errors: every function returning int returns STEPSCOPE_OK or an error code, and sets this
 * thread's message (stepscope_last_error). No call aborts or unwinds into the caller.
 *
 * Checked against the Rust declarations by the test suite (tests/c_abi.rs).
 */
#ifndef STEPSCOPE_H
#define STEPSCOPE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* An opaque profiler. */
typedef struct stepscope_profiler stepscope_profiler;

/* What one engine iteration scheduled. */
typedef struct stepscope_iteration {
  uint32_t num_ctx_reqs, num_ctx_tokens;   /* requests in prefill, their scheduled tokens */
  uint32_t num_gen_reqs, num_gen_tokens;   /* requests in decode, their scheduled tokens */
} stepscope_iteration;

enum {
  STEPSCOPE_OK = 0,
  STEPSCOPE_ERR_INVALID_ARGUMENT = 1, /* NULL pointer, invalid UTF-8 */
  STEPSCOPE_ERR_CONFIG = 2,           /* malformed JSON or a bad field (the message names it) */
  STEPSCOPE_ERR_BACKEND = 3,          /* driver missing or a driver call failed */
  STEPSCOPE_ERR_IO = 4,               /* a file could not be read or written */
  STEPSCOPE_ERR_TIMEOUT = 5,          /* stepscope_flush ran out of time */
  STEPSCOPE_ERR_INTERNAL = 6,         /* a bug in stepscope, caught */
  STEPSCOPE_ERR_REFUSED = 7           /* a start refused by a capture limit (disk, captures still
                                         being written; the message names the key): nothing armed */
};

/* Overrides (delay_iterations, max_iterations) follow one rule on every surface: an absent
 * override keeps the config's value, and a negative one is an error naming it
 * (STEPSCOPE_ERR_INVALID_ARGUMENT here, ValueError in Python, stepscope::Error in C++, Rust's
 * StartOptions::from_signed). C has no "absent", so it is spelled STEPSCOPE_KEEP; C++'s
 * std::nullopt and Python's None map to it. */
#define STEPSCOPE_KEEP ((int64_t)-1)

/* Creates a profiler. config_json: vLLM's --profiler-config JSON (stepscope keys under
 * "stepscope"), or a path to a JSON file. On success *out is the profiler, else NULL. */
int  stepscope_profiler_new(const char *config_json, const char *worker_name, stepscope_profiler **out);
/* Stops a running capture, flushes, frees. NULL is a no-op. */
void stepscope_profiler_free(stepscope_profiler *p);
/* Starts a session; STEPSCOPE_KEEP: the config's value, another negative value:
 * STEPSCOPE_ERR_INVALID_ARGUMENT. Ignored (STEPSCOPE_OK) while a session is active.
 * STEPSCOPE_ERR_BACKEND: the backend failed to start; the session stays active, not running,
 * until stepscope_stop (vLLM's behaviour). STEPSCOPE_ERR_REFUSED: a capture limit refused the
 * start (stepscope.min_free_disk_mb, stepscope.max_capture_mb); no session is active. */
int  stepscope_start(stepscope_profiler *p, int64_t delay_iterations, int64_t max_iterations);
/* Starts a session whose window begins in the step with index start_at_step (the worker's
 * stepscope_step count, from 1) instead of after a delay; the same step on every rank captures
 * the same iterations everywhere. A step already passed is STEPSCOPE_ERR_INVALID_ARGUMENT. */
int  stepscope_start_at(stepscope_profiler *p, int64_t start_at_step, int64_t max_iterations);
/* The worker's global rank, which the config's "stepscope": {"ranks": [...]} selects by
 * (default: the RANK environment variable). */
int  stepscope_set_rank(stepscope_profiler *p, uint32_t rank);
/* The profiler's state as NUL-terminated JSON in buf (len bytes); *needed (if not NULL) gets
 * the size required, NUL included. Too small a buf: STEPSCOPE_ERR_INVALID_ARGUMENT. */
int  stepscope_status_json(const stepscope_profiler *p, char *buf, size_t len, size_t *needed);
/* The step timeline ("stepscope": {"timeline": true} or {"steps": N}): its ended steps above
 * index since (0: all it holds) as NUL-terminated JSON {"fields": [...], "steps": [[...], ...]},
 * each step an array in fields order (step, start_unix_ns, duration_ns, num_ctx_reqs,
 * num_ctx_tokens, num_gen_reqs, num_gen_tokens, phase), oldest first; "steps": null when the
 * timeline is off. buf, len and needed as stepscope_status_json; the engine may add steps
 * between two calls. Never blocks the engine thread. */
int  stepscope_timeline_json(const stepscope_profiler *p, uint64_t since, char *buf, size_t len,
                             size_t *needed);
/* Ends the session; ignored when none is active. A stop during the delay touches no driver. */
int  stepscope_stop(stepscope_profiler *p);
/* One engine iteration begins. NULL: counts unknown. While capturing, its range stays open until
 * stepscope_step_end (or the next step). STEPSCOPE_ERR_BACKEND: the backend failed in this step;
 * the engine can go on. */
int  stepscope_step(stepscope_profiler *p, const stepscope_iteration *iteration);
/* stepscope_step for an iteration serving n_ids requests. With "stepscope": {"request_ids": true}
 * a captured iteration records their ids (trace, manifest, an NVTX marker in its range); they
 * are read only then, during the call. ids: n_ids NUL-terminated strings (NULL entries skipped),
 * or NULL when n_ids is 0. */
int  stepscope_step_with_requests(stepscope_profiler *p, const stepscope_iteration *iteration,
                                  const char *const *ids, size_t n_ids);
/* 1 when the next step can record request ids (request_ids on, a session armed): collect them
 * only then. 0 otherwise (0 for NULL). */
int  stepscope_wants_request_ids(const stepscope_profiler *p);
/* Closes the iteration's range. */
int  stepscope_step_end(stepscope_profiler *p);
/* Stops a running session on the calling thread (vLLM's shutdown). */
int  stepscope_shutdown(stepscope_profiler *p);
/* 1 or 0 (0 for NULL). */
int  stepscope_is_active(const stepscope_profiler *p);
/* 1 or 0 (0 for NULL). */
int  stepscope_is_running(const stepscope_profiler *p);
/* Waits up to timeout_ms for trace writing: STEPSCOPE_OK or STEPSCOPE_ERR_TIMEOUT. */
int  stepscope_flush(stepscope_profiler *p, uint32_t timeout_ms);
/* This thread's last error text ("" if none); valid until the next failing call on this thread. */
const char *stepscope_last_error(void);
/* The library version, e.g. "0.1.0". */
const char *stepscope_version(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* STEPSCOPE_H */
