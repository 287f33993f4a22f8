// JSON <-> outrun::Value for the command line (inputs in, results out).
#pragma once

#include <nlohmann/json.hpp>

#include "outrun/value.h"

namespace outrun::cli {

// null -> nil, true/false, integers -> int64, other numbers -> double, strings, arrays, objects
// -> maps. Returns false (with *error) for input nested deeper than kMaxValueDepth.
bool from_json(const nlohmann::json& j, Value* out, std::string* error, int depth = 1);

// Bytes become {"$bytes": "<hex>"}; NaN and infinities become null (JSON has neither).
nlohmann::json to_json(const Value& v);

// A command-line input value: true, false, nil, an integer, a number, "quoted" (always a
// string), or anything else as a string.
Value parse_scalar(const std::string& text);

}  // namespace outrun::cli
