// outrun::Value: the values scripts receive as inputs and return as results (BRIEF §4).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace outrun {

struct Nil {
  friend bool operator==(Nil, Nil) { return true; }
};

// Raw bytes. In Lua both strings and bytes are Lua strings; a script's string result comes back
// as String when it is valid UTF-8 and as Bytes otherwise.
struct Bytes {
  std::string data;
  friend bool operator==(const Bytes&, const Bytes&) = default;
};

struct Value;
struct MapEntry;
using Array = std::vector<Value>;
using Map = std::vector<MapEntry>;  // insertion order kept; keys unique

// A value: nil, boolean, int64, double, string, bytes, array of values, map string -> value.
// Nesting is limited to kMaxValueDepth levels on every path in and out of a script.
struct Value {
  using Variant = std::variant<Nil, bool, int64_t, double, std::string, Bytes, Array, Map>;
  Variant v;

  // The converting constructors are defined below MapEntry: their bodies construct (and, on an
  // exception, destroy) the variant, which needs Map's element type complete. GCC accepts them
  // inline here; clang with libstdc++ (the fuzz build, design/fuzzing.md) does not.
  Value() = default;
  Value(Nil);
  Value(bool b);
  Value(int i);
  Value(int64_t i);
  Value(double d);
  Value(const char* s);
  Value(std::string s);
  Value(Bytes b);
  Value(Array a);
  Value(Map m);

  bool is_nil() const { return std::holds_alternative<Nil>(v); }
  template <class T> bool is() const { return std::holds_alternative<T>(v); }
  template <class T> const T& as() const { return std::get<T>(v); }

  friend bool operator==(const Value& a, const Value& b);
};

struct MapEntry {
  std::string key;
  Value value;
  friend bool operator==(const MapEntry&, const MapEntry&) = default;
};

inline Value::Value(Nil) {}
inline Value::Value(bool b) : v(b) {}
inline Value::Value(int i) : v(int64_t{i}) {}
inline Value::Value(int64_t i) : v(i) {}
inline Value::Value(double d) : v(d) {}
inline Value::Value(const char* s) : v(std::string(s)) {}
inline Value::Value(std::string s) : v(std::move(s)) {}
inline Value::Value(Bytes b) : v(std::move(b)) {}
inline Value::Value(Array a) : v(std::move(a)) {}
inline Value::Value(Map m) : v(std::move(m)) {}

inline bool operator==(const Value& a, const Value& b) { return a.v == b.v; }

// Deepest nesting of arrays/maps accepted in inputs and results.
inline constexpr int kMaxValueDepth = 32;

// A named input: the script reads it as inputs[name].
struct Input {
  std::string name;
  Value value;
};
using Inputs = std::vector<Input>;

// Human-readable rendering: numbers as Lua prints them (1, 1.5), strings unquoted at top level
// and JSON-quoted inside arrays/maps. Used by the CLI.
std::string to_display_string(const Value& v);

}  // namespace outrun
