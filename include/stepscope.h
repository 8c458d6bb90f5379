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
 */

#ifndef STEPSCOPE_H
#define STEPSCOPE_H

/* Generated from crates/c/src/lib.rs by cbindgen (crates/c/cbindgen.toml): run `make header`, do not edit. */

#include <stddef.h>
#include <stdint.h>

/**
 * Success.
 */
#define STEPSCOPE_OK 0

/**
 * A NULL pointer, invalid UTF-8, or an out-of-range argument.
 */
#define STEPSCOPE_ERR_INVALID_ARGUMENT 1

/**
 * Malformed config JSON or a bad config field.
 */
#define STEPSCOPE_ERR_CONFIG 2

/**
 * The profiling backend failed (driver missing, driver call failed).
 */
#define STEPSCOPE_ERR_BACKEND 3

/**
 * A file could not be read or written.
 */
#define STEPSCOPE_ERR_IO 4

/**
 * Waiting for trace writing timed out.
 */
#define STEPSCOPE_ERR_TIMEOUT 5

/**
 * A bug in stepscope (a caught panic).
 */
#define STEPSCOPE_ERR_INTERNAL 6

/**
 * A start refused by a capture limit (disk, the captures still being written); nothing armed.
 */
#define STEPSCOPE_ERR_REFUSED 7

/**
 * Overrides (`delay_iterations`, `max_iterations`) follow one rule on every surface: an absent
 * override keeps the config's value, and a negative one is an error naming it
 * (`STEPSCOPE_ERR_INVALID_ARGUMENT` here, `ValueError` in Python, `stepscope::Error` in C++,
 * Rust's `StartOptions::from_signed`). C has no "absent", so it is spelled `STEPSCOPE_KEEP`;
 * C++'s `std::nullopt` and Python's `None` map to it.
 */
#define STEPSCOPE_KEEP -1

/**
 * An opaque profiler handle.
 */
typedef struct stepscope_profiler stepscope_profiler;

/**
 * What one engine iteration scheduled (C layout).
 */
typedef struct stepscope_iteration {
  /**
   * Requests in prefill.
   */
  uint32_t num_ctx_reqs;
  /**
   * Their scheduled tokens.
   */
  uint32_t num_ctx_tokens;
  /**
   * Requests in decode.
   */
  uint32_t num_gen_reqs;
  /**
   * Their scheduled tokens.
   */
  uint32_t num_gen_tokens;
} stepscope_iteration;

/**
 * One phase's work sums (vLLM's `detailed_trace_annotation` sums), over its requests, `q`
 * a request's scheduled tokens and `seq` its computed plus scheduled tokens.
 */
typedef struct stepscope_phase_work {
  /**
   * Σ seq: the KV length the phase attends over.
   */
  uint64_t seq_len_sum;
  /**
   * Σ q².
   */
  uint64_t qq_compute;
  /**
   * Σ q·seq.
   */
  uint64_t qk_compute;
} stepscope_phase_work;

/**
 * An iteration's work per phase: recorded in the trace's header for `stepscope analyze`'s
 * floor of the step, and named in the iteration's annotation with
 * `detailed_trace_annotation`.
 */
typedef struct stepscope_iteration_work {
  /**
   * Context (prefill) requests' sums.
   */
  struct stepscope_phase_work ctx;
  /**
   * Generation (decode) requests' sums.
   */
  struct stepscope_phase_work gen;
} stepscope_iteration_work;

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

/**
 * Creates a profiler. `config_json`: vLLM's `--profiler-config` JSON (stepscope's keys under
 * `"stepscope"`), or a path to a JSON file. On success `*out` is the profiler, else NULL.
 *
 * # Safety
 * `config_json` and `worker_name` are NUL-terminated strings; `out` is a valid pointer.
 */
int stepscope_profiler_new(const char *config_json,
                           const char *worker_name,
                           struct stepscope_profiler **out);

/**
 * Stops a running capture, waits for trace writing, and frees the profiler. NULL is a no-op.
 *
 * # Safety
 * `p` is NULL or a live handle from `stepscope_profiler_new`, not used afterwards.
 */
void stepscope_profiler_free(struct stepscope_profiler *p);

/**
 * Starts a session; `STEPSCOPE_KEEP` keeps the config's delay or max, another negative value
 * is `STEPSCOPE_ERR_INVALID_ARGUMENT` naming it. Ignored (`STEPSCOPE_OK`) while a session is
 * active. `STEPSCOPE_ERR_BACKEND`: the backend failed to start; the session stays active, not
 * running, until `stepscope_stop` (vLLM's behaviour). `STEPSCOPE_ERR_REFUSED`: a capture limit
 * refused the start (`stepscope.min_free_disk_mb`, `stepscope.max_capture_mb`); no session is
 * active.
 *
 * # Safety
 * `p` is a live handle.
 */
int stepscope_start(struct stepscope_profiler *p, int64_t delay_iterations, int64_t max_iterations);

/**
 * Starts a session whose window begins in the step with index `start_at_step` (the
 * worker's `stepscope_step` count, from 1) instead of after a delay; `STEPSCOPE_KEEP` keeps
 * the config's max (another negative value is an error). A step that has already passed is
 * `STEPSCOPE_ERR_INVALID_ARGUMENT`.
 *
 * # Safety
 * `p` is a live handle.
 */
int stepscope_start_at(struct stepscope_profiler *p, int64_t start_at_step, int64_t max_iterations);

/**
 * Sets the worker's global rank, which the config's `stepscope.ranks` selects by (default:
 * the `RANK` environment variable).
 *
 * # Safety
 * `p` is a live handle.
 */
int stepscope_set_rank(struct stepscope_profiler *p, uint32_t rank);

