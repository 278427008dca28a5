// The relay's C++ test binaries' one check: CHECK counts a failed condition and goes on (every failure of a run is
// printed), Finish ends the run; tests/unit/test_relay_cpp.py compiles each binary with sanitizers and runs it.
#pragma once

#include <cstdio>

namespace llama3_relay_tests {

inline int failures = 0;

// main's return value: 0, printing "<what>: all checks passed", or 1 with the count of failed checks.
inline int Finish(const char* what) {
  if (failures != 0) {
    std::fprintf(stderr, "%s: %d checks failed\n", what, failures);
    return 1;
  }
  std::printf("%s: all checks passed\n", what);
  return 0;
}

}  // namespace llama3_relay_tests

#define CHECK(condition)                                                                  \
  do {                                                                                    \
    if (!(condition)) {                                                                   \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #condition); \
      ++llama3_relay_tests::failures;                                                     \
    }                                                                                     \
  } while (0)
