/* A control thread starts and stops captures while the engine thread steps, as an HTTP
 * handler and an engine loop do. Run under valgrind by tests/c_abi.rs; the harness also checks
 * that every driver call happened on the engine thread. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "stepscope.h"

static atomic_int done = 0;

static void nap(long us) {
  struct timespec ts = {0, us * 1000};
  nanosleep(&ts, NULL);
}

static void *control(void *arg) {
  stepscope_profiler *p = arg;
  for (int i = 0; i < 40; i++) {
    if (stepscope_start(p, i % 3, 2 + i % 2) != STEPSCOPE_OK) fprintf(stderr, "start: %s\n", stepscope_last_error());
    nap(300);
    if (stepscope_stop(p) != STEPSCOPE_OK) fprintf(stderr, "stop: %s\n", stepscope_last_error());
    nap(200);
  }
  atomic_store(&done, 1);
  return NULL;
}

int main(void) {
  stepscope_profiler *p = NULL;
  if (stepscope_profiler_new("{\"profiler\": \"cuda\"}", "threads", &p) != STEPSCOPE_OK) {
    fprintf(stderr, "new: %s\n", stepscope_last_error());
    return 1;
  }
  stepscope_iteration first = {0, 0, 0, 0};
  stepscope_step(p, &first); /* this thread becomes the engine thread */
  stepscope_step_end(p);
  printf("engine_tid=%ld\n", (long)syscall(SYS_gettid));
  pthread_t t;
  if (pthread_create(&t, NULL, control, p) != 0) return 1;
  unsigned steps = 0;
  while (!atomic_load(&done)) {
    stepscope_iteration it = {steps % 4 == 0, 64, 16, 16};
    stepscope_step(p, &it);
    nap(50); /* the forward pass */
    stepscope_step_end(p);
    steps++;
  }
  pthread_join(t, NULL);
  stepscope_stop(p);
  stepscope_step(p, NULL); /* carries out a stop the control thread left pending */
  stepscope_step_end(p);
  printf("steps=%u running=%d\n", steps, stepscope_is_running(p));
  stepscope_profiler_free(p);
  return 0;
}
