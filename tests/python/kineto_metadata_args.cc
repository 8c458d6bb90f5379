// torch 2.13's GenericTraceActivity metadata as stepscope's serializer formats it in place
// (cpp/kineto_writer.h: pair_args_size, put_pair_args) against Kineto's own metadataJson() of
// the same activity: the same text, or npos where that text is not plain (Kineto's writer then
// takes the event). Where the torch keeps typed metadata (2.14 on), the serializer calls
// metadataJson() itself: this prints "typed" and checks nothing. Exits 1 naming the first
// case that differs; prints "ok N" after N cases.
#include "kineto_writer.h"

#include <cstdio>
#include <string>

namespace kt = libkineto;
namespace sw = stepscope_writer;

namespace {

int cases = 0;

bool check(const char* what, const kt::GenericTraceActivity& a) {
  ++cases;
  const sw::PairMap& map = *sw::pair_metadata_of(a);
  const std::string want = a.metadataJson();
  const size_t n = sw::pair_args_size(map);
  if (!sw::plain_args(want)) {
    if (n == std::string_view::npos) return true;
    std::printf("%s: Kineto's text is not plain, yet a size was given: %s\n", what, want.c_str());
    return false;
  }
  if (n != want.size()) {
    std::printf("%s: size %zu, Kineto's text %zu bytes: %s\n", what, n, want.size(), want.c_str());
    return false;
  }
  sw::Text text;
  text.ensure(n + 1);
  sw::put_pair_args(text, map);
  const std::string_view got = text.view(0, text.size());
  if (got != want) {
    std::printf("%s:\n  ours   %.*s\n  Kineto %s\n", what, static_cast<int>(got.size()), got.data(),
                want.c_str());
    return false;
  }
  return true;
}

}  // namespace

int main() {
  kt::GenericTraceActivity none;
  if (sw::pair_metadata_of(none) == nullptr) {
    std::puts("typed");
    return 0;
  }

  kt::GenericTraceActivity op;  // a CPU op with shapes, as torch records one
  op.addMetadata("Record function id", 12);
  op.addMetadata("Ev Idx", 3);
  op.addMetadata("Input Dims", "[[8, 8], [8, 8]]");
  op.addMetadata("Input type", "[\"float\", \"float\"]");
  op.addMetadata("Concrete Inputs", "[\"\", \"\"]");
  op.addMetadata("Sequence number", -1);
  op.addMetadata("Fwd thread id", 0);

  kt::GenericTraceActivity frame;  // a Python frame, its parent unknown
  frame.addMetadata("Python parent id", "null");
  frame.addMetadata("Python id", 881);

  kt::GenericTraceActivity quoted;  // quoted values, as device plugins add them
  quoted.addMetadataQuoted("ptr", "0x7f3a5c000000");
  quoted.addMetadataQuoted("empty", "");
  quoted.addMetadataQuoted("name", "na\xc3\xafve \"q\"");
  quoted.addMetadata("ratio", 1.5);
  quoted.addMetadata("", "{}");

  kt::GenericTraceActivity one;
  one.addMetadataQuoted("only", "x");

  kt::GenericTraceActivity backslash;  // Kineto's writer makes '\\' '/': not plain
  backslash.addMetadata("Input Dims", "[]");
  backslash.addMetadataQuoted("file", "odd\\dir/a.py");

  kt::GenericTraceActivity newline;  // dropped by Kineto's writer: not plain
  newline.addMetadataQuoted("key\n", "v");

  bool ok = check("no metadata", none) && check("a CPU op", op) &&
            check("a Python frame", frame) && check("quoted values", quoted) &&
            check("one entry", one) && check("a backslash", backslash) &&
            check("a newline in a key", newline);
  if (!ok) return 1;
  std::printf("ok %d\n", cases);
  return 0;
}
