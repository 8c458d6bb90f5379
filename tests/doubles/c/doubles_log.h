/* The shared event log of the test doubles: one line per event, appended with a single
 * write(2) to the file named by STEPSCOPE_DOUBLES_LOG (opened O_APPEND), so the stub driver and
 * the NVTX recorder in one process produce one totally ordered log. Fields are tab-separated:
 *   <source> <tid> <event> [fields...]
 */
#ifndef STEPSCOPE_DOUBLES_LOG_H
#define STEPSCOPE_DOUBLES_LOG_H

#define _GNU_SOURCE
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static int doubles_log_fd(void) {
  static int fd = -2;
  if (fd == -2) {
    const char *path = getenv("STEPSCOPE_DOUBLES_LOG");
    fd = (path && *path) ? open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644) : -1;
  }
  return fd;
}

__attribute__((format(printf, 2, 3)))
static void doubles_log(const char *source, const char *fmt, ...) {
  int fd = doubles_log_fd();
  if (fd < 0) return;
  char line[4096];
  int n = snprintf(line, sizeof line, "%s\t%ld\t", source, (long)syscall(SYS_gettid));
  va_list ap;
  va_start(ap, fmt);
  n += vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
  va_end(ap);
  if (n > (int)sizeof line - 2) n = (int)sizeof line - 2;
  line[n++] = '\n';
  ssize_t w = write(fd, line, (size_t)n);
  (void)w;
}

#endif
