// stepscope's serializer for a Kineto capture (included once, by kineto.cc).
//
// Kineto's own (ChromeTraceLogger) formats every event through fmt and an ofstream, and
// copies each name and args string on the way: about 80% of the writer thread's CPU in
// `perf` of a capture with Python stacks, which the stop waits for. This logger takes the
// events that make up nearly all of a trace (CPU ops, Python frames, CUDA runtime and driver
// calls, kernels, copies and sets, with their flows) and writes them itself into one buffer;
// every other call (the header and its metadata, processes and threads, spans, annotations,
// instant and counter events, collectives, anything whose name or args Kineto would rewrite)
// goes to Kineto's own logger, writing a side file. At the end the side file is spliced
// around the buffer: its header and first `"traceEvents": [`, then this logger's events, then
// the rest. So what is not plain stays exactly Kineto's, and what is plain is written as
// Kineto writes it (same fields and values; one event per line, without its indentation).
// One addition, under torch 2.13: a capture finalized with torch's trace_only has no event tree,
// and its Python frames no "Python parent id"; this logger gives each frame the parent that
// tree would have given (PythonParents), so the trace is the one a full finalize writes.
//
// Reached through Kineto's logger registry (torch 2.14's public `registerLoggerFactory`, the
// controller's exported `addLoggerFactory` before): a save to `stepscope://PATH` makes this
// logger, which makes Kineto's file logger through the same registry.
#pragma once

#ifndef KINETO_NAMESPACE
#define KINETO_NAMESPACE libkineto
#endif

// torch's version (TORCH_VERSION_MAJOR, _MINOR: Kineto's interface below depends on it), so
// that this header stands alone (kineto.cc, and a test program of its functions).
#if __has_include(<torch/headeronly/version.h>)
#include <torch/headeronly/version.h>
#else
#include <torch/version.h>
#endif

#include "stepscope_kineto.h"  // stepscope_kineto_row

#include <ActivityType.h>
#include <libkineto.h>
#include <GenericTraceActivity.h>
#include <ITraceActivity.h>
#include <output_base.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <unordered_map>
#include <vector>

namespace libkineto {
// Kineto's registry of loggers by URL protocol, as libtorch defines it (one map member);
// libtorch's headers only name the class.
class ActivityLoggerFactory {
 public:
  using FactoryFunc = std::function<std::unique_ptr<ActivityLogger>(const std::string& url)>;
  std::map<std::string, FactoryFunc> factories;
};

// torch 2.14's Kineto: finalizeTrace lost its metadata argument, and registerLoggerFactory is
// public (libkineto.h); before, the controller's static addLoggerFactory registered a protocol.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 14)
#define STEPSCOPE_KINETO_2_14 1
#else
#define STEPSCOPE_KINETO_2_14 0
#endif
#define STEPSCOPE_FINALIZE_METADATA (!STEPSCOPE_KINETO_2_14)

// What this file calls in libtorch that its headers do not declare, or that some libtorch does
// not export (torch 2.11's has no loggerFactory()): each declared weak, so that a glue whose
// libtorch lacks one still loads, and checked before use (see available()); without them a
// save goes through Kineto's own writer. The registry's map is its first member in every
// Kineto here (2.14 added a mutex after it).
class ActivityProfilerController {
 public:
#if !STEPSCOPE_KINETO_2_14
  __attribute__((weak)) static void addLoggerFactory(const std::string& protocol,
                                                     ActivityLoggerFactory::FactoryFunc factory);
#endif
  __attribute__((weak)) static ActivityLoggerFactory& loggerFactory();
};
#if STEPSCOPE_KINETO_2_14
__attribute__((weak)) void registerLoggerFactory(const std::string& protocol,
                                                 LoggerFactory factory);
#endif

// Kineto's file logger, as far as this file calls it: the end of a trace without the capture's
// buffers (the virtual finalizeTrace takes them by value, and their type is not in libtorch's
// headers, so this file can neither make nor free one). Called only on an object whose dynamic
// type is this class (checked by name, see is_chrome_logger).
class ChromeTraceLogger {
 public:
#if STEPSCOPE_FINALIZE_METADATA
  __attribute__((weak)) void finalizeTrace(
      int64_t endTime, std::unordered_map<std::string, std::vector<std::string>>& metadata);
#else
  __attribute__((weak)) void finalizeTrace(int64_t endTime);
#endif
};
}  // namespace libkineto

