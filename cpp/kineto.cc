#include "stepscope/cpp/kineto.h"

#include <ATen/record_function.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/csrc/profiler/kineto_shim.h>
#include <torch/csrc/profiler/orchestration/observer.h>
#include <torch/cuda.h>

#include <set>
#include <stdexcept>
#include <string>
#include <utility>

#include "stepscope/src/backend/torch.rs.h"

namespace stepscope::kineto {

namespace tap = torch::autograd::profiler;
namespace tpi = torch::profiler::impl;

namespace {

tpi::ProfilerConfig config_of(const Options& o) {
  return tpi::ProfilerConfig(tpi::ProfilerState::KINETO, o.record_shapes, o.profile_memory,
                             o.with_stack, o.with_flops, /*with_modules=*/false);
}

std::set<tpi::ActivityType> activities_of(const Options& o) {
  std::set<tpi::ActivityType> acts;
  if (o.cpu) acts.insert(tpi::ActivityType::CPU);
  if (o.cuda) acts.insert(tpi::ActivityType::CUDA);
  if (o.xpu) acts.insert(tpi::ActivityType::XPU);
  if (o.privateuse1) acts.insert(tpi::ActivityType::PrivateUse1);
  return acts;
}

std::string to_string(rust::Str s) { return std::string(s.data(), s.size()); }

}  // namespace

TraceResult::TraceResult(std::unique_ptr<tap::ProfilerResult> inner) : inner_(std::move(inner)) {}
TraceResult::~TraceResult() = default;

Range::Range() = default;
Range::~Range() { end(); }

void Range::begin(rust::Str name) {
  end();
  current_ = std::make_unique<at::RecordFunction>(at::RecordScope::USER_SCOPE);
  if (current_->isActive()) {
    current_->before(std::string_view(name.data(), name.size()));
  }
}

void Range::end() {
  if (current_) {
    current_->end();
    current_.reset();
  }
}

bool cuda_available() { return torch::cuda::is_available(); }

void prepare(const Options& options) {
  if (tpi::ProfilerStateBase::get() != nullptr) {
    throw std::runtime_error(
        "a torch profiler is already running on this thread (another stepscope profiler or "
        "torch.profiler); stop it first");
  }
  tap::prepareProfiler(config_of(options), activities_of(options));
}

std::size_t enable(const Options& options) {
  if (tpi::ProfilerStateBase::get() != nullptr) {
    throw std::runtime_error(
        "a torch profiler is already running on this thread (another stepscope profiler or "
        "torch.profiler); stop it first");
  }
  tap::enableProfiler(config_of(options), activities_of(options));
  return reinterpret_cast<std::size_t>(tpi::ProfilerStateBase::get(/*global=*/false));
}

Detached::Detached(std::shared_ptr<tpi::ProfilerStateBase> state) : state_(std::move(state)) {}

Detached::~Detached() {
  // A session detached and never finalized: finalize it here so Kineto is free again.
  if (state_) {
    try {
      tpi::ProfilerStateBase::push(std::move(state_));
      (void)tap::disableProfiler();
    } catch (...) {
    }
  }
}

void toggle(bool enable, const Options& options) {
  // Kineto toggles CPU ops and CUDA activity; other activities are not supported by it.
  std::set<tpi::ActivityType> acts;
  if (options.cpu) acts.insert(tpi::ActivityType::CPU);
  if (options.cuda) acts.insert(tpi::ActivityType::CUDA);
  if (!acts.empty()) tap::toggleCollectionDynamic(enable, acts);
}

std::unique_ptr<Detached> detach(std::size_t session) {
  auto* current = tpi::ProfilerStateBase::get(/*global=*/false);
  if (current == nullptr) {
    throw std::runtime_error("no torch profiler is enabled on this thread");
  }
  if (reinterpret_cast<std::size_t>(current) != session) {
    throw std::runtime_error(
        "another torch profiler was enabled on this thread after stepscope's; stop it first");
  }
  auto state = tpi::ProfilerStateBase::pop(/*global=*/false);
  state->removeCallback();
  return std::make_unique<Detached>(std::move(state));
}

std::unique_ptr<TraceResult> finalize(Detached& session) {
  auto state = session.take();
  if (!state) {
    throw std::runtime_error("this profiling session was already finalized");
  }
  tpi::ProfilerStateBase::push(std::move(state));
  return std::make_unique<TraceResult>(tap::disableProfiler());
}

void add_metadata(rust::Str key, rust::Str json_value) {
  tap::addMetadataJson(to_string(key), to_string(json_value));
}


void save(TraceResult& result, rust::Str path) { result.inner().save(to_string(path)); }

std::size_t event_count(const TraceResult& result) { return result.inner().events().size(); }

EventRow event_at(const TraceResult& result, std::size_t index) {
  const auto& e = result.inner().events().at(index);
  EventRow row;
  row.name = rust::String::lossy(e.name());
  row.thread = e.startThreadId();
  row.start_ns = e.startNs();
  row.duration_ns = e.durationNs();
  row.device = e.deviceType() != c10::DeviceType::CPU;
  row.is_async = e.isAsync();
  return row;
}

std::unique_ptr<Range> new_range() { return std::make_unique<Range>(); }
void range_begin(Range& range, rust::Str name) { range.begin(name); }
void range_end(Range& range) { range.end(); }

}  // namespace stepscope::kineto
