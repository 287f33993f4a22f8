// outrun's latency histogram: outrund's stats (µs, in total and per shard), `outrun drill`'s
// phases and `outrun bench` (ns), and outrun-perf's rows (ns). One type, so that a p99 means the
// same everywhere.
//
// Log-linear (HDR-style): values below 128 have a bucket each; above, every power of two is cut
// into 128 buckets, so a quantile is at most 0.8 % above the value it stands for. Values from 0
// to 2^47 (larger ones count in the last bucket), in whatever unit the caller records. Fixed
// memory (41 KiB), O(1) record, lock-free: any number of threads may record while others read
// (relaxed atomics: a reader sees every count, not one instant).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>

namespace outrun {

class LatencyHistogram {
 public:
  void record(int64_t v) {
    if (v < 0) v = 0;
    counts_[index(static_cast<uint64_t>(v))].fetch_add(1, std::memory_order_relaxed);
    sum_.fetch_add(v, std::memory_order_relaxed);
    int64_t m = max_.load(std::memory_order_relaxed);
    while (v > m && !max_.compare_exchange_weak(m, v, std::memory_order_relaxed)) {
    }
  }

  uint64_t count() const {
    uint64_t n = 0;
    for (const auto& c : counts_) n += c.load(std::memory_order_relaxed);
    return n;
  }
  int64_t max() const { return max_.load(std::memory_order_relaxed); }
  int64_t sum() const { return sum_.load(std::memory_order_relaxed); }

  // The q-quantile, q in [0, 1], by nearest rank: the ceil(q * count)-th smallest value (at least
  // the first), as the upper edge of its bucket capped at the largest value recorded. 0 when
  // empty.
  int64_t quantile(double q) const {
    std::array<uint64_t, kSize> snap;
    uint64_t n = 0;
    for (std::size_t i = 0; i < kSize; ++i)
      n += snap[i] = counts_[i].load(std::memory_order_relaxed);
    if (n == 0) return 0;
    const uint64_t rank =
        std::clamp<uint64_t>(static_cast<uint64_t>(std::ceil(q * static_cast<double>(n))), 1, n);
    uint64_t seen = 0;
    for (std::size_t i = 0; i < kSize; ++i) {
      seen += snap[i];
      if (seen >= rank) return std::min(upper(i), max());
    }
    return max();
  }

  // The largest value that counts in the same bucket as `v` (tests).
  static int64_t bucket_upper(int64_t v) { return upper(index(static_cast<uint64_t>(v))); }

 private:
  static constexpr int kSubBits = 7;
  static constexpr std::size_t kSub = std::size_t{1} << kSubBits;  // buckets per power of two
  static constexpr std::size_t kGroups = 40;                       // powers of two above kSub
  static constexpr std::size_t kSize = kSub + kGroups * kSub;

  static std::size_t index(uint64_t v) {
    if (v < kSub) return static_cast<std::size_t>(v);
    const int shift = static_cast<int>(std::bit_width(v)) - 1 - kSubBits;  // >= 0
    const uint64_t sub = (v >> shift) - kSub;                              // 0 .. kSub - 1
    return std::min(kSub + static_cast<std::size_t>(shift) * kSub + static_cast<std::size_t>(sub),
                    kSize - 1);
  }
  static int64_t upper(std::size_t i) {
    if (i < kSub) return static_cast<int64_t>(i);
    const std::size_t shift = (i - kSub) / kSub;
    const std::size_t sub = (i - kSub) % kSub;
    return static_cast<int64_t>(((kSub + sub + 1) << shift) - 1);
  }

  std::array<std::atomic<uint64_t>, kSize> counts_{};
  std::atomic<int64_t> sum_{0};
  std::atomic<int64_t> max_{0};
};

}  // namespace outrun
