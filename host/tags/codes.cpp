// StatusCode names, DataType names and the coercion of a script's result to a tag's DataType.
#include <cerrno>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "outrun/tags.h"
#include "status_codes.h"

namespace outrun::tags {

namespace {

constexpr std::string_view kTypeNames[] = {
    "Variant", "Boolean", "SByte", "Byte",   "Int16",  "UInt16",   "Int32",     "UInt32",
    "Int64",   "UInt64",  "Float", "Double", "String", "DateTime", "ByteString"};

StatusCode mismatch(std::string* reason, std::string what) {
  *reason = std::move(what);
  return codes::BadTypeMismatch;
}
StatusCode out_of_range(std::string* reason, std::string what) {
  *reason = std::move(what);
  return codes::BadOutOfRange;
}

std::string_view kind_name(const Value& v) {
  constexpr std::string_view names[] = {"nil",   "boolean", "integer", "number", "string",  "bytes",
                                        "array", "map",     "UInt64",  "Float",  "DateTime"};
  return names[v.v.index()];
}

// A number as a long double, for range checks; false when `in` is not a number.
bool as_number(const Value& in, long double* out, bool* integral) {
  if (auto* i = std::get_if<int64_t>(&in.v)) {
    *out = static_cast<long double>(*i);
    *integral = true;
  } else if (auto* u = std::get_if<uint64_t>(&in.v)) {
    *out = static_cast<long double>(*u);
    *integral = true;
  } else if (auto* d = std::get_if<double>(&in.v)) {
    *out = *d;
    *integral = false;
  } else if (auto* f = std::get_if<float>(&in.v)) {
    *out = *f;
    *integral = false;
  } else {
    return false;
  }
  return true;
}

StatusCode to_integer(const Value& in, DataType t, Value* out, std::string* reason) {
  long double x = 0;
  bool integral = false;
  if (!as_number(in, &x, &integral))
    return mismatch(reason, std::string("expected a number for ") + std::string(to_string(t)) +
                                ", got " + std::string(kind_name(in)));
  if (std::isnan(x) || std::isinf(x))
    return out_of_range(
        reason, std::string(to_string(t)) + " cannot hold " + (std::isnan(x) ? "NaN" : "infinity"));
  if (!integral) x = std::round(x);  // half away from zero
  long double lo = 0, hi = 0;
  switch (t) {
    case DataType::SByte:
      lo = INT8_MIN, hi = INT8_MAX;
      break;
    case DataType::Byte:
      lo = 0, hi = UINT8_MAX;
      break;
    case DataType::Int16:
      lo = INT16_MIN, hi = INT16_MAX;
      break;
    case DataType::UInt16:
      lo = 0, hi = UINT16_MAX;
      break;
    case DataType::Int32:
      lo = INT32_MIN, hi = INT32_MAX;
      break;
    case DataType::UInt32:
      lo = 0, hi = UINT32_MAX;
      break;
    case DataType::Int64:
      lo = static_cast<long double>(INT64_MIN), hi = static_cast<long double>(INT64_MAX);
      break;
    case DataType::UInt64:
      lo = 0, hi = static_cast<long double>(UINT64_MAX);
      break;
    default:
      break;
  }
  if (x < lo || x > hi) {
    char buf[128];
    std::snprintf(buf, sizeof buf, "%.17Lg is outside the range of %s (%.0Lf..%.0Lf)", x,
                  std::string(to_string(t)).c_str(), lo, hi);
    return out_of_range(reason, buf);
  }
  if (t == DataType::UInt64) {
    if (auto* u = std::get_if<uint64_t>(&in.v))
      *out = Value(*u);
    else if (auto* i = std::get_if<int64_t>(&in.v))
      *out = Value(static_cast<uint64_t>(*i));
    else
      *out = Value(static_cast<uint64_t>(x));
  } else if (t == DataType::UInt32 || t == DataType::UInt16 || t == DataType::Byte) {
    *out = Value(static_cast<uint64_t>(x));
  } else {
    if (auto* i = std::get_if<int64_t>(&in.v))
      *out = Value(*i);
    else
      *out = Value(static_cast<int64_t>(x));
  }
  return codes::Good;
}

StatusCode coerce_scalar(const Value& in, DataType t, Value* out, std::string* reason) {
  switch (t) {
    case DataType::Variant:
      *out = in;
      return codes::Good;
    case DataType::Boolean:
      if (!in.is<bool>())
        return mismatch(reason, "expected a boolean, got " + std::string(kind_name(in)));
      *out = in;
      return codes::Good;
    case DataType::SByte:
    case DataType::Byte:
    case DataType::Int16:
    case DataType::UInt16:
    case DataType::Int32:
    case DataType::UInt32:
    case DataType::Int64:
    case DataType::UInt64:
      return to_integer(in, t, out, reason);
    case DataType::Float: {
      long double x = 0;
      bool integral = false;
      if (!as_number(in, &x, &integral))
        return mismatch(reason, "expected a number for Float, got " + std::string(kind_name(in)));
      if (std::isfinite(x) && std::fabs(x) > FLT_MAX) {
        char buf[96];
        std::snprintf(buf, sizeof buf, "%.17Lg is outside the range of Float", x);
        return out_of_range(reason, buf);
      }
      *out = Value(static_cast<float>(x));
      return codes::Good;
    }
    case DataType::Double: {
      long double x = 0;
      bool integral = false;
      if (!as_number(in, &x, &integral))
        return mismatch(reason, "expected a number for Double, got " + std::string(kind_name(in)));
      if (auto* d = std::get_if<double>(&in.v))
        *out = Value(*d);
      else
        *out = Value(static_cast<double>(x));
      return codes::Good;
    }
    case DataType::String:
      if (in.is<std::string>()) {
        *out = in;
        return codes::Good;
      }
      if (in.is<Bytes>()) return mismatch(reason, "the string is not valid UTF-8");
      return mismatch(reason, "expected a string, got " + std::string(kind_name(in)));
    case DataType::DateTime: {
      if (in.is<DateTime>()) {
        *out = in;
        return codes::Good;
      }
      if (auto* s = std::get_if<std::string>(&in.v)) {
        DateTime dt;
        bool outside = false;
        if (!parse_datetime(*s, &dt, &outside))
          return outside
                     ? out_of_range(reason, "'" + *s + "' is outside DateTime's range (1601..9999)")
                     : mismatch(reason, "'" + *s + "' is not an ISO 8601 date and time");
        *out = Value(dt);
        return codes::Good;
      }
      long double x = 0;
      bool integral = false;
      if (!as_number(in, &x, &integral))
        return mismatch(reason,
                        "expected seconds since 1970 or an ISO 8601 string for DateTime, got " +
                            std::string(kind_name(in)));
      // OPC UA's DateTime range: 1601-01-01 .. 9999-12-31 (OPC 10000-6 5.2.2.5).
      constexpr long double kMin = -11644473600.0L, kMax = 253402300799.0L;
      if (!(x >= kMin && x <= kMax)) {
        char buf[128];
        std::snprintf(buf, sizeof buf,
                      "%.17Lg seconds since 1970 is outside DateTime's range (1601..9999)", x);
        return out_of_range(reason, buf);
      }
      *out = Value(DateTime::from_unix_seconds(static_cast<double>(x)));
      return codes::Good;
    }
    case DataType::ByteString:
      if (auto* s = std::get_if<std::string>(&in.v)) {
        *out = Value(Bytes{*s});
        return codes::Good;
      }
      if (in.is<Bytes>()) {
        *out = in;
        return codes::Good;
      }
      return mismatch(reason,
                      "expected a string for ByteString, got " + std::string(kind_name(in)));
  }
  return mismatch(reason, "unknown DataType");
}

}  // namespace

std::string status_code_name(StatusCode c) {
  if (const auto* e = status_codes::find(c)) return std::string(e->name);
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08X", c);
  return buf;
}

bool parse_status_code(std::string_view text, StatusCode* out) {
  if (const auto* e = status_codes::find(text)) {
    *out = e->code;
    return true;
  }
  if (text.empty() || text.size() > 12) return false;
  std::string s(text);
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 0);
  if (errno != 0 || *end != '\0' || v > UINT32_MAX || s[0] == '-' || s[0] == '+') return false;
  *out = static_cast<StatusCode>(v);
  return true;
}

