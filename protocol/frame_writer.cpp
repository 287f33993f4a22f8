#include "outrun/protocol/frame_writer.h"

#ifdef _WIN32
#include <windows.h>

#include <algorithm>
#else
#include <sys/socket.h>

#include <cerrno>
#endif

namespace outrun::protocol {

FrameWriter::FrameWriter(Sink fd, std::function<void()> on_blocked)
    : fd_(fd), on_blocked_(std::move(on_blocked)) {}

FrameWriter::State FrameWriter::write(std::span<const uint8_t> frames) {
  {
    MutexLock lock(mu_);
    if (closed_) return State::kClosed;
    pending_.insert(pending_.end(), frames.begin(), frames.end());
    pending_changed();
    if (busy_) return State::kWritten;
    busy_ = true;
  }
  pass_.acquire();  // this thread set busy_
  return run_passes();
}

bool FrameWriter::enqueue(std::span<const uint8_t> frames) {
  MutexLock lock(mu_);
  if (closed_) return false;
  pending_.insert(pending_.end(), frames.begin(), frames.end());
  pending_changed();
  if (busy_) return false;
  busy_ = true;
  return true;
}

FrameWriter::State FrameWriter::write_pending() {
  pass_.acquire();  // enqueue() returned true: this thread set busy_
  return run_passes();
}

FrameWriter::Io FrameWriter::send_inflight() {
  while (offset_ < inflight_.size()) {
#ifdef _WIN32
    const DWORD len = static_cast<DWORD>(std::min(inflight_.size() - offset_, kWinChunk));
    DWORD n = 0;
    const BOOL ok = WriteFile(fd_, inflight_.data() + offset_, len, &n, nullptr);
    syscalls_.fetch_add(1, std::memory_order_relaxed);
    if (!ok) return Io::kClosed;  // ERROR_NO_DATA, ERROR_BROKEN_PIPE: the reader is gone
    if (n == 0) return Io::kAgain;
#else
    const ssize_t n = ::send(fd_, inflight_.data() + offset_, inflight_.size() - offset_,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
    syscalls_.fetch_add(1, std::memory_order_relaxed);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Io::kAgain;
      return Io::kClosed;  // EPIPE, ECONNRESET, EBADF: the peer is gone
    }
#endif
    offset_ += static_cast<std::size_t>(n);
    bytes_written_.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
  }
  return Io::kAll;
}

// Precondition: this thread set busy_. Each pass swaps the queue into inflight_ (keeping both
// buffers' capacity, so steady state allocates nothing) and sends it in one call.
FrameWriter::State FrameWriter::run_passes() {
  for (;;) {
    {
      MutexLock lock(mu_);
      if (closed_) {
        busy_ = false;
        inflight_.clear();
        offset_ = 0;
        pass_.release();
        return State::kClosed;
      }
      if (offset_ >= inflight_.size()) {
        inflight_.clear();
        offset_ = 0;
        if (pending_.empty()) {
          busy_ = false;
          pass_.release();
          return State::kWritten;
        }
        inflight_.swap(pending_);
        pending_changed();
      }
    }
    switch (send_inflight()) {
      case Io::kAll:
        break;
      case Io::kAgain: {
        {
          MutexLock lock(mu_);
          loop_owned_ = true;  // busy_ stays set: producers only append from now on
        }
        pass_.release();  // handed to the loop: flush_from_loop() takes it
        if (on_blocked_) on_blocked_();
        return State::kHandedOff;
      }
      case Io::kClosed: {
        {
          MutexLock lock(mu_);
          closed_ = true;
          busy_ = false;
          pending_.clear();
          pending_changed();
          inflight_.clear();
          offset_ = 0;
        }
        pass_.release();
        if (on_blocked_) on_blocked_();  // the loop must learn that the stream failed
        return State::kClosed;
      }
    }
  }
}

FrameWriter::Flush FrameWriter::flush_from_loop() {
  {
    MutexLock lock(mu_);
    if (closed_) return Flush::kClosed;
    if (!loop_owned_) return Flush::kDone;
  }
  pass_.acquire();  // run_passes() handed it over (loop_owned_ stays set until kDone)
  for (;;) {
    switch (send_inflight()) {
      case Io::kAgain:
        pass_.release();
        return Flush::kMore;
      case Io::kClosed: {
        MutexLock lock(mu_);
        closed_ = true;
        busy_ = loop_owned_ = false;
        pending_.clear();
        pending_changed();
        inflight_.clear();
        offset_ = 0;
        pass_.release();
        return Flush::kClosed;
      }
      case Io::kAll:
        break;
    }
    MutexLock lock(mu_);
    inflight_.clear();
    offset_ = 0;
    if (pending_.empty()) {
      busy_ = loop_owned_ = false;
      pass_.release();
      return Flush::kDone;
    }
    inflight_.swap(pending_);
    pending_changed();
  }
}

std::size_t FrameWriter::queued_bytes() const {
  return pending_bytes_.load(std::memory_order_relaxed);
}

void FrameWriter::close() {
  MutexLock lock(mu_);
  closed_ = true;
  pending_.clear();
  pending_changed();
  if (!busy_) {  // no pass can start while mu_ is held: take it for the clear
    pass_.acquire();
    inflight_.clear();
    offset_ = 0;
    pass_.release();
  }
}

}  // namespace outrun::protocol
