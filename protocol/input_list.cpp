#include "outrun/protocol/input_list.h"

#include <flatbuffers/flatbuffers.h>

namespace outrun::protocol {

namespace {

using flatbuffers::Table;
using flatbuffers::Verifier;

enum class Walk : uint8_t { ok, malformed, bad_value, over_budget };

// The generated tables derive from Table privately; the verifier's calls are on Table.
const Table* table_of(const void* t) {
  return reinterpret_cast<const Table*>(t);
}

bool take(std::size_t* budget, std::size_t n) {
  if (n > *budget) {
    *budget = 0;
    return false;
  }
  *budget -= n;
  return true;
}

// One value, as the generated Value::Verify would check it but only the fields its kind uses,
// each container's elements paid for before they are walked (as decode's `fits`).
Walk value(Verifier& v, const wire::Value* x, int depth, std::size_t* budget) {
  if (!take(budget, 16)) return Walk::over_budget;
  if (x == nullptr) return Walk::ok;  // absent: Nil
  const Table* t = table_of(x);
  if (!t->VerifyTableStart(v) || !t->VerifyField<uint8_t>(v, wire::Value::VT_KIND, 1))
    return Walk::malformed;
  bool ok = true;
  switch (x->kind()) {
    case wire::ValueKind::Nil:
      break;
    case wire::ValueKind::Boolean:
      ok = t->VerifyField<uint8_t>(v, wire::Value::VT_BOOL_VALUE, 1);
      break;
    case wire::ValueKind::Int:
      ok = t->VerifyField<int64_t>(v, wire::Value::VT_INT_VALUE, 8);
      break;
    case wire::ValueKind::Double:
      ok = t->VerifyField<double>(v, wire::Value::VT_DOUBLE_VALUE, 8);
      break;
    case wire::ValueKind::String:
      if (!t->VerifyOffset(v, wire::Value::VT_STRING_VALUE) || !v.VerifyString(x->string_value()))
        return Walk::malformed;
      if (x->string_value() && !take(budget, x->string_value()->size())) return Walk::over_budget;
      break;
    case wire::ValueKind::Bytes:
      if (!t->VerifyOffset(v, wire::Value::VT_BYTES_VALUE) || !v.VerifyVector(x->bytes_value()))
        return Walk::malformed;
      if (x->bytes_value() && !take(budget, x->bytes_value()->size())) return Walk::over_budget;
      break;
    case wire::ValueKind::Array: {
      if (depth >= kMaxInputDepth) return Walk::bad_value;
      if (!t->VerifyOffset(v, wire::Value::VT_ITEMS) || !v.VerifyVector(x->items()))
        return Walk::malformed;
      if (const auto* items = x->items()) {
        if (std::size_t{16} * items->size() > *budget) {
          *budget = 0;
          return Walk::over_budget;
        }
        for (flatbuffers::uoffset_t i = 0; i < items->size(); ++i)
          if (const Walk w = value(v, items->Get(i), depth + 1, budget); w != Walk::ok) return w;
      }
      break;
    }
    case wire::ValueKind::Map: {
      if (depth >= kMaxInputDepth) return Walk::bad_value;
      if (!t->VerifyOffset(v, wire::Value::VT_KEYS) || !v.VerifyVector(x->keys()) ||
          !t->VerifyOffset(v, wire::Value::VT_ITEMS) || !v.VerifyVector(x->items()))
        return Walk::malformed;
      const auto* keys = x->keys();
      const auto* items = x->items();
      const flatbuffers::uoffset_t n = keys ? keys->size() : 0;
      if ((items ? items->size() : 0) != n) return Walk::bad_value;
      if (std::size_t{16} * n > *budget) {
        *budget = 0;
        return Walk::over_budget;
      }
      for (flatbuffers::uoffset_t i = 0; i < n; ++i) {
        if (!v.VerifyString(keys->Get(i))) return Walk::malformed;
        if (!take(budget, keys->Get(i)->size())) return Walk::over_budget;
        if (const Walk w = value(v, items->Get(i), depth + 1, budget); w != Walk::ok) return w;
      }
      break;
    }
    default:  // UInt, Float, DateTime: tag values only; or a kind this build does not know
      return Walk::bad_value;
  }
  if (!ok) return Walk::malformed;
  return v.EndTable() ? Walk::ok : Walk::malformed;
}

InputListError error_of(Walk w) {
  switch (w) {
    case Walk::ok:
      return InputListError::none;
    case Walk::malformed:
      return InputListError::malformed;
    case Walk::bad_value:
      return InputListError::bad_value;
    case Walk::over_budget:
      return InputListError::over_budget;
  }
  return InputListError::malformed;
}

}  // namespace

const wire::InputList* check_input_list(const uint8_t* data, std::size_t size, std::size_t* budget,
                                        InputListVerdict* verdict) {
  *verdict = {};
  auto fail = [&](InputListError e) -> const wire::InputList* {
    verdict->error = e;
    return nullptr;
  };
  if (size > kMaxInputListBytes) return fail(InputListError::too_large);
  if (reinterpret_cast<std::uintptr_t>(data) % 8 != 0) return fail(InputListError::misaligned);
  // A root offset and the smallest table (as FLATBUFFERS_MIN_BUFFER_SIZE).
  if (size < 2 * sizeof(flatbuffers::uoffset_t)) return fail(InputListError::malformed);
  Verifier::Options opts;
  opts.max_depth = 2 * kMaxInputDepth + 8;  // the walk's own depth limit comes first
  opts.max_tables = 1u << 30;               // the budget bounds the walk
  opts.check_alignment = true;
  opts.check_nested_flatbuffers = false;
  Verifier v(data, size, opts);
  const flatbuffers::uoffset_t root = v.VerifyOffset(0);
  if (root == 0) return fail(InputListError::malformed);
  const auto* list = reinterpret_cast<const wire::InputList*>(data + root);
  const Table* t = table_of(list);
  if (!t->VerifyTableStart(v) || !t->VerifyOffset(v, wire::InputList::VT_INPUTS) ||
      !v.VerifyVector(list->inputs()))
    return fail(InputListError::malformed);
  if (const auto* inputs = list->inputs()) {
    if (inputs->size() > kMaxInputCount) return fail(InputListError::too_many);
    for (const wire::Input* in : *inputs) {
      const Table* it = table_of(in);
      if (!it->VerifyTableStart(v) || !it->VerifyOffsetRequired(v, wire::Input::VT_NAME) ||
          !v.VerifyString(in->name()) || !it->VerifyOffset(v, wire::Input::VT_VALUE))
        return fail(InputListError::malformed);
      verdict->input = in->name()->string_view();
      Walk w = take(budget, in->name()->size()) ? Walk::ok : Walk::over_budget;
      if (w == Walk::ok) w = value(v, in->value(), 0, budget);
      if (w == Walk::ok && !v.EndTable()) w = Walk::malformed;
      if (w != Walk::ok) return fail(error_of(w));
    }
  }
  verdict->input = {};
  if (!v.EndTable()) return fail(InputListError::malformed);
  return list;
}

}  // namespace outrun::protocol
