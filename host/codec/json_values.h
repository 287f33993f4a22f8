// JSON <-> outrun::Value (inputs in, results out): the CLI, the tags file and updates stream. Below
// both (its own library, outrun_json_values), so the tags layer does not depend on the CLI.
#pragma once

#include <nlohmann/json.hpp>

#include "outrun/value.h"

namespace outrun::json_values {

// null -> nil, true/false, integers -> int64, other numbers -> double, strings, arrays, objects
// -> maps. Returns false (with *error) for input nested deeper than kMaxValueDepth.
bool from_json(const nlohmann::json& j, Value* out, std::string* error, int depth = 1);

// Bytes become {"$bytes": "<hex>"}; JSON has no NaN or infinities, so they become the strings
// "NaN", "Infinity" and "-Infinity" (the spelling of JavaScript and Python's json module).
nlohmann::json to_json(const Value& v);

// `s` with every control character (C0, DEL) escaped, for text on a terminal: \n \r \t \\ and
// \xNN for the others; backslashes are doubled so the escaping is unambiguous.
std::string escape_control(std::string_view s);

// A command-line input value: true, false, nil, an integer, a number, "quoted" (always a
// string), or anything else as a string. A number out of a double's range (1e400) sets *err
// when err is given (and returns nil).
Value parse_scalar(const std::string& text, std::string* err = nullptr);

}  // namespace outrun::json_values
