// The Kineto glue (see stepscope_kineto.h): libtorch's profiler API behind C functions that
// catch every exception, so that the Rust library can call it linked in or loaded at run time.
#include "stepscope_kineto.h"

#include <ATen/core/List.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/csrc/profiler/kineto_shim.h>
#include <torch/csrc/profiler/orchestration/observer.h>
#include <torch/cuda.h>

#include <cstring>
#include <exception>
#include <memory>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "kineto_writer.h"  // also torch's version header (TORCH_VERSION_*)

// glibc 2.32 added __libc_single_threaded, which libstdc++'s headers (GCC 11 on) read to skip
// atomic reference counts while a process has one thread; a glue built on a newer glibc would
// then need 2.32, above torch's own floor (manylinux_2_28, glibc 2.28). This hidden definition
// of our own says "not single-threaded" always: every count this file changes is atomic (right
// in every process, a few cycles dearer in a single-threaded one), and the glue needs nothing
// newer than glibc 2.28.
#if __has_include(<sys/single_threaded.h>)
extern "C" {
__attribute__((visibility("hidden"))) char __libc_single_threaded = 0;
}
#endif

// The same for libstdc++: GCC 11's allocator throws through std::__throw_bad_array_new_length,
// which only libstdc++ 3.4.29 (GCC 11) exports, above torch's floor (manylinux_2_28 allows
// 3.4.24). A definition of our own, doing what libstdc++'s does (libstdc++'s declaration makes
// it visible; the glue is loaded RTLD_LOCAL, so nothing else binds to it).
#if defined(__GLIBCXX__) && defined(_GLIBCXX_RELEASE) && _GLIBCXX_RELEASE >= 11
namespace std {
void __throw_bad_array_new_length() { throw bad_array_new_length(); }
}  // namespace std

// And for string streams (c10's messages build them): libstdc++ declares its own instantiation
// extern, so a call the compiler does not inline binds to the library's, and C++20's
// `basic_stringbuf::str() const&` (GLIBCXX_3.4.29) and `basic_ostringstream()` (3.4.26) are
// above the floor. Instantiated here, those calls need nothing newer (which calls get inlined
// changes with the file's size: it did when kineto_writer.h came in).
template class std::basic_stringbuf<char>;
template class std::basic_ostringstream<char>;
#endif

namespace tap = torch::autograd::profiler;
namespace tpi = torch::profiler::impl;

struct stepscope_kineto_detached {
  std::shared_ptr<tpi::ProfilerStateBase> state;
};

struct stepscope_kineto_result {
  std::unique_ptr<tap::ProfilerResult> inner;
  // The op table's rows, kept by a save that was asked to (written by the save until it calls
  // rows_ready, only read after).
  stepscope_writer::TableRows rows;
};

struct stepscope_kineto_range {
  std::unique_ptr<at::RecordFunction> current;

  void end() {
    if (current) {
      current->end();
      current.reset();
    }
  }
  ~stepscope_kineto_range() { end(); }
};