namespace stepscope_writer {

namespace kt = libkineto;

constexpr const char* kProtocol = "stepscope";

// A byte Kineto's writer keeps as it is in a name: printable ASCII but the two it rewrites
// or escapes ('\\' to '/', '"' escaped in newer Kineto); anything else (a newline, which it
// drops, and any byte std::isprint refuses, which turns the whole name into "unknown") sends
// the event to Kineto's own writer.
inline bool plain_name(std::string_view s) {
  for (unsigned char c : s) {
    if (c < 0x20 || c > 0x7e || c == '"' || c == '\\') return false;
  }
  return true;
}

// Args Kineto copies as they are: no '\\' (made '/') and no newline (dropped).
inline bool plain_args(std::string_view s) {
  // Two scans of memchr: find_first_of would call it once per byte of `s`.
  return std::memchr(s.data(), '\\', s.size()) == nullptr &&
         std::memchr(s.data(), '\n', s.size()) == nullptr;
}

inline bool blank(std::string_view s) {
  for (unsigned char c : s) {
    if (!std::isspace(c)) return false;
  }
  return true;
}

// torch 2.13's Kineto (and 2.11's) keeps an event's metadata as (value, quoted) pairs, whose
// text metadataJson() formats into a fresh string through a std::stringstream for every event:
// 25% of the writer thread's CPU in `perf` of a capture with Python stacks (torch 2.13).
using PairMap = std::unordered_map<std::string, std::pair<std::string, bool>>;

#if !STEPSCOPE_KINETO_2_14
// `map` when it is of that kind, else nullptr (its text is then metadataJson()'s).
template <typename Map>
const PairMap* as_pair_map(const Map& map) {
  if constexpr (std::is_same_v<Map, PairMap>) {
    return &map;
  } else {
    return nullptr;
  }
}

// GenericTraceActivity's map is private: named through an explicit instantiation, where the
// standard waives access checks, and formatted straight into the buffer, in the same order and
// text (pair_args_size, put_pair_args). This header is included by one translation unit of a
// program (kineto.cc, or a test program of these functions), as the instantiation requires.
struct MetadataMapTag {
  friend auto metadata_map(MetadataMapTag);
};
template <typename Tag, auto Member>
struct ExposeMember {
  friend auto metadata_map(Tag) { return Member; }
};
template struct ExposeMember<MetadataMapTag, &kt::GenericTraceActivity::metadataMap_>;

inline const PairMap* pair_metadata_of(const kt::GenericTraceActivity& activity) {
  return as_pair_map(activity.*metadata_map(MetadataMapTag{}));
}

// Adds an unquoted value to an activity's metadata (a Python frame's parent, where Kineto's own
// writer writes the frame), in the map of either torch's Kineto: without fmt, which the glue
// does not link.
inline void add_raw_metadata(kt::GenericTraceActivity& activity, const std::string& key,
                             std::string value) {
  if (const PairMap* map = pair_metadata_of(activity)) {
    const_cast<PairMap*>(map)->emplace(key, std::make_pair(std::move(value), false));
  }
}
#else
// torch 2.14's Kineto keeps typed values, formatted by its out-of-line metadataJson(), which
// the serializer calls: the map is not named here at all.
inline const PairMap* pair_metadata_of(const kt::GenericTraceActivity&) { return nullptr; }

inline void add_raw_metadata(kt::GenericTraceActivity& activity, const std::string& key,
                             std::string value) {
  activity.addTypedMetadata(key, kt::TypedValue{kt::RawJson{std::move(value)}});
}
#endif

// The types written here, when the event is plain. Kineto writes these through its generic
// complete-event path (ph X); the rest have paths of their own (instant and counter events,
// GPU annotations moved by a nanosecond, CUDA syncs on rows of their own, user annotations,
// whose args stepscope's pump rewrites line by line in Kineto's layout).
inline bool ours(kt::ActivityType t) {
  switch (t) {
    case kt::ActivityType::CPU_OP:
    case kt::ActivityType::PYTHON_FUNCTION:
    case kt::ActivityType::CUDA_RUNTIME:
    case kt::ActivityType::CUDA_DRIVER:
    case kt::ActivityType::CONCURRENT_KERNEL:
    case kt::ActivityType::GPU_MEMCPY:
    case kt::ActivityType::GPU_MEMSET:
      return true;
    default:
      return false;
  }
}

// Types whose own correlation id Kineto does not write as "External id" when they have no
// linked activity (all but CPU ops and Python frames among ours).
inline bool own_id_written(kt::ActivityType t) {
  return t == kt::ActivityType::CPU_OP || t == kt::ActivityType::PYTHON_FUNCTION;
}

// The Python frame each Python frame was called from (its "Python parent id"), for a capture
// whose finalize built no event tree (torch's trace_only, which leaves that key out and costs a
// third less: see docs/engines.md). torch's tree replays the events of each thread in start
// order: before an event begins, every event that ended strictly before that start is closed,
// and with it whatever is still open above it on its thread; an event of no duration is never
// open. A frame's Python parent is its nearest enclosing frame in that tree. Over the frames
// alone that is: the innermost frame of its thread still open once every frame that ended
// before its start is closed, each closing the frames above it. A frame enters in the order
// torch hands frames over, their start order (torch numbers them in it: "Python id");
// tests/python/test_python_parents.py holds these parents against torch's on the same capture.
// Real frames nest and seldom tie: a frame that begins the nanosecond another ends (its child,
// as torch closes only what ended before) and frames that cross are as torch's tree code reads,
// held by that test on frames made up for it.
class PythonParents {
 public:
  // The parent of frame `id` of `thread` over [start, end] (nanoseconds), or -1 for none.
  int64_t enter(int64_t thread, int64_t start, int64_t end, int64_t id) {
    std::vector<Open>& open = threads_[thread];
    // An entry's `until` is the earliest end at or below it, so closing every frame that ended
    // before `start`, and everything above each, pops exactly the entries whose `until` is.
    while (!open.empty() && open.back().until < start) open.pop_back();
    const int64_t parent = open.empty() ? -1 : open.back().id;
    if (end > start) {
      open.push_back(Open{id, open.empty() ? end : std::min(end, open.back().until)});
    }
    return parent;
  }

