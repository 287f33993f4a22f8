// FrameWriter on a worker's frame pipe on Windows (PIPE_NOWAIT, design/windows.md "The Host on
// Windows"): a backlog larger than the pipe is written in chunks as the reader drains it, in
// order, none lost; a closed reader is kClosed. Under Wine a non-blocking pipe write is all or
// nothing, so without the chunks a write larger than the pipe's buffer would never go in.
#include <doctest/doctest.h>
#include <windows.h>

#include <atomic>
#include <thread>
#include <vector>

#include "outrun/platform/worker_os.h"
#include "outrun/protocol/frame_writer.h"

namespace platform = outrun::platform;
using outrun::protocol::FrameWriter;

TEST_CASE("FrameWriter on Windows writes a backlog larger than the pipe in chunks, in order") {
  platform::WorkerChannels ch;
  REQUIRE(platform::open_worker_channels(&ch).empty());
  std::atomic<int> blocked{0};
  FrameWriter w(ch.host_write, [&] { blocked.fetch_add(1); });
  // 2 MB, each byte its offset's low byte: nobody reads yet, so the pipe (256 KB) fills.
  std::vector<uint8_t> data(2u << 20);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 7);
  CHECK(w.write(data) == FrameWriter::State::kHandedOff);
  CHECK(blocked.load() == 1);
  // What fitted went in: chunks, not one write of everything (which would have written nothing).
  CHECK(w.bytes_written() > 0);
  CHECK(w.bytes_written() <= 256u << 10);
  // The reader drains; the loop's flushes finish the backlog.
  std::vector<uint8_t> got;
  std::thread reader([&] {
    std::vector<uint8_t> buf(64 << 10);
    while (got.size() < data.size()) {
      const long n = platform::channel_read(ch.worker_read, buf.data(), buf.size());
      if (n <= 0) break;
      got.insert(got.end(), buf.begin(), buf.begin() + n);
    }
  });
  FrameWriter::Flush f = FrameWriter::Flush::kMore;
  for (int i = 0; i < 100000 && f == FrameWriter::Flush::kMore; ++i) {
    f = w.flush_from_loop();
    if (f == FrameWriter::Flush::kMore) Sleep(1);
  }
  CHECK(f == FrameWriter::Flush::kDone);
  reader.join();
  CHECK(w.bytes_written() == data.size());
  CHECK(got == data);
  // The reader gone: the next write is kClosed, not a hang.
  platform::close_worker_ends(&ch);
  const std::vector<uint8_t> more(100, 1);
  CHECK(w.write(more) == FrameWriter::State::kClosed);
  platform::close_all(&ch);
}