namespace {

#define STEPSCOPE_STR2(x) #x
#define STEPSCOPE_STR(x) STEPSCOPE_STR2(x)
constexpr const char* kTorchVersion = STEPSCOPE_STR(TORCH_VERSION_MAJOR) "." STEPSCOPE_STR(
    TORCH_VERSION_MINOR) "." STEPSCOPE_STR(TORCH_VERSION_PATCH);

// torch 2.13 added ExperimentalConfig::trace_only.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 13)
#define STEPSCOPE_HAS_TRACE_ONLY 1
#else
#define STEPSCOPE_HAS_TRACE_ONLY 0
#endif

tpi::ProfilerConfig config_of(const stepscope_kineto_options& o) {
  tpi::ExperimentalConfig experimental;
#if STEPSCOPE_HAS_TRACE_ONLY
  experimental.trace_only = o.trace_only != 0;
#endif
  return tpi::ProfilerConfig(tpi::ProfilerState::KINETO, o.record_shapes != 0,
                             o.profile_memory != 0, o.with_stack != 0, o.with_flops != 0,
                             o.with_modules != 0, experimental);
}

std::set<tpi::ActivityType> activities_of(const stepscope_kineto_options& o) {
  std::set<tpi::ActivityType> acts;
  if (o.cpu) acts.insert(tpi::ActivityType::CPU);
  if (o.cuda) acts.insert(tpi::ActivityType::CUDA);
  if (o.xpu) acts.insert(tpi::ActivityType::XPU);
  if (o.privateuse1) acts.insert(tpi::ActivityType::PrivateUse1);
  return acts;
}

// The profiler state of this thread, and whether any profiler (global or this thread's) runs.
// torch 2.14 replaced ProfilerStateBase::get(global) with getGlobal() and getTLS().
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 14)
tpi::ProfilerStateBase* thread_state() { return tpi::ProfilerStateBase::getTLS(); }
bool any_state() {
  return tpi::ProfilerStateBase::getGlobal() != nullptr || thread_state() != nullptr;
}
#else
tpi::ProfilerStateBase* thread_state() { return tpi::ProfilerStateBase::get(/*global=*/false); }
bool any_state() { return tpi::ProfilerStateBase::get() != nullptr; }
#endif

void set_error(char* err, size_t err_len, const char* message) {
  if (err == nullptr || err_len == 0) return;
  size_t n = std::strlen(message);
  if (n >= err_len) n = err_len - 1;
  std::memcpy(err, message, n);
  err[n] = '\0';
}

// Runs `body`; any exception becomes the error message (c10 errors carry a C++ backtrace after
// their first line: the caller keeps the first line).
template <typename F>
int guarded(char* err, size_t err_len, F&& body) {
  try {
    body();
    return 0;
  } catch (const std::exception& e) {
    set_error(err, err_len, e.what());
  } catch (...) {
    set_error(err, err_len, "unknown C++ exception");
  }
  return 1;
}

void refuse_if_running() {
  if (any_state()) {
    throw std::runtime_error(
        "a torch profiler is already running on this thread (another stepscope profiler or "
        "torch.profiler); stop it first");
  }
}

}  // namespace

