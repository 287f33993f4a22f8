#include "status_codes.h"

#include <algorithm>
#include <array>
#include <iterator>

namespace outrun::status_codes {

namespace {

constexpr Entry kInCsvOrder[] = {
#define OUTRUN_STATUS_CODE(name, code) {code, #name},
#include "status_codes.inc"
#undef OUTRUN_STATUS_CODE
};
constexpr std::size_t kCount = std::size(kInCsvOrder);

constexpr bool name_less(const Entry& a, const Entry& b) {
  return a.name < b.name;
}
constexpr bool code_less(const Entry& a, const Entry& b) {
  return a.code != b.code ? a.code < b.code : a.name < b.name;
}

// Sorted at compile time: the generated file keeps the CSV's order.
template <class Less>
constexpr std::array<Entry, kCount> sorted(Less less) {
  std::array<Entry, kCount> a{};
  std::copy(std::begin(kInCsvOrder), std::end(kInCsvOrder), a.begin());
  std::sort(a.begin(), a.end(), less);
  return a;
}

constexpr std::array<Entry, kCount> kByName = sorted(name_less);
constexpr std::array<Entry, kCount> kByCode = sorted(code_less);

constexpr bool names_unique() {
  for (std::size_t i = 1; i < kCount; ++i)
    if (kByName[i - 1].name == kByName[i].name) return false;
  return true;
}
static_assert(names_unique(), "a StatusCode name is listed twice");
static_assert(kCount > 250, "the whole published list");

}  // namespace

std::span<const Entry> by_name() {
  return kByName;
}

const Entry* find(std::string_view name) {
  const auto it = std::lower_bound(kByName.begin(), kByName.end(), name,
                                   [](const Entry& e, std::string_view n) { return e.name < n; });
  return it != kByName.end() && it->name == name ? &*it : nullptr;
}

const Entry* find(uint32_t code) {
  const auto it = std::lower_bound(kByCode.begin(), kByCode.end(), code,
                                   [](const Entry& e, uint32_t c) { return e.code < c; });
  return it != kByCode.end() && it->code == code ? &*it : nullptr;
}

}  // namespace outrun::status_codes
