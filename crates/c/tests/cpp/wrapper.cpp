// The header-only C++ wrapper: RAII iterations, exceptions, move semantics. tests/c_abi.rs
// compiles it with -std=c++17 and checks the NVTX ranges it produced.
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "stepscope.hpp"

static int checks = 0, failures = 0;
#define CHECK(cond)                                                                     \
  do {                                                                                  \
    checks++;                                                                           \
    if (!(cond)) {                                                                      \
      failures++;                                                                       \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);     \
    }                                                                                   \
  } while (0)

int main() {
  {
    stepscope::Profiler profiler(R"({"profiler": "cuda", "delay_iterations": 2, "max_iterations": 3})", "cpp");
    profiler.start();
    CHECK(profiler.is_active() && !profiler.is_running());
    for (std::uint32_t i = 1; i <= 6; i++) {
      stepscope::Iteration it = profiler.step({i % 3 == 1 ? 1u : 0u, 10 * i, i, i});
      CHECK(it.status() == STEPSCOPE_OK);
      CHECK(profiler.is_running() == (i >= 2 && i <= 4));
      // The range closes when `it` goes out of scope.
    }
    CHECK(!profiler.is_active());

    // Moving a profiler and an iteration keeps exactly one owner.
    stepscope::Profiler moved = std::move(profiler);
    moved.start(0, 1);
    CHECK(moved.is_running());
    {
      stepscope::Iteration a = moved.step();
      stepscope::Iteration b = std::move(a);
      b.end();
      b.end();  // idempotent
    }
    CHECK(moved.flush(std::chrono::milliseconds(100)));
    moved.stop();
  }

  try {
    stepscope::Profiler bad(R"({"max_iterations": -1})", "cpp");
    CHECK(false);
  } catch (const stepscope::Error &e) {
    CHECK(e.code() == STEPSCOPE_ERR_CONFIG);
    CHECK(std::strstr(e.what(), "max_iterations") != nullptr);
  }

  try {
    stepscope::Profiler p("{}", "cpp");
    p.start(-1);
    CHECK(false);
  } catch (const stepscope::Error &e) {
    CHECK(e.code() == STEPSCOPE_ERR_INVALID_ARGUMENT);
    CHECK(std::strstr(e.what(), "delay_iterations") != nullptr);
  }

  {
    // The timeline: more steps than timeline_json()'s first buffer holds (it grows to fit).
    stepscope::Profiler p(R"({"stepscope": {"timeline": {"steps": 256}}})", "cpp-timeline");
    for (int i = 0; i < 300; i++) { auto it = p.step(); }
    std::string json = p.timeline_json();
    CHECK(json.size() > 4096 && json.back() == '}');
    CHECK(json.find("[44,") == std::string::npos && json.find("[45,") != std::string::npos);
    CHECK(json.find("[300,") != std::string::npos);
    CHECK(p.timeline_json(299).find("[299,") == std::string::npos);
    stepscope::Profiler off("{}", "cpp-off");
    CHECK(off.timeline_json().find("\"steps\":null") != std::string::npos);
  }

  {
    // A worker name longer than the first buffer: status_json() asks again with the size.
    std::string name(700, 'w');
    stepscope::Profiler p(R"({"profiler": "cuda", "max_iterations": 1})", name);
    p.set_rank(0);
    p.start_at(2);
    std::string status = p.status_json();
    CHECK(status.find("\"phase\":\"delaying\"") != std::string::npos);
    CHECK(status.find(name) != std::string::npos && status.back() == '}');
    { auto it = p.step(); CHECK(!p.is_running()); }
    { auto it = p.step(); CHECK(p.is_running()); }
    try {
      p.stop();
      p.start_at(1);
      CHECK(false);
    } catch (const stepscope::Error &e) {
      CHECK(std::strstr(e.what(), "start_at_step") != nullptr);
    }
  }

  {
    // Request ids, read for the captured iteration only; collected only while wanted.
    stepscope::Profiler p(R"({"profiler": "cuda", "max_iterations": 1, "stepscope": {"request_ids": true}})", "cpp");
    CHECK(!p.wants_request_ids());
    p.start();
    CHECK(p.wants_request_ids());
    std::vector<std::string> ids = {"cpp-a", "cpp-b"};
    { auto it = p.step({0, 0, 2, 2}, ids); CHECK(it.status() == STEPSCOPE_OK && p.is_running()); }
    { auto it = p.step({0, 0, 2, 2}, ids); CHECK(!p.is_running()); }  // past max: stopped
    CHECK(!p.wants_request_ids());
  }

  {
    // The iteration's work and the model's shape.
    stepscope::Profiler p(R"({"profiler": "cuda", "max_iterations": 1, "detailed_trace_annotation": true})", "cpp");
    p.set_model_json(R"({"layers": 2})");
    try {
      p.set_model_json(R"({"layrs": 2})");
      CHECK(false);
    } catch (const stepscope::Error &e) {
      CHECK(std::strstr(e.what(), "layrs") != nullptr);
    }
    p.start();
    { auto it = p.step({1, 4, 2, 2}, stepscope_iteration_work{{4, 16, 16}, {17, 2, 17}}); CHECK(it.status() == STEPSCOPE_OK); }
  }

  CHECK(!stepscope::version().empty());
  std::printf("wrapper: %d checks, %d failed\n", checks, failures);
  return failures ? 1 : 0;
}