extern "C" {

uint32_t stepscope_kineto_abi(void) { return STEPSCOPE_KINETO_ABI; }

const char* stepscope_kineto_torch_version(void) { return kTorchVersion; }

int stepscope_kineto_has_trace_only(void) { return STEPSCOPE_HAS_TRACE_ONLY; }

int stepscope_kineto_writes_python_parents(void) {
  return stepscope_writer::kWritesPythonParents && STEPSCOPE_HAS_TRACE_ONLY;
}

int stepscope_kineto_cuda_available(void) {
  try {
    return torch::cuda::is_available() ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

int stepscope_kineto_prepare(const stepscope_kineto_options* options, char* err,
                             size_t err_len) {
  return guarded(err, err_len, [&] {
    refuse_if_running();
    tap::prepareProfiler(config_of(*options), activities_of(*options));
  });
}

int stepscope_kineto_enable(const stepscope_kineto_options* options, size_t* session, char* err,
                            size_t err_len) {
  return guarded(err, err_len, [&] {
    refuse_if_running();
    tap::enableProfiler(config_of(*options), activities_of(*options));
    *session = reinterpret_cast<size_t>(thread_state());
  });
}

int stepscope_kineto_detach(size_t session, stepscope_kineto_detached** out, char* err,
                            size_t err_len) {
  return guarded(err, err_len, [&] {
    auto* current = thread_state();
    if (current == nullptr) {
      throw std::runtime_error("no torch profiler is enabled on this thread");
    }
    if (reinterpret_cast<size_t>(current) != session) {
      throw std::runtime_error(
          "another torch profiler was enabled on this thread after stepscope's; stop it first");
    }
    auto state = tpi::ProfilerStateBase::pop(/*global=*/false);
    state->removeCallback();
    *out = new stepscope_kineto_detached{std::move(state)};
  });
}

int stepscope_kineto_finalize(stepscope_kineto_detached* session, stepscope_kineto_result** out,
                              char* err, size_t err_len) {
  return guarded(err, err_len, [&] {
    if (session == nullptr || !session->state) {
      throw std::runtime_error("this profiling session was already finalized");
    }
    // Taken out first: push() takes an rvalue reference but need not move from it, and a
    // state left here would be finalized a second time when the handle is freed.
    std::shared_ptr<tpi::ProfilerStateBase> state = std::move(session->state);
    session->state.reset();
    tpi::ProfilerStateBase::push(std::move(state));
    *out = new stepscope_kineto_result{tap::disableProfiler(), {}};
  });
}

void stepscope_kineto_detached_free(stepscope_kineto_detached* session) {
  if (session == nullptr) return;
  // Detached and never finalized: finalize it here so Kineto is free again.
  if (session->state) {
    try {
      std::shared_ptr<tpi::ProfilerStateBase> state = std::move(session->state);
      session->state.reset();
      tpi::ProfilerStateBase::push(std::move(state));
      (void)tap::disableProfiler();
    } catch (...) {
    }
  }
  delete session;
}

int stepscope_kineto_toggle(int enable, const stepscope_kineto_options* options, char* err,
                            size_t err_len) {
  return guarded(err, err_len, [&] {
    // Kineto toggles CPU ops and CUDA activity; other activities are not supported by it.
    std::set<tpi::ActivityType> acts;
    if (options->cpu) acts.insert(tpi::ActivityType::CPU);
    if (options->cuda) acts.insert(tpi::ActivityType::CUDA);
    if (!acts.empty()) tap::toggleCollectionDynamic(enable != 0, acts);
  });
}

int stepscope_kineto_add_metadata(const char* key, size_t key_len, const char* json,
                                  size_t json_len, char* err, size_t err_len) {
  return guarded(err, err_len, [&] {
    tap::addMetadataJson(std::string(key, key_len), std::string(json, json_len));
  });
}

int stepscope_kineto_save(stepscope_kineto_result* result, const char* path, size_t path_len,
                          int serializer, const char* reference, size_t reference_len,
                          void (*rows_ready)(void* user), void* user, char* err, size_t err_len) {
  return guarded(err, err_len, [&] {
    if (result == nullptr || !result->inner) {
      throw std::runtime_error("the profiler returned no result");
    }
    std::string target(path, path_len);
    if (serializer == STEPSCOPE_KINETO_SERIALIZER_STEPSCOPE && stepscope_writer::registered()) {
      // Kineto calls the factory on this thread, within save().
      struct Reference {
        Reference(const char* p, size_t n) { stepscope_writer::next_reference.assign(p, n); }
        ~Reference() { stepscope_writer::next_reference.clear(); }
      } ref(reference == nullptr ? "" : reference, reference == nullptr ? 0 : reference_len);
      struct Rows {
        Rows(stepscope_writer::TableRows* rows, void (*ready)(void*), void* user) {
          if (ready != nullptr) stepscope_writer::next_rows = {rows, ready, user};
        }
        ~Rows() { stepscope_writer::next_rows = {}; }
      } rows(&result->rows, rows_ready, user);
      result->inner->save(std::string(stepscope_writer::kProtocol) + "://" + target);
    } else {
      result->inner->save(target);
    }
  });
}

size_t stepscope_kineto_event_count(const stepscope_kineto_result* result) {
  if (result == nullptr || !result->inner) return 0;
  try {
    return result->inner->events().size();
  } catch (...) {
    return 0;  // no list to read (torch's events() is a plain getter today; none throws)
  }
}

int stepscope_kineto_event_at(const stepscope_kineto_result* result, size_t index,
                              stepscope_kineto_event* out, char* name, size_t name_cap, char* err,
                              size_t err_len) {
  return guarded(err, err_len, [&] {
    if (result == nullptr || !result->inner) {
      throw std::runtime_error("the profiler returned no result");
    }
    const auto& e = result->inner->events().at(index);
    const std::string n = e.name();
    std::memcpy(name, n.data(), n.size() < name_cap ? n.size() : name_cap);
    out->name_len = n.size();
    out->thread = e.startThreadId();
    out->end_thread = e.endThreadId();
    out->start_ns = e.startNs();
    out->duration_ns = e.durationNs();
    out->correlation = e.correlationId();
    out->linked_correlation = e.linkedCorrelationId();
    out->device = e.deviceType() != c10::DeviceType::CPU;
    out->is_async = e.isAsync();
    out->hidden = e.isHiddenEvent();
    const auto type = static_cast<libkineto::ActivityType>(e.activityType());
    out->user_annotation = type == libkineto::ActivityType::USER_ANNOTATION ||
                           type == libkineto::ActivityType::GPU_USER_ANNOTATION;
    out->python_function = e.isPythonFunction();
    out->overhead = type == libkineto::ActivityType::OVERHEAD;
  });
}

const stepscope_kineto_row* stepscope_kineto_rows(const stepscope_kineto_result* result,
                                                 size_t* count) {
  *count = result == nullptr ? 0 : result->rows.rows.size();
  return result == nullptr ? nullptr : result->rows.rows.data();
}

size_t stepscope_kineto_row_name_count(const stepscope_kineto_result* result) {
  return result == nullptr ? 0 : result->rows.names.size();
}

const char* stepscope_kineto_row_name(const stepscope_kineto_result* result, size_t name,
                                      size_t* len) {
  if (result == nullptr || name >= result->rows.names.size()) {
    *len = 0;
    return nullptr;
  }
  const std::string& n = result->rows.names[name];
  *len = n.size();
  return n.data();
}

void stepscope_kineto_result_release_events(stepscope_kineto_result* result) {
  if (result == nullptr || !result->inner) return;
  try {
    // torch hands its event list and tree out only as const references to members of its
    // result, which is not const itself: emptied here, they free their KinetoEvents and Results
    // (most of what freeing a capture costs) while the trace is saved, not after it.
    auto& events = const_cast<std::vector<tap::KinetoEvent>&>(result->inner->events());
    std::vector<tap::KinetoEvent>().swap(events);
    auto& tree = const_cast<std::vector<tap::experimental_event_t>&>(result->inner->event_tree());
    std::vector<tap::experimental_event_t>().swap(tree);
  } catch (...) {
  }
}

void stepscope_kineto_result_free(stepscope_kineto_result* result) {
  try {
    delete result;
  } catch (...) {
  }
}

int stepscope_kineto_range_new(stepscope_kineto_range** out, char* err, size_t err_len) {
  return guarded(err, err_len, [&] { *out = new stepscope_kineto_range{}; });
}

int stepscope_kineto_range_begin(stepscope_kineto_range* range, const char* name,
                                 size_t name_len, uint64_t step, const char* const* ids,
                                 const size_t* id_lens, size_t n_ids, char* err, size_t err_len) {
  return guarded(err, err_len, [&] {
    range->end();
    range->current = std::make_unique<at::RecordFunction>(at::RecordScope::USER_SCOPE);
    // Kineto writes the handle as "Record function id": the annotation names its step.
    range->current->setHandle(step);
    if (!range->current->isActive()) {
      return;
    }
    if (n_ids == 0) {
      range->current->before(std::string_view(name, name_len));
      return;
    }
    c10::List<std::string> requests;
    requests.reserve(n_ids);
    for (size_t i = 0; i < n_ids; ++i) {
      requests.push_back(std::string(ids[i], id_lens[i]));
    }
    std::unordered_map<std::string, c10::IValue> kwargs;
    kwargs.emplace("requests", c10::IValue(std::move(requests)));
    range->current->before(std::string_view(name, name_len), &kwargs);
  });
}

int stepscope_kineto_range_end(stepscope_kineto_range* range, char* err, size_t err_len) {
  return guarded(err, err_len, [&] { range->end(); });
}

void stepscope_kineto_range_free(stepscope_kineto_range* range) {
  try {
    delete range;
  } catch (...) {
  }
}

}  // extern "C"