 private:
  struct Open {
    int64_t id;
    int64_t until;
  };
  std::unordered_map<int64_t, std::vector<Open>> threads_;
};

// "Python parent id"'s value as torch writes it: the parent's id, or null.
inline std::string parent_text(int64_t parent) {
  return parent < 0 ? std::string("null") : std::to_string(parent);
}

constexpr const char* kPythonParent = "Python parent id";
constexpr std::string_view kPythonId = "Python id";

// Whether the serializer writes the parents a capture lacks: before torch 2.14, whose Kineto
// writes a root frame's as null and whose trace_only leaves out nothing else of a frame. torch
// 2.14's leaves out a root's altogether, and its trace_only each frame's "CallFrom" too, which
// this file does not write: there every capture with Python stacks is finalized whole.
constexpr bool kWritesPythonParents = !STEPSCOPE_KINETO_2_14;

// The CPU events the op table reads (what torch's event list holds of a capture of the CPU:
// ops, user annotations, Python frames), kept from the activities a save writes, for a capture
// whose finalize built no event list (torch's trace_only). tests/python/test_op_table.py holds
// the table of a trace's events against torch's own of the same capture.
struct TableRows {
  using Row = stepscope_kineto_row;  // its name an index into names
  std::vector<Row> rows;
  // A deque: its elements never move, so the index below keys them in place.
  std::deque<std::string> names;

  static bool kept(kt::ActivityType t) {
    return t == kt::ActivityType::CPU_OP || t == kt::ActivityType::USER_ANNOTATION ||
           t == kt::ActivityType::PYTHON_FUNCTION;
  }

  void keep(const kt::ITraceActivity& op, std::string_view name) {
    const kt::ActivityType type = op.type();
    if (!kept(type)) return;
    const int64_t duration = op.duration();
    rows.push_back(Row{intern(name), type == kt::ActivityType::USER_ANNOTATION,
                       type == kt::ActivityType::PYTHON_FUNCTION, op.resourceId(), op.timestamp(),
                       duration < 0 ? 0 : duration, op.correlationId()});
  }

 private:
  uint32_t intern(std::string_view name) {
    auto it = ids_.find(name);
    if (it != ids_.end()) return it->second;
    const auto id = static_cast<uint32_t>(names.size());
    names.emplace_back(name);
    ids_.emplace(std::string_view(names.back()), id);
    return id;
  }
  std::unordered_map<std::string_view, uint32_t> ids_;
};

// Where the next save keeps its table's rows and whom it tells once they are complete: set by
// the save just before Kineto calls the factory, on the same thread (as next_reference).
struct RowsSink {
  TableRows* rows = nullptr;
  void (*ready)(void*) = nullptr;
  void* user = nullptr;
};

// One event of ours, formatted but for its time stamp: Kineto writes times relative to a
// base it reads once per process and writes into the header, known here only at the end.
struct Pending {
  const char* text;  // its text, in one of the store's blocks
  uint32_t head;     // text[0, head): up to `"ts": `
  uint32_t size;     // text[head, size): from `, "dur"` on
  int64_t ts;        // absolute, ns
};

// Writes through a cursor into room the owner made: one capacity check per event (the
// owner's ensure), then unchecked copies.
class Cursor {
 public:
  void put(const char* s, size_t n) {
    std::memcpy(buf_ + len_, s, n);
    len_ += n;
  }
  void put(std::string_view s) { put(s.data(), s.size()); }
  void put(char c) { buf_[len_++] = c; }
  // At most 20 bytes, written in place (no copy through a scratch buffer: a memcpy of a
  // length known only at run time is a call into libc, once per number).
  void put_int(int64_t v) {
    uint64_t u = static_cast<uint64_t>(v);
    if (v < 0) {
      put('-');
      u = 0 - u;
    }
    size_t digits = 1;
    for (uint64_t t = u; t >= 10; t /= 10) ++digits;
    char* p = buf_ + len_ + digits;
    len_ += digits;
    do {
      *--p = static_cast<char>('0' + u % 10);
      u /= 10;
    } while (u != 0);
  }
  // Kineto's "{us}.{ns:03}" for a non-negative nanosecond count: at most 24 bytes.
  void put_us(int64_t ns) {
    put_int(ns / 1000);
    const int64_t frac = ns % 1000;
    char* p = buf_ + len_;
    p[0] = '.';
    p[1] = static_cast<char>('0' + frac / 100);
    p[2] = static_cast<char>('0' + frac / 10 % 10);
    p[3] = static_cast<char>('0' + frac % 10);
    len_ += 4;
  }
  size_t size() const { return len_; }

