#include "outrun/thread_annotations.h"

#include <cstdio>
#include <cstdlib>

namespace outrun {

void thread_role_violation() {
  std::fputs("outrun: internal error: loop-only code ran on another thread\n", stderr);
  std::abort();
}

}  // namespace outrun
