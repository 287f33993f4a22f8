// An independent statement of which wire values the host accepts (design/protocol.md, Values),
// and a check that a decoded outrun::Value says what the wire value said.
#pragma once

#include <flatbuffers/flatbuffers.h>

#include <cstring>

#include "fuzz_support.h"
#include "outrun/protocol/frame.h"
#include "outrun/value.h"
#include "wire_codec.h"

namespace outrun::fuzz {

// A value no valid worker sends is refused: unknown kind, more than kMaxValueDepth nested
// containers, a map whose keys and items differ in length. An absent value is nil.
inline bool host_accepts(const wire::Value* v, int depth = 0) {
  if (v == nullptr) return true;
  switch (v->kind()) {
    case wire::ValueKind::Nil:
    case wire::ValueKind::Boolean:
    case wire::ValueKind::Int:
    case wire::ValueKind::Double:
    case wire::ValueKind::String:
    case wire::ValueKind::Bytes:
      return true;
    case wire::ValueKind::UInt:  // tag-value kinds: never in a worker's result
    case wire::ValueKind::Float:
    case wire::ValueKind::DateTime:
      return false;
    case wire::ValueKind::Array:
    case wire::ValueKind::Map: {
      if (depth >= kMaxValueDepth) return false;
      const auto* items = v->items();
      const std::size_t n = items ? items->size() : 0;
      if (v->kind() == wire::ValueKind::Map && n != (v->keys() ? v->keys()->size() : 0))
        return false;
      for (std::size_t i = 0; i < n; ++i)
        if (!host_accepts(items->Get(static_cast<flatbuffers::uoffset_t>(i)), depth + 1))
          return false;
      return true;
    }
  }
  return false;
}

// Equality with doubles compared bit for bit (NaN payloads, -0.0).
inline bool same(const Value& a, const Value& b) {
  if (a.v.index() != b.v.index()) return false;
  if (const auto* d = std::get_if<double>(&a.v)) {
    const double e = std::get<double>(b.v);
    return std::memcmp(d, &e, sizeof e) == 0;
  }
  if (const auto* x = std::get_if<Array>(&a.v)) {
    const auto& y = std::get<Array>(b.v);
    if (x->size() != y.size()) return false;
    for (std::size_t i = 0; i < x->size(); ++i)
      if (!same((*x)[i], y[i])) return false;
    return true;
  }
  if (const auto* x = std::get_if<Map>(&a.v)) {
    const auto& y = std::get<Map>(b.v);
    if (x->size() != y.size()) return false;
    for (std::size_t i = 0; i < x->size(); ++i)
      if ((*x)[i].key != y[i].key || !same((*x)[i].value, y[i].value)) return false;
    return true;
  }
  return a == b;
}

// The decoded value says what the wire value says (fields of its kind only; absent strings,
// bytes and vectors are empty).
inline bool matches(const wire::Value* w, const Value& v) {
  if (w == nullptr) return v.is<Nil>();
  switch (w->kind()) {
    case wire::ValueKind::Nil:
      return v.is<Nil>();
    case wire::ValueKind::Boolean:
      return v.is<bool>() && v.as<bool>() == w->bool_value();
    case wire::ValueKind::Int:
      return v.is<int64_t>() && v.as<int64_t>() == w->int_value();
    case wire::ValueKind::Double: {
      if (!v.is<double>()) return false;
      const double d = w->double_value();
      return std::memcmp(&v.as<double>(), &d, sizeof d) == 0;
    }
    case wire::ValueKind::String: {
      const auto* s = w->string_value();
      return v.is<std::string>() && v.as<std::string>() == (s ? s->str() : std::string());
    }
    case wire::ValueKind::Bytes: {
      const auto* b = w->bytes_value();
      const std::string want =
          b ? std::string(reinterpret_cast<const char*>(b->data()), b->size()) : std::string();
      return v.is<Bytes>() && v.as<Bytes>().data == want;
    }
    case wire::ValueKind::Array: {
      if (!v.is<Array>()) return false;
      const auto& a = v.as<Array>();
      const auto* items = w->items();
      if (a.size() != (items ? items->size() : 0)) return false;
      for (std::size_t i = 0; i < a.size(); ++i)
        if (!matches(items->Get(static_cast<flatbuffers::uoffset_t>(i)), a[i])) return false;
      return true;
    }
    case wire::ValueKind::Map: {
      if (!v.is<Map>()) return false;
      const auto& m = v.as<Map>();
      const auto* items = w->items();
      const auto* keys = w->keys();
      if (m.size() != (items ? items->size() : 0)) return false;
      for (std::size_t i = 0; i < m.size(); ++i) {
        const auto idx = static_cast<flatbuffers::uoffset_t>(i);
        if (m[i].key != keys->Get(idx)->str() || !matches(items->Get(idx), m[i].value))
          return false;
      }
      return true;
    }
    case wire::ValueKind::UInt:  // tag-value kinds: host_accepts refuses them
    case wire::ValueKind::Float:
    case wire::ValueKind::DateTime:
      return false;
  }
  return false;
}

// decode_value agrees with host_accepts; what it accepts is what the wire said; and the host's
// own encoding of it verifies and decodes back to the same value.
inline void check_decode(const wire::Value* w) {
  Value v;
  const bool ok = detail::decode_value(w, &v);
  FUZZ_CHECK(ok == host_accepts(w));
  if (!ok) return;
  FUZZ_CHECK(matches(w, v));
  flatbuffers::FlatBufferBuilder fbb(256);
  fbb.Finish(detail::encode_value(fbb, v));
  flatbuffers::Verifier::Options opts;
  opts.max_depth = protocol::kVerifierMaxDepth;
  opts.max_tables = protocol::kVerifierMaxTables;
  flatbuffers::Verifier verifier(fbb.GetBufferPointer(), fbb.GetSize(), opts);
  FUZZ_CHECK(verifier.VerifyBuffer<wire::Value>(nullptr));
  const auto* again = flatbuffers::GetRoot<wire::Value>(fbb.GetBufferPointer());
  Value back;
  FUZZ_CHECK(detail::decode_value(again, &back));
  FUZZ_CHECK(same(v, back));
}

}  // namespace outrun::fuzz
