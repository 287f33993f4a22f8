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

// What went wrong in an API call (not in an evaluation: that is a Status). An API call never
// ends busy, timeout or killed, so it has its own, smaller set; the CLI prints to_string(code).
// Not a wire number: outrund's replies carry a wire Status, mapped in host/codec/error_wire.h
// (design/protocol.md "Errors of requests").
enum class ErrorCode : uint8_t {
  ok = 0,            // no error (Error::none())
  invalid_argument,  // the call is wrong and fails the same way again: a bad option, key, source,
                     // id, definition or document, one over a fixed size, an unknown key, tag or
                     // shard
  compile_error,     // a script the call compile-checks does not compile (tags::Engine::apply,
                     // define); the message names the tag and has the line
  unavailable,       // it cannot be done now and may work later: a limit or quota reached, the
                     // workers did not start, the runner or engine is shutting down or could not
                     // run a check, outrund cannot be reached (or botched its hello), refused the
                     // connection, went away or has too many requests waiting
  protocol_error,    // outrund sent something this client cannot use (a reply that is not JSON,
                     // a cursor twice, a status it has no name for); the C++ client's own code
};

std::string_view to_string(ErrorCode c);

// Result of an API call that can fail (not of an evaluation). Empty means success:
//   if (auto err = host->register_script(...)) { log(err.message); }
// [[nodiscard]]: a call's error is handled or discarded on purpose, `(void)` with a reason.
struct [[nodiscard]] Error {
  ErrorCode code = ErrorCode::ok;
  std::string message;

  static Error none() { return {}; }
  explicit operator bool() const { return code != ErrorCode::ok; }
};

}  // namespace outrun