 protected:
  char* buf_ = nullptr;
  size_t len_ = 0;
  size_t cap_ = 0;
};

// A growable contiguous byte buffer.
class Text : public Cursor {
 public:
  // Room for `n` more bytes.
  void ensure(size_t n) {
    if (cap_ - len_ < n) grow(n);
  }
  std::string_view view(size_t from, size_t to) const {
    return std::string_view(buf_ + from, to - from);
  }
  void clear() { len_ = 0; }

 private:
  void grow(size_t n) {
    size_t cap = cap_ * 2 > len_ + n ? cap_ * 2 : len_ + n;
    if (cap < (1 << 20)) cap = 1 << 20;
    std::unique_ptr<char[]> next(new char[cap]);
    if (len_ != 0) std::memcpy(next.get(), buf_, len_);
    owned_ = std::move(next);
    buf_ = owned_.get();
    cap_ = cap;
  }
  std::unique_ptr<char[]> owned_;
};

// The events' text, in blocks that are never moved: a contiguous buffer doubled as it grew
// copied what it held at each doubling, touched new pages and held the old and the new at
// once (in `perf` of a capture with Python stacks, 31 of the saver thread's 194 samples were
// page faults, nearly all under the save's 82). Each event is written whole into one block.
class Blocks : public Cursor {
 public:
  // Room for `n` more bytes in the current block.
  void ensure(size_t n) {
    if (cap_ - len_ < n) next(n);
  }
  const char* cursor() const { return buf_ + len_; }

 private:
  static constexpr size_t kBlock = 4 << 20;
  void next(size_t n) {
    const size_t cap = n > kBlock ? n : kBlock;
    // Not value-initialized: the pages are touched as they are written.
    blocks_.emplace_back(new char[cap]);
    buf_ = blocks_.back().get();
    len_ = 0;
    cap_ = cap;
  }
  std::vector<std::unique_ptr<char[]>> blocks_;
};

// The length of a pair map's text as Kineto's metadataJson() formats it (`"key": "value"` for a
// quoted value, `"key": value` for another, ", " between, in the map's order), or npos when
// that text would not be plain (plain_args).
inline size_t pair_args_size(const PairMap& map) {
  size_t n = 0;
  for (const auto& [key, value] : map) {
    if (!plain_args(key) || !plain_args(value.first)) return std::string_view::npos;
    n += key.size() + value.first.size() + (value.second ? 6 : 4) + 2;
  }
  return n == 0 ? 0 : n - 2;
}

// Writes that text; `text` has room for pair_args_size(map) more bytes.
inline void put_pair_args(Cursor& text, const PairMap& map) {
  bool first = true;
  for (const auto& [key, value] : map) {
    if (!first) text.put(", ", 2);
    first = false;
    text.put('"');
    text.put(key);
    if (value.second) {
      text.put("\": \"", 4);
      text.put(value.first);
      text.put('"');
    } else {
      text.put("\": ", 3);
      text.put(value.first);
    }
  }
}

// The top-level key `key`'s value in a JSON object's text: the offset of its first byte, or
// npos. Strings and nested values are skipped, so a key-like text inside a value never
// matches.
inline size_t top_level_value(std::string_view json, std::string_view key) {
  int depth = 0;
  size_t i = 0;
  const size_t n = json.size();
  while (i < n) {
    char c = json[i];
    if (c == '"') {
      size_t start = i + 1;
      size_t j = start;
      while (j < n && json[j] != '"') j += json[j] == '\\' ? 2 : 1;
      if (j >= n) return std::string_view::npos;
      std::string_view s = json.substr(start, j - start);
      i = j + 1;
      if (depth == 1 && s == key) {
        while (i < n && (std::isspace(static_cast<unsigned char>(json[i])) || json[i] == ':')) ++i;
        return i;
      }
      continue;
    }
    if (c == '{' || c == '[') ++depth;
    if (c == '}' || c == ']') --depth;
    ++i;
  }
  return std::string_view::npos;
}

// The time argument of handleDeviceInfo, which torch 2.11's Kineto declares unsigned.
template <typename>
struct SecondArgument;
template <typename C, typename A, typename B>
struct SecondArgument<void (C::*)(A, B)> {
  using type = B;
};
using DeviceInfoTime = SecondArgument<decltype(&kt::ActivityLogger::handleDeviceInfo)>::type;

class Logger : public kt::ActivityLogger {
 public:
  // `path` is written through `path.tmp`, renamed at the end, as Kineto's logger does;
  // `kineto` writes the side file; `reference`, if any, writes the whole capture as Kineto
  // alone would (for comparison).
  Logger(std::string path, std::unique_ptr<kt::ActivityLogger> kineto, std::string side,
         std::unique_ptr<kt::ActivityLogger> reference, RowsSink rows = {})
      : path_(std::move(path)),
        side_(std::move(side)),
        kineto_(std::move(kineto)),
        reference_(std::move(reference)),
        rows_(rows) {
  }

