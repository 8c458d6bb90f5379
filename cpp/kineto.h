// The C++ half of stepscope's torch backend: a thin layer over libtorch's Kineto profiler API
// (torch/csrc/autograd/profiler_kineto.h). Every function that can throw is declared
// `Result<...>` in the bridge (src/backend/torch.rs), so cxx turns C++ exceptions, c10::Error
// included, into Rust errors; nothing unwinds into Rust.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "rust/cxx.h"

namespace torch::autograd::profiler {
struct ProfilerResult;
}
namespace torch::profiler::impl {
struct ProfilerStateBase;
}
namespace at {
class RecordFunction;
}

namespace stepscope::kineto {

struct Options;
struct EventRow;

// The result of one profiling session: Kineto's events and trace, owned until saved.
class TraceResult {
 public:
  explicit TraceResult(std::unique_ptr<torch::autograd::profiler::ProfilerResult> inner);
  ~TraceResult();
  torch::autograd::profiler::ProfilerResult& inner() { return *inner_; }
  const torch::autograd::profiler::ProfilerResult& inner() const { return *inner_; }

 private:
  std::unique_ptr<torch::autograd::profiler::ProfilerResult> inner_;
};

// A profiling session taken off the engine thread: no longer recording, not yet finalized.
class Detached {
 public:
  explicit Detached(std::shared_ptr<torch::profiler::impl::ProfilerStateBase> state);
  ~Detached();
  std::shared_ptr<torch::profiler::impl::ProfilerStateBase> take() { return std::move(state_); }

 private:
  std::shared_ptr<torch::profiler::impl::ProfilerStateBase> state_;
};

// A reusable USER_SCOPE RecordFunction range: one iteration's annotation at a time.
class Range {
 public:
  Range();
  ~Range();
  void begin(rust::Str name);
  void end();

 private:
  std::unique_ptr<at::RecordFunction> current_;
};

bool cuda_available();
// prepare() refuses to start while any torch profiler runs on this thread: Kineto sessions
// would nest, and disabling would take the wrong one off the stack.
void prepare(const Options& options);
// Returns an identity of the enabled session, which detach() checks.
std::size_t enable(const Options& options);
// disableProfiler() in two halves. detach() runs on the thread that enabled the profiler and
// is cheap: it takes the profiler's state off that thread and removes its RecordFunction
// callback, so the thread records nothing more. finalize() may run on any thread: it gives
// the state to that thread and calls disableProfiler() there, which does the expensive part
// (Kineto's stopTrace, materializing events).
std::unique_ptr<Detached> detach(std::size_t session);
// Pauses (enable = false) or resumes collection of the session's CPU and CUDA activity,
// keeping the session (torch's toggle_collection_dynamic).
void toggle(bool enable, const Options& options);
std::unique_ptr<TraceResult> finalize(Detached& session);
void add_metadata(rust::Str key, rust::Str json_value);

void save(TraceResult& result, rust::Str path);
std::size_t event_count(const TraceResult& result);
EventRow event_at(const TraceResult& result, std::size_t index);

std::unique_ptr<Range> new_range();
void range_begin(Range& range, rust::Str name);
void range_end(Range& range);

}  // namespace stepscope::kineto
