/* The Kineto glue: stepscope's torch backend reaches libtorch's Kineto profiler API
 * (torch/csrc/autograd/profiler_kineto.h) only through these C functions.
 *
 * libtorch's C++ ABI changes between torch minor versions, so this is the one part of stepscope
 * that is built per torch version. It is compiled two ways from the same kineto.cc:
 * - into the Rust library itself, with the `torch` feature (Rust engines that link libtorch);
 * - as a small shared library per torch minor version, `libstepscope_kineto-torch{X}.{Y}.so`,
 *   that the Python package (the `torch-dynamic` feature) loads at the first torch capture,
 *   choosing the one built for the torch loaded in the process.
 *
 * Every fallible function returns 0 on success, else non-zero with a message (UTF-8, NUL
 * terminated, truncated to fit) in `err[0..err_len]`. No C++ exception crosses this boundary.
 * Strings in are (pointer, length) pairs, not NUL terminated. Handles are opaque; each has its
 * free function, which accepts NULL. Bump STEPSCOPE_KINETO_ABI on any change here. */
#ifndef STEPSCOPE_KINETO_H
#define STEPSCOPE_KINETO_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define STEPSCOPE_KINETO_ABI 8

/* Exported from the shared glue even when built with -fvisibility=hidden. */
#define STEPSCOPE_KINETO_API __attribute__((visibility("default")))

/* What Kineto records (the `torch.profiler.profile` arguments that reach C++). */
typedef struct stepscope_kineto_options {
  uint8_t cpu;
  uint8_t cuda;
  uint8_t xpu;
  uint8_t privateuse1;
  uint8_t record_shapes;
  uint8_t profile_memory;
  uint8_t with_stack;
  uint8_t with_flops;
  uint8_t with_modules;
  /* torch's ExperimentalConfig::trace_only (ignored where stepscope_kineto_has_trace_only is 0): the
   * finalize builds only what a save reads, not the event list (KinetoEvents) nor the event
   * tree, so the result holds no events to read (stepscope_kineto_event_count is 0).
   * torch.profiler turns it off with with_stack (Python frames need the tree); the caller asks
   * for it only without stacks, modules, memory, flops or an op table. */
  uint8_t trace_only;
} stepscope_kineto_options;

/* One event of a finished session, as the op summary needs it. `name` is copied into the
 * caller's buffer (truncated to its size, not NUL terminated); `name_len` is the full length. */
typedef struct stepscope_kineto_event {
  size_t name_len;
  /* The threads it began and ended on (a GPU stream for a device event). */
  uint64_t thread;
  uint64_t end_thread;
  uint64_t start_ns;
  uint64_t duration_ns;
  /* Its correlation id, and that of the CPU event it is linked to (a kernel to the op that
   * launched it; 0 for none): torch's key_averages() adds a kernel's time to that op's. */
  uint64_t correlation;
  uint64_t linked_correlation;
  /* Recorded on a device (a kernel, memcpy, memset), not on the CPU. */
  uint8_t device;
  uint8_t is_async;
  /* torch's is_hidden_event(): key_averages() leaves it out. */
  uint8_t hidden;
  /* A user annotation (USER_ANNOTATION or GPU_USER_ANNOTATION), as torch's
   * is_user_annotation(). */
  uint8_t user_annotation;
  /* A Python frame (recorded with stacks): torch 2.14's key_averages() leaves it out. */
  uint8_t python_function;
  /* One of CUPTI's overhead records (OVERHEAD): torch 2.14 gives it no kernels. */
  uint8_t overhead;
} stepscope_kineto_event;

typedef struct stepscope_kineto_detached stepscope_kineto_detached;
typedef struct stepscope_kineto_result stepscope_kineto_result;
typedef struct stepscope_kineto_range stepscope_kineto_range;

/* STEPSCOPE_KINETO_ABI of the library. */
STEPSCOPE_KINETO_API uint32_t stepscope_kineto_abi(void);
/* The torch version the glue was compiled against ("2.13.0"), static storage. */
STEPSCOPE_KINETO_API const char* stepscope_kineto_torch_version(void);
STEPSCOPE_KINETO_API int stepscope_kineto_cuda_available(void);
/* 1 where this torch has ExperimentalConfig::trace_only (2.13 and later), else 0: the options'
 * trace_only is ignored there. */
STEPSCOPE_KINETO_API int stepscope_kineto_has_trace_only(void);
/* 1 where stepscope's serializer writes what trace_only leaves out of a Python frame, so that a
 * capture with Python stacks it saves may be finalized trace_only: torch 2.13, whose trace_only
 * leaves out only each frame's "Python parent id". 0 elsewhere: torch 2.14 on also leaves out
 * each frame's "CallFrom", which the serializer does not write. */
STEPSCOPE_KINETO_API int stepscope_kineto_writes_python_parents(void);

/* prepareProfiler; refuses while any torch profiler runs on this thread. */
STEPSCOPE_KINETO_API int stepscope_kineto_prepare(const stepscope_kineto_options* options, char* err, size_t err_len);
/* enableProfiler; `*session` identifies the session for detach(). */
STEPSCOPE_KINETO_API int stepscope_kineto_enable(const stepscope_kineto_options* options, size_t* session, char* err,
                            size_t err_len);