StatusCode status_code_for(Status s) {
  switch (s) {
    case Status::ok:
      return codes::Good;
    case Status::compile_error:
      return codes::BadConfigurationError;
    case Status::runtime_error:
      return codes::BadInternalError;
    case Status::timeout:
    case Status::killed:
      return codes::BadTimeout;
    case Status::memory_limit:
      return codes::BadOutOfMemory;
    case Status::invalid_argument:
      return codes::BadInvalidArgument;
    case Status::busy:
      return codes::BadTooManyOperations;  // never an output (counted)
    case Status::worker_lost:
    case Status::unavailable:
    case Status::cancelled:
      return codes::BadResourceUnavailable;
  }
  return codes::BadInternalError;
}

std::string_view to_string(DataType t) {
  const auto i = static_cast<std::size_t>(t);
  return i < std::size(kTypeNames) ? kTypeNames[i] : "Unknown";
}

bool parse_data_type(std::string_view name, DataType* out) {
  for (std::size_t i = 0; i < std::size(kTypeNames); ++i) {
    if (kTypeNames[i] == name) {
      *out = static_cast<DataType>(i);
      return true;
    }
  }
  return false;
}

StatusCode coerce(const Value& in, TypeSpec spec, Value* out, std::string* reason) {
  if (!spec.array) return coerce_scalar(in, spec.type, out, reason);
  const Array* a = std::get_if<Array>(&in.v);
  Array empty;
  if (a == nullptr) {
    if (auto* m = std::get_if<Map>(&in.v); m != nullptr && m->empty())
      a = &empty;  // {} from Lua
    else
      return mismatch(reason, "expected an array of " + std::string(to_string(spec.type)) +
                                  ", got " + std::string(kind_name(in)));
  }
  Array result;
  result.reserve(a->size());
  for (std::size_t i = 0; i < a->size(); ++i) {
    Value v;
    std::string why;
    const StatusCode c = coerce_scalar((*a)[i], spec.type, &v, &why);
    if (c != codes::Good) {
      *reason = "element " + std::to_string(i + 1) + ": " + why;
      return c;
    }
    result.push_back(std::move(v));
  }
  *out = Value(std::move(result));
  return codes::Good;
}

}  // namespace outrun::tags
