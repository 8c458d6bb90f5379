// stepscope C++17 wrapper: header-only RAII over the C ABI (stepscope.h).
//
//   stepscope::Profiler profiler(R"({"profiler": "cuda", "delay_iterations": 10, "max_iterations": 3})", "rank0");
//   profiler.start();                      // from any thread; throws stepscope::Error on failure
//   for (;;) {                             // the engine loop
//     stepscope::IterationGuard it = profiler.step({prefill_reqs, prefill_tokens, decode_reqs, decode_tokens});
//     run_model();                         // annotated while captured; the range closes with `it`
//   }
//
// Construction, start, stop, shutdown and flush throw stepscope::Error (with the C error code and
// message). step() never throws: a profiler must not break the engine loop; a backend failure in
// a step is available from IterationGuard::status() and stepscope::last_error().
#ifndef STEPSCOPE_HPP
#define STEPSCOPE_HPP

#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include <vector>

#include "stepscope.h"

namespace stepscope {

// A failed stepscope call: code() is one of the STEPSCOPE_ERR_* values.
class Error : public std::runtime_error {
 public:
  Error(int code, const std::string &message) : std::runtime_error(message), code_(code) {}
  int code() const noexcept { return code_; }

 private:
  int code_;
};

// This thread's last error message ("" if none).
inline std::string last_error() { return stepscope_last_error(); }

// The library's version.
inline std::string version() { return stepscope_version(); }

namespace detail {
inline void check(int code) {
  if (code != STEPSCOPE_OK) throw Error(code, stepscope_last_error());
}
}  // namespace detail

// One engine iteration, from Profiler::step() to destruction: closes the iteration's range.
// Movable, not copyable; keep it on the engine thread.
class IterationGuard {
 public:
  IterationGuard(IterationGuard &&other) noexcept
      : profiler_(std::exchange(other.profiler_, nullptr)), status_(other.status_) {}
  IterationGuard &operator=(IterationGuard &&other) noexcept {
    if (this != &other) {
      end();
      profiler_ = std::exchange(other.profiler_, nullptr);
      status_ = other.status_;
    }
    return *this;
  }
  IterationGuard(const IterationGuard &) = delete;
  IterationGuard &operator=(const IterationGuard &) = delete;
  ~IterationGuard() { end(); }

  // STEPSCOPE_OK, or the code stepscope_step returned (e.g. STEPSCOPE_ERR_BACKEND).
  int status() const noexcept { return status_; }

  // Closes the range now (idempotent).
  void end() noexcept {
    if (profiler_) stepscope_step_end(std::exchange(profiler_, nullptr));
  }

 private:
  friend class Profiler;
  IterationGuard(stepscope_profiler *p, int status) noexcept : profiler_(p), status_(status) {}
  stepscope_profiler *profiler_;
  int status_;
};

// The former name of IterationGuard (in C and Python, an "iteration" is the counts).
using Iteration = IterationGuard;

// The profiler of one worker. Move-only; destruction stops a running capture and waits for
// trace writing.
class Profiler {
 public:
  // config: vLLM's --profiler-config JSON text, or a path to a JSON file.
  Profiler(const std::string &config, const std::string &worker_name) {
    detail::check(stepscope_profiler_new(config.c_str(), worker_name.c_str(), &p_));
  }
  Profiler(Profiler &&other) noexcept : p_(std::exchange(other.p_, nullptr)) {}
  Profiler &operator=(Profiler &&other) noexcept {
    if (this != &other) {
      stepscope_profiler_free(p_);
      p_ = std::exchange(other.p_, nullptr);
    }
    return *this;
  }
  Profiler(const Profiler &) = delete;
  Profiler &operator=(const Profiler &) = delete;
  ~Profiler() { stepscope_profiler_free(p_); }

