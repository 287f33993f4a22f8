// The one latency histogram (host/src/latency_histogram.h) of outrund's stats, `outrun drill`,
// `outrun bench` and outrun-perf.
#include "latency_histogram.h"

#include <doctest/doctest.h>

#include <thread>
#include <vector>

using outrun::LatencyHistogram;

TEST_CASE("LatencyHistogram: empty, exact below 128, nearest rank") {
  LatencyHistogram h;
  CHECK(h.count() == 0);
  CHECK(h.quantile(0.5) == 0);
  CHECK(h.max() == 0);
  for (int64_t v = 1; v <= 100; ++v) h.record(v);
  CHECK(h.count() == 100);
  CHECK(h.sum() == 5050);
  CHECK(h.max() == 100);
  CHECK(h.quantile(0) == 1);  // at least the first
  CHECK(h.quantile(0.5) == 50);
  CHECK(h.quantile(0.99) == 99);
  CHECK(h.quantile(0.999) == 100);  // ceil(99.9)
  CHECK(h.quantile(1) == 100);
  h.record(-5);  // a clock that went backwards counts as 0
  CHECK(h.count() == 101);
  CHECK(h.quantile(0) == 0);
}

TEST_CASE("LatencyHistogram: within 0.8 % above, never past the largest value") {
  for (int64_t v :
       {int64_t{128}, int64_t{1000}, int64_t{123456}, int64_t{987654321}, int64_t{1} << 46}) {
    CAPTURE(v);
    const int64_t up = LatencyHistogram::bucket_upper(v);
    CHECK(up >= v);
    CHECK(static_cast<double>(up - v) <= 0.008 * static_cast<double>(v));
    LatencyHistogram h;
    h.record(v);
    CHECK(h.quantile(0.5) == v);  // capped at the max
    h.record(v + 1);
    CHECK(h.quantile(0.5) <= up);
    CHECK(h.quantile(0.5) >= v);
  }
  LatencyHistogram h;
  h.record(int64_t{1} << 60);  // past the range: the last bucket, still the right max
  CHECK(h.count() == 1);
  CHECK(h.max() == int64_t{1} << 60);
  CHECK(h.quantile(0.99) <= h.max());
}

TEST_CASE("LatencyHistogram: threads record at once and nothing is lost") {
  LatencyHistogram h;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&h, t] {
      for (int i = 0; i < 100000; ++i) h.record(1000 * t + i % 1000);
    });
  for (auto& th : threads) th.join();
  CHECK(h.count() == 400000);
  CHECK(h.max() == 3999);
  CHECK(h.quantile(1) == 3999);
}
