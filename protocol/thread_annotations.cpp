#include "outrun/thread_annotations.h"

#include <cstdio>
#include <cstdlib>

namespace outrun {

void thread_role_violation() {
  std::fputs("outrun: internal error: code bound to one thread (a ThreadRole) ran on another\n",
             stderr);
  std::abort();
}

}  // namespace outrun
