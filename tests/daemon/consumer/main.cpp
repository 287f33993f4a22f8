// Evaluates one script out of process with an installed outrun; prints the result.
#include <iostream>

#include "outrun/client.h"
#include "outrun/host.h"

int main() {
  outrun::HostOptions o;
  o.shards = 1;
  // No worker_path: the installed package tells the library where its worker is.
  std::unique_ptr<outrun::Host> host;
  if (auto err = outrun::Host::create(o, &host)) {
    std::cerr << "create: " << err.message << "\n";
    return 1;
  }
  outrun::Script s;
  if (auto err = host->register_script("consumer.avg", "return (inputs.a + inputs.b) / 2", &s)) {
    std::cerr << "register: " << err.message << "\n";
    return 1;
  }
  outrun::Result r = host->evaluate(s, {{"a", 1}, {"b", 2}}).get();
  if (r.status != outrun::Status::ok) {
    std::cerr << outrun::to_string(r.status) << ": " << r.error << "\n";
    return 1;
  }
  std::cout << outrun::to_display_string(r.value) << "\n";
  return 0;
}
