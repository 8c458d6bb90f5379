/* Every WorkerProfiler case through the C ABI, with the CUDA backend into the stub libcuda and
 * NVTX into the recorder (tests/c_abi.rs runs this with both on the loader paths). Each case
 * writes a "case" line into the doubles' log before it runs, so the harness can check the driver
 * calls and NVTX ranges case by case; return codes and states are checked here. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "stepscope.h"

/* The spec's signatures: a mismatch with the header is a compile error under -Werror. */
static int (*const sig_new)(const char *, const char *, stepscope_profiler **) = stepscope_profiler_new;
static void (*const sig_free)(stepscope_profiler *) = stepscope_profiler_free;
static int (*const sig_start)(stepscope_profiler *, int64_t, int64_t) = stepscope_start;
static int (*const sig_stop)(stepscope_profiler *) = stepscope_stop;
static int (*const sig_step)(stepscope_profiler *, const stepscope_iteration *) = stepscope_step;
static int (*const sig_step_end)(stepscope_profiler *) = stepscope_step_end;
static int (*const sig_shutdown)(stepscope_profiler *) = stepscope_shutdown;
static int (*const sig_is_active)(const stepscope_profiler *) = stepscope_is_active;
static int (*const sig_is_running)(const stepscope_profiler *) = stepscope_is_running;
static int (*const sig_flush)(stepscope_profiler *, uint32_t) = stepscope_flush;
static const char *(*const sig_last_error)(void) = stepscope_last_error;
static const char *(*const sig_version)(void) = stepscope_version;
static int (*const sig_start_at)(stepscope_profiler *, int64_t, int64_t) = stepscope_start_at;
static int (*const sig_set_rank)(stepscope_profiler *, uint32_t) = stepscope_set_rank;
static int (*const sig_status_json)(const stepscope_profiler *, char *, size_t, size_t *) =
    stepscope_status_json;
static int (*const sig_timeline_json)(const stepscope_profiler *, uint64_t, char *, size_t,
                                      size_t *) = stepscope_timeline_json;
_Static_assert(sizeof(stepscope_iteration) == 16, "stepscope_iteration is four uint32_t");
_Static_assert(STEPSCOPE_OK == 0 && STEPSCOPE_ERR_INVALID_ARGUMENT == 1 && STEPSCOPE_ERR_CONFIG == 2 &&
               STEPSCOPE_ERR_BACKEND == 3 && STEPSCOPE_ERR_IO == 4 && STEPSCOPE_ERR_TIMEOUT == 5 &&
               STEPSCOPE_ERR_INTERNAL == 6, "status codes");

static int failures = 0, checks = 0;
#define CHECK(cond)                                                              \
  do {                                                                           \
    checks++;                                                                    \
    if (!(cond)) {                                                               \
      failures++;                                                                \
      fprintf(stderr, "%s:%d: CHECK failed: %s (last error: %s)\n", __FILE__,    \
              __LINE__, #cond, stepscope_last_error());                          \
    }                                                                            \
  } while (0)
#define CHECK_CODE(expr, code) CHECK((expr) == (code))
#define CHECK_ERROR_HAS(text) CHECK(strstr(stepscope_last_error(), (text)) != NULL)

static void mark_case(const char *name) {
  const char *path = getenv("STEPSCOPE_DOUBLES_LOG");
  if (!path) return;
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd < 0) return;
  char line[256];
  int n = snprintf(line, sizeof line, "case\t%ld\t%s\n", (long)syscall(SYS_gettid), name);
  if (write(fd, line, (size_t)n) != n) perror("write");
  close(fd);
}

static stepscope_profiler *make(const char *config) {
  stepscope_profiler *p = NULL;
  int code = stepscope_profiler_new(config, "c-worker", &p);
  CHECK_CODE(code, STEPSCOPE_OK);
  CHECK(p != NULL);
  return p;
}

/* One iteration; returns whether it was captured. Counts: decode with `i` requests. */
static int iterate(stepscope_profiler *p, uint32_t i) {
  stepscope_iteration it = {0, 0, i, i};
  CHECK_CODE(stepscope_step(p, &it), STEPSCOPE_OK);
  int running = stepscope_is_running(p);
  CHECK_CODE(stepscope_step_end(p), STEPSCOPE_OK);
  return running;
}