  // Starts a session; unset overrides keep the config's values, negative ones throw (the rule
  // of STEPSCOPE_KEEP in stepscope.h). Checked here because -1 is C's spelling of "unset".
  void start(std::optional<std::int64_t> delay_iterations = std::nullopt,
             std::optional<std::int64_t> max_iterations = std::nullopt) {
    if (delay_iterations && *delay_iterations < 0)
      throw Error(STEPSCOPE_ERR_INVALID_ARGUMENT, "`delay_iterations` must be greater than or equal to 0");
    if (max_iterations && *max_iterations < 0)
      throw Error(STEPSCOPE_ERR_INVALID_ARGUMENT, "`max_iterations` must be greater than or equal to 0");
    detail::check(stepscope_start(p_, delay_iterations.value_or(STEPSCOPE_KEEP),
                                  max_iterations.value_or(STEPSCOPE_KEEP)));
  }
  // The window begins in the step with this index (the same on every rank: aligned capture).
  void start_at(std::int64_t start_at_step,
                std::optional<std::int64_t> max_iterations = std::nullopt) {
    detail::check(stepscope_start_at(p_, start_at_step, max_iterations.value_or(STEPSCOPE_KEEP)));
  }
  // The worker's global rank, for the config's "stepscope": {"ranks": [...]}.
  void set_rank(std::uint32_t rank) { detail::check(stepscope_set_rank(p_, rank)); }
  // The served model's shape as JSON (stepscope's model fields), for the traces written from
  // now on; a bad field throws stepscope::Error naming it.
  void set_model_json(const std::string &json) {
    detail::check(stepscope_set_model_json(p_, json.c_str()));
  }
  // The profiler's state as JSON (phase, step index, window, pending writes, ...).
  std::string status_json() const {
    std::size_t needed = 0;
    std::string out(512, '\0');
    int code = stepscope_status_json(p_, out.data(), out.size(), &needed);
    if (code != STEPSCOPE_OK && needed > out.size()) {
      out.resize(needed);
      code = stepscope_status_json(p_, out.data(), out.size(), &needed);
    }
    detail::check(code);
    out.resize(needed - 1);
    return out;
  }
  // The step timeline's ended steps above index since, as JSON ({"fields", "steps"}; see
  // stepscope_timeline_json); "steps" is null when the timeline is off.
  std::string timeline_json(std::uint64_t since = 0) const {
    std::size_t needed = 0;
    std::string out(4096, '\0');
    int code = stepscope_timeline_json(p_, since, out.data(), out.size(), &needed);
    // The engine may add steps between two calls: grow with room to spare until it fits.
    while (code != STEPSCOPE_OK && needed > out.size()) {
      out.resize(needed + needed / 4);
      code = stepscope_timeline_json(p_, since, out.data(), out.size(), &needed);
    }
    detail::check(code);
    out.resize(needed - 1);
    return out;
  }
  void stop() { detail::check(stepscope_stop(p_)); }
  void shutdown() { detail::check(stepscope_shutdown(p_)); }

  // One engine iteration begins; its range closes when the returned IterationGuard does.
  [[nodiscard]] IterationGuard step(const stepscope_iteration &counts) noexcept {
    return IterationGuard(p_, stepscope_step(p_, &counts));
  }
  // The same with unknown counts.
  [[nodiscard]] IterationGuard step() noexcept { return IterationGuard(p_, stepscope_step(p_, nullptr)); }
  // One iteration with its work per phase (vLLM's detailed sums): recorded in the trace's
  // header for `stepscope analyze`'s floor of the step.
  [[nodiscard]] IterationGuard step(const stepscope_iteration &counts,
                                    const stepscope_iteration_work &work) noexcept {
    return IterationGuard(p_, stepscope_step_with_work(p_, &counts, &work));
  }
  // The same for an iteration serving these requests (read only when it is captured, with
  // "stepscope": {"request_ids": true}). Collect ids only while wants_request_ids().
  [[nodiscard]] IterationGuard step(const stepscope_iteration &counts, const char *const *ids,
                                    std::size_t n_ids) noexcept {
    return IterationGuard(p_, stepscope_step_with_requests(p_, &counts, ids, n_ids));
  }
  [[nodiscard]] IterationGuard step(const stepscope_iteration &counts,
                                    const std::vector<std::string> &ids) noexcept {
    try {
      std::vector<const char *> ptrs;
      ptrs.reserve(ids.size());
      for (const auto &id : ids) ptrs.push_back(id.c_str());
      return step(counts, ptrs.data(), ptrs.size());
    } catch (...) {
      return step(counts);  // out of memory for the pointers: the step still counts
    }
  }
  bool wants_request_ids() const noexcept { return stepscope_wants_request_ids(p_) == 1; }

  bool is_active() const noexcept { return stepscope_is_active(p_) == 1; }
  bool is_running() const noexcept { return stepscope_is_running(p_) == 1; }

  // Waits for trace writing: true when done, false on timeout.
  bool flush(std::chrono::milliseconds timeout) {
    int code = stepscope_flush(p_, static_cast<std::uint32_t>(timeout.count()));
    if (code == STEPSCOPE_ERR_TIMEOUT) return false;
    detail::check(code);
    return true;
  }

  // The C handle, for calls this wrapper does not cover.
  stepscope_profiler *handle() const noexcept { return p_; }

 private:
  stepscope_profiler *p_ = nullptr;
};

}  // namespace stepscope

#endif  // STEPSCOPE_HPP
