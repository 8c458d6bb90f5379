/* A stub NVIDIA driver (libcuda.so) for tests without a GPU. It exports only the driver calls
 * stepscope's CUDA backend may use, logs each call with its thread to STEPSCOPE_DOUBLES_LOG, and
 * is steered by the environment of the process under test:
 *   STEPSCOPE_STUB_CUDA_FAIL=cuProfilerStart[:code]  that call returns `code` (default 999,
 *                                                   CUDA_ERROR_UNKNOWN); comma-separated list
 *   STEPSCOPE_STUB_CUDA_NO_CONTEXT=1                no thread starts with a current context
 * Contexts are per thread, as in the real driver: cuCtxSetCurrent sets the calling thread's.
 */
#include "doubles_log.h"

#include <stdint.h>

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;

enum { CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1, CUDA_ERROR_UNKNOWN = 999 };

static struct CUctx_st { int device; } primary_ctx = {0}, ambient_ctx = {0};
static __thread int ctx_set = 0;
static __thread CUcontext current_ctx = 0;

/* The error code this call is told to fail with, or 0. */
static CUresult injected(const char *call) {
  const char *spec = getenv("STEPSCOPE_STUB_CUDA_FAIL");
  if (!spec) return CUDA_SUCCESS;
  size_t n = strlen(call);
  for (const char *p = spec; *p;) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    if (len >= n && strncmp(p, call, n) == 0 && (len == n || p[n] == ':')) {
      return (len > n) ? (CUresult)atoi(p + n + 1) : CUDA_ERROR_UNKNOWN;
    }
    p += len + (end ? 1 : 0);
  }
  return CUDA_SUCCESS;
}

static CUresult done(const char *call, CUresult r) {
  doubles_log("cuda", "%s\t%d", call, r);
  return r;
}

static CUcontext thread_current(void) {
  if (!ctx_set) {
    const char *none = getenv("STEPSCOPE_STUB_CUDA_NO_CONTEXT");
    current_ctx = (none && *none == '1') ? 0 : &ambient_ctx;
    ctx_set = 1;
  }
  return current_ctx;
}

CUresult cuInit(unsigned int flags) {
  if (flags != 0) return done("cuInit", CUDA_ERROR_INVALID_VALUE);
  return done("cuInit", injected("cuInit"));
}

CUresult cuCtxGetCurrent(CUcontext *pctx) {
  if (!pctx) return done("cuCtxGetCurrent", CUDA_ERROR_INVALID_VALUE);
  CUresult r = injected("cuCtxGetCurrent");
  if (r == CUDA_SUCCESS) *pctx = thread_current();
  doubles_log("cuda", "cuCtxGetCurrent\t%d\t%s", r, (r == 0 && *pctx) ? "context" : "none");
  return r;
}

CUresult cuDeviceGet(CUdevice *dev, int ordinal) {
  if (!dev || ordinal < 0) return done("cuDeviceGet", CUDA_ERROR_INVALID_VALUE);
  CUresult r = injected("cuDeviceGet");
  if (r == CUDA_SUCCESS) *dev = ordinal;
  doubles_log("cuda", "cuDeviceGet\t%d\t%d", r, ordinal);
  return r;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
  if (!pctx) return done("cuDevicePrimaryCtxRetain", CUDA_ERROR_INVALID_VALUE);
  CUresult r = injected("cuDevicePrimaryCtxRetain");
  if (r == CUDA_SUCCESS) {
    primary_ctx.device = dev;
    *pctx = &primary_ctx;
  }
  doubles_log("cuda", "cuDevicePrimaryCtxRetain\t%d\t%d", r, dev);
  return r;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
  CUresult r = injected("cuCtxSetCurrent");
  if (r == CUDA_SUCCESS) {
    thread_current();
    current_ctx = ctx;
  }
  doubles_log("cuda", "cuCtxSetCurrent\t%d\t%s", r, ctx == &primary_ctx ? "primary" : "other");
  return r;
}

CUresult cuProfilerStart(void) {
  if (!thread_current()) return done("cuProfilerStart", 201 /* INVALID_CONTEXT */);
  return done("cuProfilerStart", injected("cuProfilerStart"));
}

CUresult cuProfilerStop(void) {
  if (!thread_current()) return done("cuProfilerStop", 201 /* INVALID_CONTEXT */);
  return done("cuProfilerStop", injected("cuProfilerStop"));
}

static const char *error_name(CUresult e) {
  switch (e) {
    case 0: return "CUDA_SUCCESS";
    case 1: return "CUDA_ERROR_INVALID_VALUE";
    case 3: return "CUDA_ERROR_NOT_INITIALIZED";
    case 5: return "CUDA_ERROR_PROFILER_DISABLED";
    case 100: return "CUDA_ERROR_NO_DEVICE";
    case 201: return "CUDA_ERROR_INVALID_CONTEXT";
    case 999: return "CUDA_ERROR_UNKNOWN";
    default: return 0;
  }
}

CUresult cuGetErrorName(CUresult error, const char **pstr) {
  if (!pstr) return CUDA_ERROR_INVALID_VALUE;
  *pstr = error_name(error);
  return *pstr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult error, const char **pstr) {
  if (!pstr) return CUDA_ERROR_INVALID_VALUE;
  switch (error) {
    case 3: *pstr = "initialization error"; break;
    case 5: *pstr = "profiler disabled while using a profiling tool"; break;
    case 100: *pstr = "no CUDA-capable device is detected"; break;
    case 201: *pstr = "invalid device context"; break;
    case 999: *pstr = "unknown error"; break;
    default: *pstr = error_name(error); break;
  }
  return *pstr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