/**
 * Writes the profiler's state as NUL-terminated JSON into `buf` (`len` bytes) and the size
 * it needs, NUL included, into `*needed` (when not NULL). A `buf` too small (or NULL) is
 * `STEPSCOPE_ERR_INVALID_ARGUMENT`: call again with `*needed` bytes.
 *
 * # Safety
 * `p` is a live handle; `buf` is NULL or valid for `len` bytes; `needed` is NULL or valid.
 */
int stepscope_status_json(const struct stepscope_profiler *p,
                          char *buf,
                          size_t len,
                          size_t *needed);

/**
 * Writes the step timeline's ended steps above index `since` (0: all it holds) as
 * NUL-terminated JSON into `buf` (`len` bytes): `{"fields": [...], "steps": [[...], ...]}`,
 * each step an array in `fields` order (step, start_unix_ns, duration_ns, num_ctx_reqs,
 * num_ctx_tokens, num_gen_reqs, num_gen_tokens, phase), oldest first; `"steps": null` when
 * `stepscope.timeline` is off (`"stepscope": {"timeline": true}` or `{"steps": N}`). Never
 * blocks the engine thread. `*needed` and a too small `buf` as
 * `stepscope_status_json`; the engine may add steps between two calls, so size the second
 * buffer with room to spare or call again.
 *
 * # Safety
 * `p` is a live handle; `buf` is NULL or valid for `len` bytes; `needed` is NULL or valid.
 */
int stepscope_timeline_json(const struct stepscope_profiler *p,
                            uint64_t since,
                            char *buf,
                            size_t len,
                            size_t *needed);

/**
 * Ends the session (ignored when none is active). A stop during the delay touches no driver.
 *
 * # Safety
 * `p` is a live handle.
 */
int stepscope_stop(struct stepscope_profiler *p);

/**
 * Marks the start of an iteration (NULL: counts unknown). The iteration's range stays open
 * until `stepscope_step_end` or the next `stepscope_step`. Returns `STEPSCOPE_ERR_BACKEND`
 * when the backend failed in this step (profiling is affected; the engine can go on).
 *
 * # Safety
 * `p` is a live handle; `iteration` is NULL or valid for the call.
 */
int stepscope_step(struct stepscope_profiler *p, const struct stepscope_iteration *iteration);

/**
 * `stepscope_step` with the iteration's work per phase (NULL: unknown), for engines that
 * know each request's context length: the trace's header records it and `stepscope analyze`
 * holds the step against its floor.
 *
 * # Safety
 * `p` is a live handle; `iteration` and `work` are each NULL or valid for the call.
 */
int stepscope_step_with_work(struct stepscope_profiler *p,
                             const struct stepscope_iteration *iteration,
                             const struct stepscope_iteration_work *work);

/**
 * Records the served model's shape, `json` a UTF-8 JSON object of stepscope's model fields
 * (`layers`, `hidden_size`, `heads`, `kv_heads`, `head_dim`, `intermediate_size`,
 * `gated_mlp`, `vocab_size`, `params`, `weight_dtype`, `kv_cache_dtype`, `tensor_parallel`,
 * `experts`, `experts_per_token`, `architecture`, `unknown`; see docs/analyze.md), in the
 * header and manifest of the traces written from now on. An unknown field or a bad value is
 * `STEPSCOPE_ERR_INVALID_ARGUMENT`, naming it.
 *
 * # Safety
 * `p` is a live handle; `json` is NULL or a NUL-terminated string valid for the call.
 */
int stepscope_set_model_json(struct stepscope_profiler *p, const char *json);

/**
 * `stepscope_step` for an iteration serving `n_ids` requests: with `"stepscope":
 * {"request_ids": true}`, a captured iteration records their ids. `ids` may be NULL when
 * `n_ids` is 0.
 *
 * # Safety
 * `p` is a live handle; `iteration` is NULL or valid; `ids` is NULL or holds `n_ids` pointers,
 * each NULL or a NUL-terminated string, valid for the call.
 */
int stepscope_step_with_requests(struct stepscope_profiler *p,
                                 const struct stepscope_iteration *iteration,
                                 const char *const *ids,
                                 size_t n_ids);

/**
 * 1 when the next step can record request ids (`request_ids` on and a session armed): collect
 * them only then. 0 otherwise, and for NULL.
 *
 * # Safety
 * `p` is NULL or a live handle.
 */
int stepscope_wants_request_ids(const struct stepscope_profiler *p);

/**
 * Closes the current iteration's range, if one is open.
 *
 * # Safety
 * `p` is a live handle.
 */
int stepscope_step_end(struct stepscope_profiler *p);

/**
 * Stops a running session on the calling thread (vLLM's `shutdown`).
 *
 * # Safety
 * `p` is a live handle.
 */
int stepscope_shutdown(struct stepscope_profiler *p);

/**
 * 1 while a session is active, else 0 (also for NULL).
 *
 * # Safety
 * `p` is NULL or a live handle.
 */
int stepscope_is_active(const struct stepscope_profiler *p);

/**
 * 1 while the backend captures, else 0 (also for NULL).
 *
 * # Safety
 * `p` is NULL or a live handle.
 */
int stepscope_is_running(const struct stepscope_profiler *p);

/**
 * Waits up to `timeout_ms` for trace writing: `STEPSCOPE_OK` when nothing is pending,
 * `STEPSCOPE_ERR_TIMEOUT` otherwise.
 *
 * # Safety
 * `p` is a live handle.
 */
int stepscope_flush(struct stepscope_profiler *p, uint32_t timeout_ms);

/**
 * This thread's last error message ("" when none). Valid until the next failing call on
 * this thread.
 */
const char *stepscope_last_error(void);

/**
 * The library version, e.g. "0.1.0".
 */
const char *stepscope_version(void);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* STEPSCOPE_H */