static void cases(void) {
  stepscope_profiler *p;

  mark_case("immediate");
  p = make("{\"profiler\": \"cuda\"}");
  CHECK_CODE(stepscope_start(p, -1, -1), STEPSCOPE_OK);
  CHECK(stepscope_is_active(p) == 1 && stepscope_is_running(p) == 1);
  for (uint32_t i = 1; i <= 3; i++) CHECK(iterate(p, i));
  CHECK_CODE(stepscope_stop(p), STEPSCOPE_OK);
  CHECK(stepscope_is_active(p) == 0 && stepscope_is_running(p) == 0);
  stepscope_profiler_free(p);

  mark_case("delayed");
  p = make("{\"profiler\": \"cuda\", \"delay_iterations\": 3}");
  CHECK_CODE(stepscope_start(p, -1, -1), STEPSCOPE_OK);
  CHECK(stepscope_is_active(p) == 1 && stepscope_is_running(p) == 0);
  CHECK(!iterate(p, 1) && !iterate(p, 2) && iterate(p, 3) && iterate(p, 4));
  CHECK_CODE(stepscope_stop(p), STEPSCOPE_OK);
  stepscope_profiler_free(p);

  mark_case("max_full_reset");
  p = make("{\"profiler\": \"cuda\", \"max_iterations\": 2}");
  CHECK_CODE(stepscope_start(p, -1, -1), STEPSCOPE_OK);
  CHECK(iterate(p, 1) && iterate(p, 2) && !iterate(p, 3) && !iterate(p, 4));
  CHECK(stepscope_is_active(p) == 0);
  stepscope_profiler_free(p);

  mark_case("delay_max");
  p = make("{\"profiler\": \"cuda\", \"delay_iterations\": 2, \"max_iterations\": 3}");
  CHECK_CODE(stepscope_start(p, -1, -1), STEPSCOPE_OK);
  for (uint32_t i = 1; i <= 8; i++) iterate(p, i);
  CHECK(stepscope_is_active(p) == 0);
  stepscope_profiler_free(p);

  mark_case("duplicates");
  p = make("{\"profiler\": \"cuda\", \"max_iterations\": 5}");
  CHECK_CODE(stepscope_start(p, -1, -1), STEPSCOPE_OK);
  CHECK_CODE(stepscope_start(p, 7, 1), STEPSCOPE_OK); /* ignored: a session is active */
  CHECK(iterate(p, 1) && iterate(p, 2) && iterate(p, 3));
  CHECK_CODE(stepscope_stop(p), STEPSCOPE_OK);
  CHECK_CODE(stepscope_stop(p), STEPSCOPE_OK); /* ignored: none is active */
  stepscope_profiler_free(p);

  mark_case("inactive");
  p = make("{\"profiler\": \"cuda\"}");
  for (uint32_t i = 1; i <= 4; i++) CHECK(!iterate(p, i));
  CHECK(stepscope_is_active(p) == 0);
  stepscope_profiler_free(p);

  mark_case("start_failure");
  setenv("STEPSCOPE_STUB_CUDA_FAIL", "cuProfilerStart:5", 1);
  p = make("{\"profiler\": \"cuda\"}");
  CHECK_CODE(stepscope_start(p, -1, -1), STEPSCOPE_ERR_BACKEND);
  CHECK_ERROR_HAS("cuProfilerStart failed: CUDA_ERROR_PROFILER_DISABLED");
  CHECK(stepscope_is_active(p) == 1 && stepscope_is_running(p) == 0);
  CHECK(!iterate(p, 1) && !iterate(p, 2));
  CHECK_CODE(stepscope_stop(p), STEPSCOPE_OK);
  CHECK(stepscope_is_active(p) == 0);
  stepscope_profiler_free(p);
  unsetenv("STEPSCOPE_STUB_CUDA_FAIL");

  mark_case("delayed_start_failure");
  setenv("STEPSCOPE_STUB_CUDA_FAIL", "cuProfilerStart", 1);
  p = make("{\"profiler\": \"cuda\", \"delay_iterations\": 2}");
  CHECK_CODE(stepscope_start(p, -1, -1), STEPSCOPE_OK);
  stepscope_iteration it = {1, 8, 0, 0};
  CHECK_CODE(stepscope_step(p, &it), STEPSCOPE_OK);
  CHECK_CODE(stepscope_step(p, &it), STEPSCOPE_ERR_BACKEND); /* the delayed start fails here */
  CHECK_ERROR_HAS("CUDA_ERROR_UNKNOWN");
  CHECK_CODE(stepscope_step(p, &it), STEPSCOPE_OK);          /* reported once, not retried */
  CHECK(stepscope_is_active(p) == 1 && stepscope_is_running(p) == 0);
  stepscope_profiler_free(p);
  unsetenv("STEPSCOPE_STUB_CUDA_FAIL");

  mark_case("shutdown");
  p = make("{\"profiler\": \"cuda\"}");
  CHECK_CODE(stepscope_start(p, -1, -1), STEPSCOPE_OK);
  iterate(p, 1);
  CHECK_CODE(stepscope_shutdown(p), STEPSCOPE_OK);
  CHECK(stepscope_is_active(p) == 0 && stepscope_is_running(p) == 0);
  stepscope_profiler_free(p);

  mark_case("stop_during_delay");
  p = make("{\"profiler\": \"cuda\", \"delay_iterations\": 5}");
  CHECK_CODE(stepscope_start(p, -1, -1), STEPSCOPE_OK);
  iterate(p, 1);
  iterate(p, 2);
  CHECK_CODE(stepscope_stop(p), STEPSCOPE_OK);
  for (uint32_t i = 3; i <= 6; i++) CHECK(!iterate(p, i));
  stepscope_profiler_free(p);

  mark_case("restart_after_max");
  p = make("{\"profiler\": \"cuda\", \"max_iterations\": 1}");
  CHECK_CODE(stepscope_start(p, -1, -1), STEPSCOPE_OK);
  CHECK(iterate(p, 1) && !iterate(p, 2));
  CHECK_CODE(stepscope_start(p, -1, -1), STEPSCOPE_OK);
  CHECK(stepscope_is_running(p) == 1);
  CHECK(iterate(p, 3) && !iterate(p, 4));
  stepscope_profiler_free(p);

  mark_case("overrides");
  p = make("{\"profiler\": \"cuda\", \"delay_iterations\": 0, \"max_iterations\": 0}");
  CHECK_CODE(stepscope_start(p, 2, 1), STEPSCOPE_OK);
  CHECK(stepscope_is_running(p) == 0);
  CHECK(!iterate(p, 1) && iterate(p, 2) && !iterate(p, 3));
  CHECK(stepscope_is_active(p) == 0);
  CHECK_CODE(stepscope_start(p, -1, -1), STEPSCOPE_OK); /* back to the config: at once */
  CHECK(stepscope_is_running(p) == 1);
  CHECK(iterate(p, 4) && iterate(p, 5));
  CHECK_CODE(stepscope_stop(p), STEPSCOPE_OK);
  stepscope_profiler_free(p);

  mark_case("start_at_status");
  p = make("{\"profiler\": \"cuda\", \"max_iterations\": 2, \"stepscope\": {\"ranks\": [3]}}");
  CHECK_CODE(stepscope_set_rank(p, 3), STEPSCOPE_OK);
  iterate(p, 1);
  CHECK_CODE(stepscope_start_at(p, 1, -1), STEPSCOPE_ERR_INVALID_ARGUMENT); /* already passed */
  CHECK_ERROR_HAS("start_at_step");
  CHECK_CODE(stepscope_start_at(p, 3, -1), STEPSCOPE_OK);
  size_t needed = 0;
  CHECK_CODE(stepscope_status_json(p, NULL, 0, &needed), STEPSCOPE_ERR_INVALID_ARGUMENT);
  char status[2048];
  CHECK(needed > 2 && needed <= sizeof status);
  CHECK_CODE(stepscope_status_json(p, status, needed - 1, NULL), STEPSCOPE_ERR_INVALID_ARGUMENT);
  CHECK_CODE(stepscope_status_json(p, status, sizeof status, &needed), STEPSCOPE_OK);
  CHECK(strlen(status) + 1 == needed);
  CHECK(strstr(status, "\"phase\":\"delaying\"") != NULL);
  CHECK(strstr(status, "\"start_at_step\":3") != NULL);
  CHECK(strstr(status, "\"rank\":3") != NULL);
  CHECK(!iterate(p, 2) && iterate(p, 3) && iterate(p, 4) && !iterate(p, 5));
  stepscope_profiler_free(p);

  mark_case("rank_not_selected");
  p = make("{\"profiler\": \"cuda\", \"stepscope\": {\"ranks\": [0]}}");
  CHECK_CODE(stepscope_set_rank(p, 1), STEPSCOPE_OK);
  CHECK_CODE(stepscope_start(p, -1, -1), STEPSCOPE_OK); /* a no-op on this rank */
  CHECK(stepscope_is_active(p) == 0 && !iterate(p, 1));
  CHECK_CODE(stepscope_stop(p), STEPSCOPE_OK);
  stepscope_profiler_free(p);

  mark_case("request_ids");
  p = make("{\"profiler\": \"cuda\", \"max_iterations\": 1, \"stepscope\": {\"request_ids\": true}}");
  CHECK(stepscope_wants_request_ids(p) == 0); /* nothing armed: no ids to collect */
  CHECK_CODE(stepscope_start(p, 2, -1), STEPSCOPE_OK);
  CHECK(stepscope_wants_request_ids(p) == 1);
  {
    const char *ids1[] = {"req-skip"};
    const char *ids2[] = {"req-a", NULL, "req-b"};
    stepscope_iteration it = {1, 8, 1, 1};
    /* Step 1 is in the delay: its ids are not read. */
    CHECK_CODE(stepscope_step_with_requests(p, &it, ids1, 1), STEPSCOPE_OK);
    CHECK_CODE(stepscope_step_end(p), STEPSCOPE_OK);
    CHECK_CODE(stepscope_step_with_requests(p, &it, ids2, 3), STEPSCOPE_OK);
    CHECK_CODE(stepscope_step_end(p), STEPSCOPE_OK);
    CHECK_CODE(stepscope_step_with_requests(p, &it, NULL, 0), STEPSCOPE_OK); /* past max */
  }
  CHECK(stepscope_is_active(p) == 0 && stepscope_wants_request_ids(p) == 0);
  stepscope_profiler_free(p);
  p = make("{\"profiler\": \"cuda\"}"); /* request_ids off: ids ignored */
  CHECK_CODE(stepscope_start(p, -1, -1), STEPSCOPE_OK);
  CHECK(stepscope_wants_request_ids(p) == 0);
  {
    const char *ids[] = {"req-off"};
    stepscope_iteration it = {0, 0, 1, 1};
    CHECK_CODE(stepscope_step_with_requests(p, &it, ids, 1), STEPSCOPE_OK);
  }
  stepscope_profiler_free(p);

  /* The iteration's work: named in detail with detailed_trace_annotation; a model shape. */
  mark_case("work");
  p = make("{\"profiler\": \"cuda\", \"max_iterations\": 1, \"detailed_trace_annotation\": true}");
  CHECK_CODE(stepscope_set_model_json(p, "{\"layers\": 2, \"hidden_size\": 128}"), STEPSCOPE_OK);
  CHECK_CODE(stepscope_set_model_json(p, "{\"layrs\": 2}"), STEPSCOPE_ERR_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("layrs");
  CHECK_CODE(stepscope_set_model_json(p, NULL), STEPSCOPE_ERR_INVALID_ARGUMENT);
  CHECK_CODE(stepscope_start(p, -1, -1), STEPSCOPE_OK);
  {
    /* A new request of 4 tokens; two decodes at 9 and 6 computed tokens. */
    stepscope_iteration it = {1, 4, 2, 2};
    stepscope_iteration_work work = {{4, 16, 16}, {17, 2, 17}};
    CHECK_CODE(stepscope_step_with_work(p, &it, &work), STEPSCOPE_OK);
    CHECK_CODE(stepscope_step_end(p), STEPSCOPE_OK);
    CHECK_CODE(stepscope_step_with_work(p, &it, NULL), STEPSCOPE_OK); /* past max */
  }
  stepscope_profiler_free(p);

  /* The step timeline: the last 16 of 20 steps, a capture in steps 18-19 among them. */
  mark_case("timeline");
  p = make("{\"profiler\": \"cuda\", \"stepscope\": {\"timeline\": {\"steps\": 16}}}");
  for (uint32_t i = 1; i <= 17; i++) CHECK(!iterate(p, i));
  CHECK_CODE(stepscope_start(p, -1, 2), STEPSCOPE_OK);
  CHECK(iterate(p, 18) && iterate(p, 19) && !iterate(p, 20));
  {
    static char json[8192];
    size_t needed = 0;
    CHECK_CODE(stepscope_timeline_json(p, 0, NULL, 0, &needed), STEPSCOPE_ERR_INVALID_ARGUMENT);
    CHECK(needed > 2 && needed <= sizeof json);
    CHECK_CODE(stepscope_timeline_json(p, 0, json, sizeof json, &needed), STEPSCOPE_OK);
    CHECK(strlen(json) + 1 == needed);
    CHECK(strstr(json, "\"fields\":[\"step\",\"start_unix_ns\",\"duration_ns\"") != NULL);
    CHECK(strstr(json, "[4,") == NULL && strstr(json, "[5,") != NULL && strstr(json, "[20,") != NULL);
    /* Step 18, captured: decode with 18 requests and 18 tokens, phase running. */
    const char *s18 = strstr(json, "[18,");
    CHECK(s18 != NULL && strstr(s18, ",0,0,18,18,\"running\"]") != NULL);
    CHECK_CODE(stepscope_timeline_json(p, 18, json, sizeof json, &needed), STEPSCOPE_OK);
    CHECK(strstr(json, "[18,") == NULL && strstr(json, "[19,") != NULL && strstr(json, "[20,") != NULL);
  }
  stepscope_profiler_free(p);
  p = make("{\"profiler\": \"cuda\"}");
  {
    char json[256];
    CHECK_CODE(stepscope_timeline_json(p, 0, json, sizeof json, NULL), STEPSCOPE_OK);
    CHECK(strstr(json, "\"steps\":null") != NULL);
  }
  stepscope_profiler_free(p);

  /* The slow-step trigger: step 4 spans 400 ms between step and step_end (the others
   * microseconds, against a 150 ms threshold); the window of 2 begins in step 5. */
  mark_case("slow_step");
  p = make("{\"profiler\": \"cuda\", \"max_iterations\": 2, \"stepscope\": {\"slow_step_ms\": 150}}");
  CHECK_CODE(stepscope_start(p, -1, -1), STEPSCOPE_OK);
  for (uint32_t i = 1; i <= 8; i++) {
    stepscope_iteration it = {0, 0, i, i};
    CHECK_CODE(stepscope_step(p, &it), STEPSCOPE_OK);
    if (i == 4) {
      struct timespec slow = {0, 400 * 1000 * 1000};
      nanosleep(&slow, NULL);
    }
    CHECK_CODE(stepscope_step_end(p), STEPSCOPE_OK);
  }
  {
    char status[4096];
    size_t needed = 0;
    CHECK_CODE(stepscope_status_json(p, status, sizeof status, &needed), STEPSCOPE_OK);
    CHECK(strstr(status, "\"trigger_step\":{\"step\":4,") != NULL);
    CHECK(strstr(status, "\"slow_step_ms\":150.0") != NULL);
  }
  stepscope_profiler_free(p);

  mark_case("unknown_counts_and_free_stops");
  p = make("{\"profiler\": \"cuda\"}");
  CHECK_CODE(stepscope_start(p, -1, -1), STEPSCOPE_OK);
  CHECK_CODE(stepscope_step(p, NULL), STEPSCOPE_OK);
  CHECK_CODE(stepscope_step_end(p), STEPSCOPE_OK);
  CHECK_CODE(stepscope_flush(p, 1000), STEPSCOPE_OK);
  stepscope_profiler_free(p); /* stops the running capture */
}

static void bad_arguments(void) {
  mark_case("bad_arguments");
  stepscope_profiler *p = (stepscope_profiler *)0x1;
  CHECK_CODE(stepscope_profiler_new(NULL, "w", &p), STEPSCOPE_ERR_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("config_json");
  CHECK(p == NULL);
  CHECK_CODE(stepscope_profiler_new("{}", NULL, &p), STEPSCOPE_ERR_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("worker_name");
  CHECK_CODE(stepscope_profiler_new("{}", "w", NULL), STEPSCOPE_ERR_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("out");
  CHECK_CODE(stepscope_profiler_new("{}", "\xff\xfe", &p), STEPSCOPE_ERR_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("UTF-8");
  CHECK_CODE(stepscope_profiler_new("{\"profiler\": \"cuda\",}", "w", &p), STEPSCOPE_ERR_CONFIG);
  CHECK_ERROR_HAS("line 1 column");
  CHECK_CODE(stepscope_profiler_new("{\"max_iterations\": -1}", "w", &p), STEPSCOPE_ERR_CONFIG);
  CHECK_ERROR_HAS("`max_iterations`");
  CHECK_CODE(stepscope_profiler_new("{\"profiler\": \"proton\"}", "w", &p), STEPSCOPE_ERR_CONFIG);
  CHECK_ERROR_HAS("Proton");
  CHECK_CODE(stepscope_profiler_new("/nonexistent/stepscope.json", "w", &p), STEPSCOPE_ERR_IO);
  CHECK_ERROR_HAS("/nonexistent/stepscope.json");
  CHECK_CODE(stepscope_profiler_new("{\"profiler\": \"torch\", \"torch_profiler_dir\": \"/tmp/t\"}", "w", &p),
             STEPSCOPE_ERR_BACKEND);
  CHECK_ERROR_HAS("torch");
  CHECK(p == NULL);

  CHECK_CODE(stepscope_start(NULL, -1, -1), STEPSCOPE_ERR_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("NULL");

  /* STEPSCOPE_KEEP keeps the config's value; any other negative override is an error naming it. */
  CHECK_CODE(stepscope_profiler_new("{}", "w", &p), STEPSCOPE_OK);
  CHECK_CODE(stepscope_start(p, -2, STEPSCOPE_KEEP), STEPSCOPE_ERR_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("`delay_iterations`");
  CHECK_CODE(stepscope_start_at(p, 5, -3), STEPSCOPE_ERR_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("`max_iterations`");
  CHECK(stepscope_is_active(p) == 0);
  CHECK_CODE(stepscope_start(p, STEPSCOPE_KEEP, STEPSCOPE_KEEP), STEPSCOPE_OK);
  CHECK(stepscope_is_active(p) == 1);
  stepscope_profiler_free(p);
  p = NULL;
  CHECK_CODE(stepscope_stop(NULL), STEPSCOPE_ERR_INVALID_ARGUMENT);
  CHECK_CODE(stepscope_step(NULL, NULL), STEPSCOPE_ERR_INVALID_ARGUMENT);
  CHECK_CODE(stepscope_step_end(NULL), STEPSCOPE_ERR_INVALID_ARGUMENT);
  CHECK_CODE(stepscope_shutdown(NULL), STEPSCOPE_ERR_INVALID_ARGUMENT);
  CHECK_CODE(stepscope_flush(NULL, 0), STEPSCOPE_ERR_INVALID_ARGUMENT);
  CHECK(stepscope_is_active(NULL) == 0 && stepscope_is_running(NULL) == 0);
  stepscope_profiler_free(NULL);

  CHECK(strlen(stepscope_version()) > 0);
  CHECK(sig_version == stepscope_version && sig_last_error == stepscope_last_error);
  (void)sig_new; (void)sig_free; (void)sig_start; (void)sig_stop; (void)sig_step; (void)sig_step_end;
  (void)sig_shutdown; (void)sig_is_active; (void)sig_is_running; (void)sig_flush;
  (void)sig_start_at; (void)sig_set_rank; (void)sig_status_json; (void)sig_timeline_json;
  CHECK_CODE(stepscope_step_with_requests(NULL, NULL, NULL, 0), STEPSCOPE_ERR_INVALID_ARGUMENT);
  CHECK_CODE(stepscope_step_with_work(NULL, NULL, NULL), STEPSCOPE_ERR_INVALID_ARGUMENT);
  CHECK_CODE(stepscope_set_model_json(NULL, "{}"), STEPSCOPE_ERR_INVALID_ARGUMENT);
  CHECK(stepscope_wants_request_ids(NULL) == 0);
}

int main(void) {
  cases();
  bad_arguments();
  mark_case("end");
  printf("abi_cases: %d checks, %d failed\n", checks, failures);
  return failures ? 1 : 0;
}
