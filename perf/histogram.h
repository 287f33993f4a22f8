// Log-linear latency histogram (HDR-style): fixed memory, ~0.8 % relative precision, O(1)
// record, from 1 ns to ~2^40 ns. Not thread-safe: one per recording thread, then merge().
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>

namespace outrun::perf {

class Histogram {
 public:
  static constexpr int kSubBits = 7;  // 128 sub-buckets per power of two
  static constexpr int kSub = 1 << kSubBits;
  static constexpr int kGroups = 40;

  void record(int64_t ns) {
    if (ns < 0) ns = 0;
    ++counts_[index(static_cast<uint64_t>(ns))];
    ++total_;
    max_ = std::max(max_, ns);
  }
  void merge(const Histogram& o) {
    for (std::size_t i = 0; i < counts_.size(); ++i) counts_[i] += o.counts_[i];
    total_ += o.total_;
    max_ = std::max(max_, o.max_);
  }
  uint64_t count() const { return total_; }
  int64_t max() const { return max_; }

  // Value at quantile q in [0, 1] (upper edge of its bucket, capped at the max seen).
  int64_t quantile(double q) const {
    if (total_ == 0) return 0;
    const uint64_t rank =
        std::max<uint64_t>(1, static_cast<uint64_t>(q * static_cast<double>(total_) + 0.5));
    uint64_t seen = 0;
    for (std::size_t i = 0; i < counts_.size(); ++i) {
      seen += counts_[i];
      if (seen >= rank) return std::min<int64_t>(upper(i), max_);
    }
    return max_;
  }

 private:
  static std::size_t index(uint64_t v) {
    if (v < kSub) return static_cast<std::size_t>(v);
    const int shift = std::bit_width(v) - 1 - kSubBits;  // >= 0
    const uint64_t sub = (v >> shift) - kSub;            // 0..kSub-1
    const std::size_t i = static_cast<std::size_t>(kSub + shift * kSub + static_cast<int>(sub));
    return std::min(i, kSize - 1);
  }
  static int64_t upper(std::size_t i) {
    if (i < kSub) return static_cast<int64_t>(i);
    const std::size_t shift = (i - kSub) / kSub;
    const std::size_t sub = (i - kSub) % kSub;
    return static_cast<int64_t>(((kSub + sub + 1) << shift) - 1);
  }
  static constexpr std::size_t kSize = kSub + kGroups * kSub;
  std::array<uint64_t, kSize> counts_{};
  uint64_t total_ = 0;
  int64_t max_ = 0;
};

}  // namespace outrun::perf
