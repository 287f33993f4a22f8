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

// OPC UA DateTime: 100-nanosecond intervals since 1601-01-01 00:00 UTC (OPC 10000-6 5.2.2.5).
// A script sees a DateTime as a number: seconds since the Unix epoch (1970-01-01 UTC).
struct DateTime {
  int64_t ticks = 0;
  // Ticks between 1601-01-01 and 1970-01-01.
  static constexpr int64_t kUnixEpochTicks = 116444736000000000LL;
  static DateTime from_unix_seconds(double s) {
    return {static_cast<int64_t>(static_cast<long double>(s) * 1e7L) + kUnixEpochTicks};
  }
  static DateTime from_unix_micros(int64_t us) { return {us * 10 + kUnixEpochTicks}; }
  double unix_seconds() const { return static_cast<double>(ticks - kUnixEpochTicks) / 1e7; }
  int64_t unix_micros() const { return (ticks - kUnixEpochTicks) / 10; }
  friend auto operator<=>(const DateTime&, const DateTime&) = default;
};

struct Value;
struct MapEntry;
using Array = std::vector<Value>;
using Map = std::vector<MapEntry>;  // insertion order kept; keys unique

// A value: nil, boolean, int64, double, string, bytes, array of values, map string -> value, and
// three OPC UA built-in types a script's result is coerced to by the tags layer (tags.h): UInt64
// (and the smaller unsigned types), Float, DateTime. Scripts never see the last three as such:
// on the way in, a UInt64 becomes a Lua integer (a float above 2^63-1), a Float a Lua float and a
// DateTime a float of seconds since the Unix epoch; a script's result is always one of the first
// eight kinds.
// Nesting is limited to kMaxValueDepth levels on every path in and out of a script.
struct Value {
  using Variant = std::variant<Nil, bool, int64_t, double, std::string, Bytes, Array, Map, uint64_t,
                               float, DateTime>;
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
  Value(uint64_t u);
  Value(float f);
  Value(DateTime t);

  bool is_nil() const { return std::holds_alternative<Nil>(v); }
  template <class T>
  bool is() const {
    return std::holds_alternative<T>(v);
  }
  template <class T>
  const T& as() const {
    return std::get<T>(v);
  }

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
inline Value::Value(uint64_t u) : v(u) {}
inline Value::Value(float f) : v(f) {}
inline Value::Value(DateTime t) : v(t) {}

inline bool operator==(const Value& a, const Value& b) {
  return a.v == b.v;
}

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

// The double nearest to a float's shortest decimal form (1.1f -> 1.1, not 1.100000023841858):
// how a Float is shown and written to JSON.
double float_as_double(float f);

// ISO 8601 in UTC with milliseconds ("2026-12-01T10:00:00.000Z"; microseconds when there are any).
std::string format_datetime(DateTime t);
// Parses ISO 8601 with a 'Z' or +HH:MM offset and up to 6 fractional digits (more are cut), for
// a time in OPC UA's DateTime range (1601-01-01T00:00:00Z .. 9999-12-31T23:59:59.999999Z).
bool parse_datetime(std::string_view text, DateTime* out);
// The same; when it fails, *out_of_range says whether the text was a valid ISO 8601 time outside
// that range ("1600-12-31T00:00:00Z") rather than not one at all.
bool parse_datetime(std::string_view text, DateTime* out, bool* out_of_range);

}  // namespace outrun
