// The shipped outrun-worker's hooks (hooks.h): none.
#include "hooks.h"

namespace outrun::worker {

const Hooks* start_hooks() {
  return nullptr;
}

}  // namespace outrun::worker
