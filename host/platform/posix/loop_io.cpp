// A worker's channels on the loop, and the host process, on POSIX (worker_os.h): the result
// socket polled for readability and read into the FrameReader, the frame socket polled for room.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "outrun/platform/worker_os.h"
#include "outrun/protocol/frame.h"

namespace outrun::platform {

ResultStream::~ResultStream() {
  if (c_ >= 0) ::close(c_);
}

void ResultStream::open(uv_loop_t* loop, Channel c, protocol::FrameReader* reader, Callback cb) {
  c_ = c;
  reader_ = reader;
  cb_ = cb;
  uv_poll_init(loop, &h_, c);
}

void ResultStream::start() {
  uv_poll_start(&h_, UV_READABLE, &ResultStream::on_poll);
}

void ResultStream::stop() {
  uv_poll_stop(&h_);
}

long ResultStream::read() {
  return reader_->read_from(c_);
}

void ResultStream::on_poll(uv_poll_t* h, int status, int events) {
  auto* s =
      reinterpret_cast<ResultStream*>(reinterpret_cast<char*>(h) - offsetof(ResultStream, h_));
  if (status < 0) {  // libuv reports EPOLLERR (e.g. ECONNRESET) as UV_EBADF
    s->cb_(s, status);
  } else if (events & UV_READABLE) {
    s->cb_(s, 0);
  }
}

void WriteWatch::open(uv_loop_t* loop, Channel c, Callback cb) {
  cb_ = cb;
  uv_poll_init(loop, &h_, c);
}

void WriteWatch::start() {
  uv_poll_start(&h_, UV_WRITABLE, &WriteWatch::on_poll);
}

void WriteWatch::stop() {
  uv_poll_stop(&h_);
}

void WriteWatch::on_poll(uv_poll_t* h, int status, int events) {
  auto* w = reinterpret_cast<WriteWatch*>(reinterpret_cast<char*>(h) - offsetof(WriteWatch, h_));
  if (status < 0) {  // the worker's end is gone
    w->cb_(w, status);
  } else if (events & UV_WRITABLE) {
    w->cb_(w, 0);
  }
}

const char* worker_file_name() {
  return "outrun-worker";
}

std::string executable_path() {
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : self.string();
}

std::string check_executable(const std::string& path) {
  if (access(path.c_str(), X_OK) != 0) return strerror(errno);
  return {};
}

uint64_t resident_bytes(int pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/statm", pid);
  FILE* f = std::fopen(path, "re");
  if (!f) return 0;
  unsigned long long size = 0, resident = 0;
  const int n = std::fscanf(f, "%llu %llu", &size, &resident);
  std::fclose(f);
  return n == 2 ? resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE)) : 0;
}

}  // namespace outrun::platform
