// ErrorCode <-> the wire Status of outrund's replies to requests (Registered, Unregistered,
// ControlReply, TagsReply, TagValues): the one mapping. outrund encodes an Error with
// wire_status, outrun::Client decodes a reply with error_from_wire. The wire is unchanged by
// ErrorCode (the Node.js client reads the same statuses); the table and why: design/protocol.md
// "Errors of requests".
#pragma once

#include <string>

#include "outrun/protocol/outrun_generated.h"
#include "outrun/status.h"

namespace outrun::detail {

inline wire::Status wire_status(ErrorCode c) {
  switch (c) {
    case ErrorCode::ok:
      return wire::Status::Ok;
    case ErrorCode::invalid_argument:
      return wire::Status::InvalidArgument;
    case ErrorCode::compile_error:
      return wire::Status::CompileError;
    case ErrorCode::unavailable:
      return wire::Status::Unavailable;
    case ErrorCode::protocol_error:
      break;  // a client's own code: outrund never has one
  }
  return wire::Status::RuntimeError;
}

// `status` as protocol::client_status left it: a status this client has no name for arrives as
// RuntimeError ("outrund sent an unknown status N"), which outrund never sends for a request.
inline Error error_from_wire(wire::Status status, std::string message) {
  switch (status) {
    case wire::Status::Ok:
      return {};
    case wire::Status::InvalidArgument:
      return {ErrorCode::invalid_argument, std::move(message)};
    case wire::Status::CompileError:
      return {ErrorCode::compile_error, std::move(message)};
    case wire::Status::RuntimeError:
    case wire::Status::NeedSource:
      return {ErrorCode::protocol_error, std::move(message)};
    default:  // Unavailable; Busy (tags requests waiting); older daemons: Cancelled, Timeout, ...
      return {ErrorCode::unavailable, std::move(message)};
  }
}

}  // namespace outrun::detail