  ~Logger() override {
    if (!finished_) {
      std::remove(side_.c_str());
      std::remove((side_ + ".tmp").c_str());
    }
  }

  void handleDeviceInfo(const kt::DeviceInfo& info, DeviceInfoTime time) override {
    kineto_->handleDeviceInfo(info, time);
    if (reference_) reference_->handleDeviceInfo(info, time);
  }
  void handleResourceInfo(const kt::ResourceInfo& info, int64_t time) override {
    kineto_->handleResourceInfo(info, time);
    if (reference_) reference_->handleResourceInfo(info, time);
  }
  void handleOverheadInfo(const OverheadInfo& info, int64_t time) override {
    kineto_->handleOverheadInfo(info, time);
    if (reference_) reference_->handleOverheadInfo(info, time);
  }
  void handleTraceSpan(const kt::TraceSpan& span) override {
    kineto_->handleTraceSpan(span);
    if (reference_) reference_->handleTraceSpan(span);
  }
  void handleTraceStart(const std::unordered_map<std::string, std::string>& metadata,
                        const std::string& device_properties) override {
    kineto_->handleTraceStart(metadata, device_properties);
    if (reference_) reference_->handleTraceStart(metadata, device_properties);
  }
  void finalizeMemoryTrace(const std::string& url, const kt::Config& config) override {
    kineto_->finalizeMemoryTrace(url, config);
    if (reference_) reference_->finalizeMemoryTrace(url, config);
  }

  void handleActivity(const kt::ITraceActivity& op) override {
    if (reference_) reference_->handleActivity(op);
    // The type first: name() returns a copy, not wanted of an activity the table does not keep.
    if (rows_.rows != nullptr && TableRows::kept(op.type())) rows_.rows->keep(op, op.name());
    if (!write(op, nullptr)) kineto_->handleActivity(op);
  }
  void handleGenericActivity(const kt::GenericTraceActivity& op) override {
    if (reference_) reference_->handleGenericActivity(op);
    if (rows_.rows != nullptr) rows_.rows->keep(op, op.activityName);
    const std::string parent = missing_parent(op);
    if (!write(op, &op, parent)) {
      // Kineto's writer writes the frame: the parent goes into its metadata.
      if (!parent.empty()) {
        add_raw_metadata(const_cast<kt::GenericTraceActivity&>(op), kPythonParent, parent);
      }
      kineto_->handleGenericActivity(op);
    }
  }

#if STEPSCOPE_FINALIZE_METADATA
  void finalizeTrace(const kt::Config&, std::unique_ptr<kt::ActivityBuffers> buffers, int64_t end,
                     std::unordered_map<std::string, std::vector<std::string>>& md) override {
    // The buffers (which hold the activities) stay alive until this returns.
    rows_ready();
    if (reference_) chrome(*reference_).finalizeTrace(end, md);
    chrome(*kineto_).finalizeTrace(end, md);
    (void)buffers;
    splice();
  }
#else
  void finalizeTrace(const kt::Config&, std::unique_ptr<kt::ActivityBuffers> buffers,
                     int64_t end) override {
    rows_ready();
    if (reference_) chrome(*reference_).finalizeTrace(end);
    chrome(*kineto_).finalizeTrace(end);
    (void)buffers;
    splice();
  }
#endif

 private:
  // Every activity has been handed over: the table's rows are complete, and the op table may be
  // made while the file is written.
  void rows_ready() {
    if (rows_.ready != nullptr) {
      auto ready = rows_.ready;
      rows_.ready = nullptr;
      rows_.rows = nullptr;
      ready(rows_.user);
    }
  }

  static kt::ChromeTraceLogger& chrome(kt::ActivityLogger& logger) {
    return reinterpret_cast<kt::ChromeTraceLogger&>(logger);
  }

  // A Python frame's "Python parent id" where its capture left it out (torch's trace_only),
  // else "": the frames go through `parents_` in the order Kineto hands them over.
  // The two values are read where the frame's metadata map keeps them (torch 2.13's pairs), one
  // walk over its few entries: two getMetadataValue() calls hashed both keys, built a
  // std::string of the 16-byte "Python parent id" for the lookup and copied each value out
  // (89 of the saver thread's 2,003 samples in `perf` of bench_writer, 4.4%).
  std::string missing_parent(const kt::GenericTraceActivity& op) {
    if (!kWritesPythonParents || op.type() != kt::ActivityType::PYTHON_FUNCTION) return {};
    std::string_view id_text;
    std::string id_copy;
    if (const PairMap* map = pair_metadata_of(op)) {
      for (const auto& [key, value] : *map) {
        const std::string_view name = key;
        if (name == kPythonParent && !value.first.empty()) return {};
        if (name == kPythonId) id_text = value.first;
      }
    } else {
      if (!op.getMetadataValue(kPythonParent).empty()) return {};
      id_copy = op.getMetadataValue(std::string(kPythonId));
      id_text = id_copy;
    }
    int64_t id = 0;
    const char* end = id_text.data() + id_text.size();
    const auto parsed = std::from_chars(id_text.data(), end, id);
    if (id_text.empty() || parsed.ec != std::errc() || parsed.ptr != end) return {};
    const int64_t start = op.timestamp();
    return parent_text(parents_.enter(op.resourceId(), start, start + op.duration(), id));
  }

