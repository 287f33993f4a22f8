// Every OPC UA StatusCode the specification names, generated at build time from
// host/tags/StatusCode.csv (the OPC Foundation's published list; host/tags/status_codes.cmake)
// plus Good, Uncertain and Bad. One table for the sandbox's `StatusCode.X` (sandbox.cpp) and the
// tags layer's names (outrun::tags::status_code_name, parse_status_code).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

namespace outrun::status_codes {

struct Entry {
  uint32_t code;
  std::string_view name;
};

// Every named code, sorted by name (byte order).
std::span<const Entry> by_name();
// The entry named `name` (exactly, case included), or nullptr.
const Entry* find(std::string_view name);
// The entry of `code`, or nullptr (a code with info bits set in its low 16 bits has no name).
const Entry* find(uint32_t code);

}  // namespace outrun::status_codes