/* The cheap half of disableProfiler, on the enabling thread: the session leaves the thread. */
STEPSCOPE_KINETO_API int stepscope_kineto_detach(size_t session, stepscope_kineto_detached** out, char* err,
                            size_t err_len);
/* The expensive half, on any thread: Kineto's stopTrace, events materialized. */
STEPSCOPE_KINETO_API int stepscope_kineto_finalize(stepscope_kineto_detached* session, stepscope_kineto_result** out,
                              char* err, size_t err_len);
/* A detached session never finalized is finalized (and its result dropped) here. */
STEPSCOPE_KINETO_API void stepscope_kineto_detached_free(stepscope_kineto_detached* session);
/* torch's toggle_collection_dynamic for the options' CPU and CUDA activity. */
STEPSCOPE_KINETO_API int stepscope_kineto_toggle(int enable, const stepscope_kineto_options* options, char* err,
                            size_t err_len);
STEPSCOPE_KINETO_API int stepscope_kineto_add_metadata(const char* key, size_t key_len, const char* json,
                                  size_t json_len, char* err, size_t err_len);

/* The serializers a save may use: Kineto's own writer, or stepscope's (kineto_writer.h), which
 * writes the plain bulk of the events itself and leaves the rest to Kineto's, and falls back to
 * Kineto's own where Kineto's registry offers no file logger. */
#define STEPSCOPE_KINETO_SERIALIZER_KINETO 0
#define STEPSCOPE_KINETO_SERIALIZER_STEPSCOPE 1

/* Writes the trace as JSON to `path` (through `{path}.tmp`, renamed when complete). With
 * stepscope's serializer and a non-empty `reference`, Kineto's own writer also writes the same
 * capture to `reference` (for comparison). With stepscope's serializer and a `rows_ready`, the
 * save also keeps, of the activities it writes, the CPU events the op table reads (ops, user
 * annotations, Python frames: a finalize under trace_only builds no event list), and calls
 * `rows_ready(user)` once they are all kept, before the file is written;
 * stepscope_kineto_rows and stepscope_kineto_row_name read them from then on, on any thread.
 * Where the save ends without that call (an error, or Kineto's own writer writing), no rows
 * are kept. */
STEPSCOPE_KINETO_API int stepscope_kineto_save(stepscope_kineto_result* result, const char* path, size_t path_len,
                          int serializer, const char* reference, size_t reference_len,
                          void (*rows_ready)(void* user), void* user, char* err, size_t err_len);
/* The rows a save kept (above): a CPU event each, on the thread the trace names (its system
 * thread id), ending on it; its name an index into the rows' names. Read in place: valid until
 * the result is freed, and only once the save has called rows_ready. */
typedef struct stepscope_kineto_row {
  uint32_t name;
  uint8_t user_annotation;
  uint8_t python_function;
  int64_t thread;
  int64_t start_ns;
  int64_t duration_ns;
  int64_t correlation;
} stepscope_kineto_row;
STEPSCOPE_KINETO_API const stepscope_kineto_row* stepscope_kineto_rows(const stepscope_kineto_result* result,
                                                                       size_t* count);
/* The rows' distinct names: their count, and one of them (bytes, not NUL terminated; NULL
 * past the count). */
STEPSCOPE_KINETO_API size_t stepscope_kineto_row_name_count(const stepscope_kineto_result* result);
STEPSCOPE_KINETO_API const char* stepscope_kineto_row_name(const stepscope_kineto_result* result, size_t name,
                                                           size_t* len);
STEPSCOPE_KINETO_API size_t stepscope_kineto_event_count(const stepscope_kineto_result* result);
STEPSCOPE_KINETO_API int stepscope_kineto_event_at(const stepscope_kineto_result* result, size_t index,
                              stepscope_kineto_event* out, char* name, size_t name_cap, char* err,
                              size_t err_len);
/* Frees torch's event list and event tree (what event_count and event_at read; the save never
 * reads them), keeping the trace to save: the list reads empty afterwards. May run while
 * stepscope_kineto_save runs on another thread, never beside event_at. */
STEPSCOPE_KINETO_API void stepscope_kineto_result_release_events(stepscope_kineto_result* result);
STEPSCOPE_KINETO_API void stepscope_kineto_result_free(stepscope_kineto_result* result);

/* A reusable USER_SCOPE RecordFunction range: one iteration's annotation at a time. Its
 * handle is `step`, which Kineto writes as the event's "Record function id"; `n_ids` request
 * ids (pointer and length each) go into its kwinputs as "requests", which Kineto writes into
 * the event's args when the session records shapes. */
STEPSCOPE_KINETO_API int stepscope_kineto_range_new(stepscope_kineto_range** out, char* err, size_t err_len);
STEPSCOPE_KINETO_API int stepscope_kineto_range_begin(stepscope_kineto_range* range, const char* name,
                                 size_t name_len, uint64_t step, const char* const* ids,
                                 const size_t* id_lens, size_t n_ids, char* err, size_t err_len);
STEPSCOPE_KINETO_API int stepscope_kineto_range_end(stepscope_kineto_range* range, char* err, size_t err_len);
STEPSCOPE_KINETO_API void stepscope_kineto_range_free(stepscope_kineto_range* range);

#ifdef __cplusplus
}
#endif

#endif /* STEPSCOPE_KINETO_H */