  // Formats `op` into the buffer when it is ours and plain; false leaves it to Kineto.
  // `generic` is `op` when Kineto hands it over as a GenericTraceActivity (CPU ops, Python
  // frames): its name and (torch 2.13) metadata are then read in place, not copied. `parent`,
  // when not empty, is a Python frame's "Python parent id" to write first among its args.
  bool write(const kt::ITraceActivity& op, const kt::GenericTraceActivity* generic,
             std::string_view parent = {}) {
    const kt::ActivityType type = op.type();
    if (!ours(type)) return false;
    // Its flow (a CPU op to its backward, a launch to its kernel), written after it as Kineto
    // writes one: a flow of a type Kineto does not name stays Kineto's.
    const int64_t flow = op.flowId();
    const char* flow_name = nullptr;
    if (flow > 0) {
      const int flow_type = op.flowType();
      if (flow_type == static_cast<int>(kt::kLinkFwdBwd)) {
        flow_name = "fwdbwd";
      } else if (flow_type == static_cast<int>(kt::kLinkAsyncCpuGpu)) {
        flow_name = "ac2g";
      } else {
        return false;
      }
    }
    const int64_t device = op.deviceId();
    const int64_t resource = op.resourceId();
    // Kineto has written both as int and as int64, and the thread as its absolute value.
    if (device < 0 || device > INT32_MAX || resource < 0 || resource > INT32_MAX) return false;
    const kt::ITraceActivity* linked = op.linkedActivity();
    std::string owned_name;
    std::string_view name;
    if (generic != nullptr) {
      name = generic->activityName;
    } else {
      owned_name = op.name();
      name = owned_name;
    }
    if (name == "kernel" || !plain_name(name)) return false;
    if (linked != nullptr && type == kt::ActivityType::CONCURRENT_KERNEL &&
        linked->name() == "record_param_comms") {
      return false;
    }
    // The args: torch 2.13's map read in place (its length now, its text below), else the
    // text of Kineto's metadataJson().
    const PairMap* map = generic != nullptr ? pair_metadata_of(*generic) : nullptr;
    std::string metadata;
    size_t args_size = 0;
    bool has_args = false;
    if (map != nullptr) {
      args_size = pair_args_size(*map);
      if (args_size == std::string_view::npos) return false;
      has_args = !map->empty();
    } else {
      metadata = op.metadataJson();
      if (!plain_args(metadata)) return false;
      // Blank args: Kineto leaves them out, but its older writers only when blank by " \t\n".
      has_args = !blank(metadata);
      if (!has_args && metadata.find_first_not_of(" \t\n") != std::string::npos) return false;
      args_size = metadata.size();
    }

    // Kineto's "External id": the linked activity's correlation id, else the event's own for
    // the types that keep it; written as an int, and only when not 0.
    int external = 0;
    if (linked != nullptr) {
      external = static_cast<int>(linked->correlationId());
    } else if (own_id_written(type)) {
      external = static_cast<int>(op.correlationId());
    }
    // The parent, `"Python parent id": N` and ", " before the other args.
    const size_t parent_size =
        parent.empty() ? 0 : std::strlen(kPythonParent) + parent.size() + 4 + (has_args ? 2 : 0);
    const bool any_args = has_args || !parent.empty();
    // An event's text and its parts are indexed in 32 bits (Pending).
    if (name.size() > (1u << 30) || args_size > (1u << 30)) return false;
    const char* category = kt::toString(type);
    // The fixed text below is under 128 bytes, each number under 24.
    text_.ensure(256 + std::strlen(category) + name.size() + args_size + parent_size);
    constexpr std::string_view kCat = "{\"ph\": \"X\", \"cat\": \"";
    constexpr std::string_view kName = "\", \"name\": \"";
    constexpr std::string_view kPid = "\", \"pid\": ";
    constexpr std::string_view kTid = ", \"tid\": ";
    constexpr std::string_view kTs = ", \"ts\": ";
    constexpr std::string_view kDur = ", \"dur\": ";
    constexpr std::string_view kArgs = ", \"args\": {";
    constexpr std::string_view kExternal = "\"External id\": ";
    const char* begin = text_.cursor();
    text_.put(kCat);
    text_.put(category, std::strlen(category));
    text_.put(kName);
    text_.put(name);
    text_.put(kPid);
    text_.put_int(device);
    text_.put(kTid);
    text_.put_int(resource);
    text_.put(kTs);
    const size_t head = text_.cursor() - begin;
    text_.put(kDur);
    const int64_t dur = op.duration();
    text_.put_us(dur < 0 ? 0 : dur);
    if (external != 0 || any_args) {
      text_.put(kArgs);
      if (external != 0) {
        text_.put(kExternal);
        text_.put_int(external);
        if (any_args) text_.put(',');
      }
      if (!parent.empty()) {
        text_.put('"');
        text_.put(std::string_view(kPythonParent));
        text_.put("\": ", 3);
        text_.put(parent);
        if (has_args) text_.put(", ", 2);
      }
      if (has_args) {
        if (map != nullptr) {
          put_pair_args(text_, *map);
        } else {
          text_.put(metadata);
        }
      }
      text_.put('}');
    }
    text_.put("},\n", 3);
    pending_.push_back(Pending{begin, static_cast<uint32_t>(head),
                               static_cast<uint32_t>(text_.cursor() - begin), op.timestamp()});
    if (flow_name != nullptr) {
      // Kineto's flow event: ph "s" at its start, "f" (bound to the enclosing slice) at its end.
      constexpr std::string_view kId = "\", \"id\": ";
      constexpr std::string_view kCatKey = ", \"cat\": \"";
      const bool start = op.flowStart();
      text_.ensure(192);
      const char* flow_begin = text_.cursor();
      text_.put("{\"ph\": \"", 8);
      text_.put(start ? 's' : 'f');
      text_.put(kId);
      text_.put_int(flow);
      text_.put(kPid.substr(1));
      text_.put_int(device);
      text_.put(kTid);
      text_.put_int(resource);
      text_.put(kTs);
      const size_t flow_head = text_.cursor() - flow_begin;
      text_.put(kCatKey);
      text_.put(std::string_view(flow_name));
      text_.put(kName);
      text_.put(std::string_view(flow_name));
      text_.put(start ? std::string_view("\"},\n") : std::string_view("\", \"bp\": \"e\"},\n"));
      pending_.push_back(Pending{flow_begin, static_cast<uint32_t>(flow_head),
                                 static_cast<uint32_t>(text_.cursor() - flow_begin),
                                 op.timestamp()});
    }
    return true;
  }

