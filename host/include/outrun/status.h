// Status of one evaluation, and the small error value of API calls.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace outrun {

// Every evaluation ends exactly once with one of these. The numbering is the wire's
// (protocol/outrun.fbs, enum Status) and never changes.
enum class Status : uint8_t {
  ok = 0,
  compile_error,     // the source does not compile; message has the line
  runtime_error,     // the script raised an error or returned an unsupported value
  timeout,           // soft timeout: the worker interrupted the script at T
  killed,            // this evaluation overran T+G; its worker was killed
  memory_limit,      // the script's state reached HostOptions::memory_limit
  busy,              // single flight: this key already has an evaluation in flight
  worker_lost,       // its worker died for another reason (crash, another script's overrun, ...)
  unavailable,       // no worker could take it (crash loop, queue full while down, no daemon)
  cancelled,         // the runner shut down (or outrund's client left) before it could finish
  invalid_argument,  // bad script handle, inputs too large or too deep, ...
};

std::string_view to_string(Status s);
// Parses the names above; returns false for an unknown name.
bool parse_status(std::string_view name, Status* out);

// Result of an API call that can fail (not of an evaluation). Empty means success:
//   if (auto err = host->register_script(...)) { log(err.message); }
struct Error {
  Status status = Status::ok;
  std::string message;

  static Error none() { return {}; }
  explicit operator bool() const { return status != Status::ok; }
};

}  // namespace outrun
