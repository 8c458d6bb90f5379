/* An NVTX injection library that records what Nsight Systems would see. The NVTX runtime inside
 * the process loads it through NVTX_INJECTION64_PATH and calls InitializeInjectionNvtx2, the
 * same entry point nsys uses; we then install our handlers into the core and domain (CORE2)
 * function tables. Each event becomes one line of STEPSCOPE_DOUBLES_LOG (see doubles_log.h):
 *   nvtx <tid> domain_create <name>
 *   nvtx <tid> name_category <domain> <id> <name>
 *   nvtx <tid> register_string <domain> <string>
 *   nvtx <tid> push <domain> <message> <payload> <category> <color>
 *   nvtx <tid> pop <domain>
 *   nvtx <tid> start <domain> <id> <message> <payload> <category> <color>
 *   nvtx <tid> end <domain> <id>
 *   nvtx <tid> mark <domain> <message> <payload> <category> <color>
 * <domain> is the domain's name ("-" for the default domain); a payload or category that was
 * not given is "-"; messages are decoded from ASCII or registered strings.
 * The injection ABI is declared here from NVTX's public headers (nvToolsExt.h, nvtxTypes.h).
 */
#include "doubles_log.h"

#include <pthread.h>
#include <stdint.h>
#include <wchar.h>

typedef void (*NvtxFunctionPointer)(void);
typedef NvtxFunctionPointer **NvtxFunctionTable;
typedef struct {
  size_t struct_size;
  int (*GetModuleFunctionTable)(int module, NvtxFunctionTable *out_table, unsigned int *out_size);
} NvtxExportTableCallbacks;
typedef const void *(*NvtxGetExportTableFunc_t)(uint32_t export_table_id);

enum { NVTX_ETID_CALLBACKS = 1 };
enum { MODULE_CORE = 1, MODULE_CORE2 = 5 };
enum {
  CORE_MarkEx = 1, CORE_MarkA = 2, CORE_RangeStartEx = 4, CORE_RangeStartA = 5,
  CORE_RangeEnd = 7, CORE_RangePushEx = 8, CORE_RangePushA = 9, CORE_RangePop = 11,
  CORE_NameCategoryA = 12,
};
enum {
  CORE2_DomainMarkEx = 1, CORE2_DomainRangeStartEx = 2, CORE2_DomainRangeEnd = 3,
  CORE2_DomainRangePushEx = 4, CORE2_DomainRangePop = 5, CORE2_DomainNameCategoryA = 8,
  CORE2_DomainRegisterStringA = 10, CORE2_DomainCreateA = 12, CORE2_DomainDestroy = 14,
};
enum { MESSAGE_ASCII = 1, MESSAGE_UNICODE = 2, MESSAGE_REGISTERED = 3 };
enum { PAYLOAD_U64 = 1, PAYLOAD_I64 = 2, PAYLOAD_DOUBLE = 3, PAYLOAD_U32 = 4, PAYLOAD_I32 = 5 };

typedef struct {
  uint16_t version;
  uint16_t size;
  uint32_t category;
  int32_t colorType;
  uint32_t color;
  int32_t payloadType;
  int32_t reserved0;
  union { uint64_t ullValue; int64_t llValue; double dValue; uint32_t uiValue; int32_t iValue; float fValue; } payload;
  int32_t messageType;
  union { const char *ascii; const wchar_t *unicode; const void *registered; } message;
} EventAttributes;

/* Handles we give out: a domain or a registered string is a heap copy of its text. */
typedef struct { char text[256]; } Handle;

static Handle *new_handle(const char *text) {
  Handle *h = calloc(1, sizeof *h);
  if (h) snprintf(h->text, sizeof h->text, "%s", text ? text : "");
  return h;
}

static const char *domain_name(const void *domain) {
  return domain ? ((const Handle *)domain)->text : "-";
}

/* Formats "<message>\t<payload>\t<category>\t<color>" for an event. */
static void describe(const EventAttributes *a, char *out, size_t n) {
  char msg[2048] = "";
  char payload[64] = "-";
  if (a) {
    switch (a->messageType) {
      case MESSAGE_ASCII: snprintf(msg, sizeof msg, "%s", a->message.ascii ? a->message.ascii : ""); break;
      case MESSAGE_REGISTERED: snprintf(msg, sizeof msg, "%s", a->message.registered ? ((const Handle *)a->message.registered)->text : ""); break;
      case MESSAGE_UNICODE: snprintf(msg, sizeof msg, "%ls", a->message.unicode ? a->message.unicode : L""); break;
      default: break;
    }
    switch (a->payloadType) {
      case PAYLOAD_U64: snprintf(payload, sizeof payload, "%llu", (unsigned long long)a->payload.ullValue); break;
      case PAYLOAD_I64: snprintf(payload, sizeof payload, "%lld", (long long)a->payload.llValue); break;
      case PAYLOAD_U32: snprintf(payload, sizeof payload, "%u", a->payload.uiValue); break;
      case PAYLOAD_I32: snprintf(payload, sizeof payload, "%d", a->payload.iValue); break;
      case PAYLOAD_DOUBLE: snprintf(payload, sizeof payload, "%g", a->payload.dValue); break;
      default: break;
    }
    char category[16] = "-";
    if (a->category) snprintf(category, sizeof category, "%u", a->category);
    snprintf(out, n, "%s\t%s\t%s\t%08x", msg, payload, category, a->colorType ? a->color : 0u);
  } else {
    snprintf(out, n, "\t-\t-\t00000000");
  }
}