  // With read(2), not a stream: a stringstream's str() would need a libstdc++ newer than
  // torch's floor (GLIBCXX_3.4.29, checked by auditwheel).
  static std::string read_file(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw std::runtime_error("Kineto wrote no trace to " + path + ": " + std::strerror(errno));
    std::string text;
    char chunk[1 << 16];
    for (;;) {
      ssize_t n = ::read(fd, chunk, sizeof chunk);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const std::string why = std::strerror(errno);
        ::close(fd);
        throw std::runtime_error("reading " + path + ": " + why);
      }
      if (n == 0) break;
      text.append(chunk, static_cast<size_t>(n));
    }
    ::close(fd);
    return text;
  }

  void write_all(int fd, std::string_view data) {
    while (!data.empty()) {
      ssize_t n = ::write(fd, data.data(), data.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        throw std::runtime_error("writing " + path_ + ".tmp: " + std::strerror(errno));
      }
      data.remove_prefix(static_cast<size_t>(n));
    }
  }

  // Kineto's side file around this logger's events, into `path_.tmp`, then renamed.
  void splice() {
    std::string side = read_file(side_);
    std::remove(side_.c_str());
    finished_ = true;
    const size_t base_at = top_level_value(side, "baseTimeNanoseconds");
    const size_t events_at = top_level_value(side, "traceEvents");
    if (base_at == std::string::npos || events_at == std::string::npos ||
        side[events_at] != '[') {
      throw std::runtime_error(
          "Kineto's trace header has no baseTimeNanoseconds or traceEvents: a Kineto this "
          "glue does not know (set stepscope.serializer to \"kineto\")");
    }
    int64_t base = 0;
    auto parsed = std::from_chars(side.data() + base_at, side.data() + side.size(), base);
    if (parsed.ec != std::errc()) {
      throw std::runtime_error("Kineto's baseTimeNanoseconds is not an integer");
    }
    // The side file names itself; the trace names the path it was asked for, as Kineto's
    // does (backslashes made '/', newlines dropped).
    std::string name = path_;
    for (char& c : name) {
      if (c == '\\') c = '/';
    }
    std::erase(name, '\n');
    // The last key, after every event (whose names an older Kineto may leave unescaped).
    const std::string_view name_key = "\"traceName\": \"";
    const size_t key_at = side.rfind(name_key);
    std::string tail;
    std::string_view after = std::string_view(side).substr(events_at + 1);
    if (key_at != std::string::npos && key_at > events_at) {
      const size_t name_at = key_at + name_key.size() - 1;
      const size_t close = side.find('"', name_at + 1);
      if (close != std::string::npos) {
        tail.append(side, events_at + 1, name_at + 1 - (events_at + 1));
        tail.append(name);
        tail.append(side, close, std::string::npos);
        after = tail;
      }
    }

    const std::string tmp = path_ + ".tmp";
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw std::runtime_error("opening " + tmp + ": " + std::strerror(errno));
    try {
      write_all(fd, std::string_view(side).substr(0, events_at + 1));
      write_all(fd, "\n");
      // The events with their times, in slices of about 1 MB.
      Text out;
      for (const Pending& p : pending_) {
        out.ensure(p.size + 32);
        out.put(p.text, p.head);
        const int64_t rel = p.ts - base;
        out.put_us(rel < 0 ? 0 : rel);
        out.put(p.text + p.head, p.size - p.head);
        if (out.size() >= (1 << 20)) {
          write_all(fd, out.view(0, out.size()));
          out.clear();
        }
      }
      write_all(fd, out.view(0, out.size()));
      write_all(fd, after);
    } catch (...) {
      ::close(fd);
      ::unlink(tmp.c_str());
      throw;
    }
    if (::close(fd) != 0) {
      const std::string why = std::strerror(errno);
      ::unlink(tmp.c_str());
      throw std::runtime_error("closing " + tmp + ": " + why);
    }
    std::remove(path_.c_str());
    if (std::rename(tmp.c_str(), path_.c_str()) != 0) {
      const std::string why = std::strerror(errno);
      ::unlink(tmp.c_str());
      throw std::runtime_error("renaming " + tmp + ": " + why);
    }
  }

