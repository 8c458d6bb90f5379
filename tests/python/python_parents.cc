// stepscope's Python parents (cpp/kineto_writer.h: PythonParents) on the frames of a capture:
// reads one frame a line, "thread start end id" (nanoseconds, in the order Kineto handed the
// frames to its writer), and prints each frame's parent id, or -1 for none, a line each.
// tests/python/test_python_parents.py feeds it a torch capture's frames and holds the output
// against the "Python parent id" torch's event tree gave the same frames.
#include "kineto_writer.h"

#include <cinttypes>
#include <cstdio>

int main() {
  stepscope_writer::PythonParents parents;
  int64_t thread = 0, start = 0, end = 0, id = 0;
  while (std::scanf("%" SCNd64 " %" SCNd64 " %" SCNd64 " %" SCNd64, &thread, &start, &end, &id) ==
         4) {
    std::printf("%" PRId64 "\n", parents.enter(thread, start, end, id));
  }
  return 0;
}