static uint64_t next_range_id(void) {
  static uint64_t id = 0;
  return __atomic_add_fetch(&id, 1, __ATOMIC_RELAXED);
}

static void d_mark(const void *dom, const EventAttributes *a) {
  char d[2200];
  describe(a, d, sizeof d);
  doubles_log("nvtx", "mark\t%s\t%s", domain_name(dom), d);
}
static uint64_t d_start(const void *dom, const EventAttributes *a) {
  char d[2200];
  uint64_t id = next_range_id();
  describe(a, d, sizeof d);
  doubles_log("nvtx", "start\t%s\t%llu\t%s", domain_name(dom), (unsigned long long)id, d);
  return id;
}
static void d_end(const void *dom, uint64_t id) {
  doubles_log("nvtx", "end\t%s\t%llu", domain_name(dom), (unsigned long long)id);
}
static int d_push(const void *dom, const EventAttributes *a) {
  char d[2200];
  describe(a, d, sizeof d);
  doubles_log("nvtx", "push\t%s\t%s", domain_name(dom), d);
  return 0;
}
static int d_pop(const void *dom) {
  doubles_log("nvtx", "pop\t%s", domain_name(dom));
  return 0;
}
static void d_name_category(const void *dom, uint32_t id, const char *name) {
  doubles_log("nvtx", "name_category\t%s\t%u\t%s", domain_name(dom), id, name ? name : "");
}
static const void *d_register_string(const void *dom, const char *s) {
  doubles_log("nvtx", "register_string\t%s\t%s", domain_name(dom), s ? s : "");
  return new_handle(s);
}
static const void *d_create(const char *name) {
  doubles_log("nvtx", "domain_create\t%s", name ? name : "");
  return new_handle(name);
}
static void d_destroy(const void *dom) {
  doubles_log("nvtx", "domain_destroy\t%s", domain_name(dom));
  free((void *)dom);
}

/* The core (default-domain) functions. */
static void c_mark_ex(const EventAttributes *a) { d_mark(0, a); }
static void c_mark_a(const char *m) { doubles_log("nvtx", "mark\t-\t%s\t-\t-\t00000000", m ? m : ""); }
static uint64_t c_start_ex(const EventAttributes *a) { return d_start(0, a); }
static uint64_t c_start_a(const char *m) {
  uint64_t id = next_range_id();
  doubles_log("nvtx", "start\t-\t%llu\t%s\t-\t-\t00000000", (unsigned long long)id, m ? m : "");
  return id;
}
static void c_end(uint64_t id) { d_end(0, id); }
static int c_push_ex(const EventAttributes *a) { return d_push(0, a); }
static int c_push_a(const char *m) { doubles_log("nvtx", "push\t-\t%s\t-\t-\t00000000", m ? m : ""); return 0; }
static int c_pop(void) { return d_pop(0); }
static void c_name_category(uint32_t id, const char *name) { d_name_category(0, id, name); }

static int install(const NvtxExportTableCallbacks *cb, int module, const int *ids,
                   NvtxFunctionPointer const *fns, int count) {
  NvtxFunctionTable table = 0;
  unsigned int size = 0;
  if (!cb->GetModuleFunctionTable(module, &table, &size) || !table) return 0;
  for (int i = 0; i < count; i++) {
    if ((unsigned)ids[i] >= size || !table[ids[i]]) return 0;
    *table[ids[i]] = fns[i];
  }
  return 1;
}

#define FN(f) ((NvtxFunctionPointer)(void (*)(void))(f))

int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get_export_table) {
  const NvtxExportTableCallbacks *cb = get_export_table(NVTX_ETID_CALLBACKS);
  if (!cb || cb->struct_size < sizeof *cb) return 0;
  static const int core_ids[] = {CORE_MarkEx, CORE_MarkA, CORE_RangeStartEx, CORE_RangeStartA,
                                 CORE_RangeEnd, CORE_RangePushEx, CORE_RangePushA,
                                 CORE_RangePop, CORE_NameCategoryA};
  NvtxFunctionPointer core_fns[] = {FN(c_mark_ex), FN(c_mark_a), FN(c_start_ex), FN(c_start_a),
                                    FN(c_end), FN(c_push_ex), FN(c_push_a), FN(c_pop),
                                    FN(c_name_category)};
  static const int core2_ids[] = {CORE2_DomainMarkEx, CORE2_DomainRangeStartEx,
                                  CORE2_DomainRangeEnd, CORE2_DomainRangePushEx,
                                  CORE2_DomainRangePop, CORE2_DomainNameCategoryA,
                                  CORE2_DomainRegisterStringA, CORE2_DomainCreateA,
                                  CORE2_DomainDestroy};
  NvtxFunctionPointer core2_fns[] = {FN(d_mark), FN(d_start), FN(d_end), FN(d_push), FN(d_pop),
                                     FN(d_name_category), FN(d_register_string), FN(d_create),
                                     FN(d_destroy)};
  if (!install(cb, MODULE_CORE, core_ids, core_fns, 9)) return 0;
  if (!install(cb, MODULE_CORE2, core2_ids, core2_fns, 9)) return 0;
  doubles_log("nvtx", "injected");
  return 1;
}