  std::string path_;
  std::string side_;
  std::unique_ptr<kt::ActivityLogger> kineto_;
  std::unique_ptr<kt::ActivityLogger> reference_;
  Blocks text_;
  std::vector<Pending> pending_;
  PythonParents parents_;
  RowsSink rows_;
  bool finished_ = false;
};

// Whether `logger` is Kineto's ChromeTraceLogger (by its type's name: type_info objects of
// two libraries need not be one).
inline bool is_chrome_logger(const kt::ActivityLogger& logger) {
  return std::strcmp(typeid(logger).name(), "N9libkineto17ChromeTraceLoggerE") == 0;
}

// Kineto's own file logger (its "file" protocol), or null when the registry has none.
inline std::unique_ptr<kt::ActivityLogger> kineto_file_logger(const std::string& path) {
  auto& registry = kt::ActivityProfilerController::loggerFactory().factories;
  auto it = registry.find("file");
  if (it == registry.end() || !it->second) return nullptr;
  return it->second(path);
}

// Whether this libtorch exports every weak function above.
inline bool available() {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Waddress"
#pragma GCC diagnostic ignored "-Wpmf-conversions"
#if STEPSCOPE_KINETO_2_14
  const bool registers = &kt::registerLoggerFactory != nullptr;
#else
  const bool registers = &kt::ActivityProfilerController::addLoggerFactory != nullptr;
#endif
  const bool finalizes = &kt::ChromeTraceLogger::finalizeTrace != nullptr;
  return registers && finalizes && &kt::ActivityProfilerController::loggerFactory != nullptr;
#pragma GCC diagnostic pop
}

// Where the next save's reference copy goes ("" for none): set by the save just before
// Kineto calls the factory, on the same thread.
inline thread_local std::string next_reference;
// Where the next save keeps the op table's rows (none: rows is null).
inline thread_local RowsSink next_rows;

// Registers the "stepscope" protocol once; false when Kineto's registry has no file logger
// to write the side file with (the save then goes through Kineto's own writer).
inline bool registered() {
  // A static's initializer, not std::call_once: that needs pthread_once@GLIBC_2.34 when built
  // on a newer glibc, above torch's floor (manylinux_2_28).
  static const bool ok = [] {
    if (!available()) return false;
    auto& registry = kt::ActivityProfilerController::loggerFactory().factories;
    if (registry.find("file") == registry.end()) return false;
#if STEPSCOPE_KINETO_2_14
    kt::registerLoggerFactory(
#else
    kt::ActivityProfilerController::addLoggerFactory(
#endif
        kProtocol, [](const std::string& path) -> std::unique_ptr<kt::ActivityLogger> {
          const std::string side = path + ".kineto-side";
          auto kineto = kineto_file_logger(side);
          std::unique_ptr<kt::ActivityLogger> reference;
          if (!next_reference.empty()) reference = kineto_file_logger(next_reference);
          if (!kineto || !is_chrome_logger(*kineto) ||
              (!next_reference.empty() && (!reference || !is_chrome_logger(*reference)))) {
            // Some other logger serves "file" here: Kineto's registry decides, as without
            // stepscope's serializer.
            kineto.reset();
            reference.reset();
            std::remove((side + ".tmp").c_str());
            if (!next_reference.empty()) std::remove((next_reference + ".tmp").c_str());
            auto own = kineto_file_logger(path);
            if (!own) throw std::runtime_error("Kineto has no file logger");
            return own;
          }
          return std::make_unique<Logger>(path, std::move(kineto), side, std::move(reference),
                                          next_rows);
        });
    return true;
  }();
  return ok;
}

}  // namespace stepscope_writer
