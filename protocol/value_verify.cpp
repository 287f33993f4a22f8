// Verifier::VerifyTable<wire::Value>, declared in outrun_generated.h: the generated
// Value::Verify's checks, with each Value used and each map key checked taken from the thread's
// ValueCheckBudget (frame.h).
#include "outrun/protocol/frame.h"
#include "outrun/protocol/outrun_generated.h"

namespace outrun::protocol {

namespace {
thread_local std::size_t* t_checks = nullptr;
}  // namespace

ValueCheckBudget::ValueCheckBudget(std::size_t checks) : left_(checks), previous_(t_checks) {
  t_checks = &left_;
}

ValueCheckBudget::~ValueCheckBudget() {
  t_checks = previous_;
}

namespace {

bool take(std::size_t n) {
  std::size_t* left = t_checks;
  if (left == nullptr) return true;
  if (*left < n) {
    *left = 0;
    return false;
  }
  *left -= n;
  return true;
}

}  // namespace

}  // namespace outrun::protocol

namespace flatbuffers {

template <>
bool Verifier::VerifyTable<outrun::wire::Value>(const outrun::wire::Value* const table) {
  using outrun::wire::Value;
  if (table == nullptr) return true;
  if (!outrun::protocol::take(1)) return false;
  // The generated tables derive from Table privately; its verifying calls are public on Table.
  const Table* t = reinterpret_cast<const Table*>(table);
  if (!(t->VerifyTableStart(*this) && t->VerifyField<uint8_t>(*this, Value::VT_KIND, 1) &&
        t->VerifyField<uint8_t>(*this, Value::VT_BOOL_VALUE, 1) &&
        t->VerifyField<int64_t>(*this, Value::VT_INT_VALUE, 8) &&
        t->VerifyField<double>(*this, Value::VT_DOUBLE_VALUE, 8) &&
        t->VerifyOffset(*this, Value::VT_STRING_VALUE) && VerifyString(table->string_value()) &&
        t->VerifyOffset(*this, Value::VT_BYTES_VALUE) && VerifyVector(table->bytes_value()) &&
        t->VerifyOffset(*this, Value::VT_ITEMS) && VerifyVector(table->items()) &&
        t->VerifyOffset(*this, Value::VT_KEYS) && VerifyVector(table->keys()) &&
        t->VerifyField<uint64_t>(*this, Value::VT_UINT_VALUE, 8)))
    return false;
  if (const auto* items = table->items())
    for (uoffset_t i = 0; i < items->size(); ++i)
      if (!VerifyTable(items->Get(i))) return false;
  if (const auto* keys = table->keys()) {
    if (!outrun::protocol::take(keys->size())) return false;
    for (uoffset_t i = 0; i < keys->size(); ++i)
      if (!VerifyString(keys->Get(i))) return false;
  }
  return EndTable();
}

}  // namespace flatbuffers
