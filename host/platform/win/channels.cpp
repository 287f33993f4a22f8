// The worker's channels on Windows (worker_os.h): two named pipes, one per direction. The host
// creates each pipe (one instance, local clients only) and opens its client end itself at once,
// so no other process can connect to it; the client ends are the worker's, inherited through
// STARTUPINFOEX's handle list only, their values given on its command line
// (design/windows.md "Channels"). The host's reading end is overlapped (the loop's IOCP), its
// writing end non-blocking (PIPE_NOWAIT); the worker's are neither: it blocks in ReadFile as it
// blocks in read() on POSIX.
#include <windows.h>

#include <atomic>
#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/windows_shared_memory.hpp>
#include <random>

#include "outrun/platform/worker_os.h"
#include "outrun/protocol/frame.h"
#include "outrun/protocol/frame_writer.h"
#include "outrun/protocol/status_page.h"
#include "win_pipes.h"

namespace outrun::platform {

namespace {

constexpr DWORD kPipeBuffer = 256 * 1024;  // as a Linux stream socket's ~200 KB

std::string pipe_name() {
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return "\\\\.\\pipe\\outrun-" + std::to_string(GetCurrentProcessId()) + "-" +
         std::to_string(counter.fetch_add(1)) + "-" + std::to_string(rng() & 0xffffffff);
}

}  // namespace

namespace win {

std::string win_error(const std::string& what, DWORD err) {
  return what + ": " + channel_error_text(-static_cast<long>(err));
}

// The host's reading end is overlapped (libuv reads it on the loop's IOCP); its writing end is
// synchronous in non-blocking mode (PIPE_NOWAIT): FrameWriter's WriteFile, on producer threads
// and the loop, returns at once whether or not the pipe had room (design/windows.md).
std::string make_pipe(bool host_reads, HANDLE* host, HANDLE* worker) {
  const std::string name = pipe_name();
  const DWORD mode =
      (host_reads ? PIPE_ACCESS_INBOUND | FILE_FLAG_OVERLAPPED : PIPE_ACCESS_OUTBOUND) |
      FILE_FLAG_FIRST_PIPE_INSTANCE;
  HANDLE h =
      CreateNamedPipeA(name.c_str(), mode,
                       PIPE_TYPE_BYTE | PIPE_READMODE_BYTE |
                           (host_reads ? PIPE_WAIT : PIPE_NOWAIT) | PIPE_REJECT_REMOTE_CLIENTS,
                       1, kPipeBuffer, kPipeBuffer, 0, nullptr);
  if (h == INVALID_HANDLE_VALUE) return win_error("CreateNamedPipe");
  SECURITY_ATTRIBUTES inherit{sizeof inherit, nullptr, TRUE};  // only through the handle list
  // The worker's end reads (or peeks) or writes; FILE_READ_ATTRIBUTES lets it ask what it is.
  HANDLE c =
      CreateFileA(name.c_str(), host_reads ? (GENERIC_WRITE | FILE_READ_ATTRIBUTES) : GENERIC_READ,
                  0, &inherit, OPEN_EXISTING, 0, nullptr);
  if (c == INVALID_HANDLE_VALUE) {
    const std::string err = win_error("opening the pipe's client end");
    CloseHandle(h);
    return err;
  }
  *host = h;
  *worker = c;
  return {};
}

}  // namespace win

std::string open_worker_channels(WorkerChannels* out) {
  WorkerChannels c;
  std::string err = win::make_pipe(false, &c.host_write, &c.worker_read);
  if (err.empty()) err = win::make_pipe(true, &c.host_read, &c.worker_write);
  if (!err.empty()) {
    close_all(&c);
    return err;
  }
  *out = c;
  return {};
}

void close_channel(Channel* c) {
  if (*c) CloseHandle(*c);
  *c = kNoChannel;
}

void close_worker_ends(WorkerChannels* c) {
  close_channel(&c->worker_read);
  close_channel(&c->worker_write);
}

void close_all(WorkerChannels* c) {
  close_channel(&c->host_write);
  close_channel(&c->host_read);
  close_worker_ends(c);
}

std::vector<std::string> worker_channel_args(const WorkerChannels& c,
                                             const std::string& page_name) {
  auto value = [](Channel h) { return std::to_string(reinterpret_cast<uintptr_t>(h)); };
  return {"--fd",   value(c.worker_read), "--out-fd", value(c.worker_write), "--status-page",
          page_name};
}

bool channel_from_arg(unsigned long long value, Channel* out) {
  auto h = reinterpret_cast<HANDLE>(static_cast<uintptr_t>(value));
  // An inherited pipe handle, or nothing this worker may use.
  if (value == 0 || GetFileType(h) != FILE_TYPE_PIPE) return false;
  *out = h;
  return true;
}

namespace {

// One ReadFile or WriteFile, waited for: an overlapped end (the host's) completes later; the
// worker's, synchronous, completes in the call.
long transfer(Channel c, void* buf, std::size_t size, bool write) {
  thread_local HANDLE event = CreateEventA(nullptr, TRUE, FALSE, nullptr);
  OVERLAPPED ov{};
  ov.hEvent = event;
  ResetEvent(event);
  const DWORD len = static_cast<DWORD>(std::min<std::size_t>(size, 1u << 30));
  DWORD done = 0;
  const BOOL ok = write ? WriteFile(c, buf, len, &done, &ov) : ReadFile(c, buf, len, &done, &ov);
  if (!ok) {
    const DWORD err = GetLastError();
    if (err != ERROR_IO_PENDING) return -static_cast<long>(err);
    if (!GetOverlappedResult(c, &ov, &done, TRUE)) return -static_cast<long>(GetLastError());
  }
  return static_cast<long>(done);
}

bool ended(long err) {
  return err == -static_cast<long>(ERROR_BROKEN_PIPE) ||
         err == -static_cast<long>(ERROR_PIPE_NOT_CONNECTED) ||
         err == -static_cast<long>(ERROR_NO_DATA);
}

}  // namespace

long channel_read(Channel c, void* buf, std::size_t size) {
  for (;;) {
    const long n = transfer(c, buf, size, false);
    if (n > 0) return n;
    if (n == 0) continue;  // a zero-byte message: not the end (the writer's close is)
    return ended(n) ? 0 : n;
  }
}

bool channel_write_all(Channel c, std::span<const uint8_t> data) {
  std::size_t off = 0;
  while (off < data.size()) {
    // At most FrameWriter's chunk: the host's end does not block (PIPE_NOWAIT) and, under Wine,
    // writes all or nothing; 0 written is a full pipe.
    const long n = transfer(c, const_cast<uint8_t*>(data.data() + off),
                            std::min(data.size() - off, protocol::FrameWriter::kWinChunk), true);
    if (n < 0) return false;
    if (n == 0) {
      Sleep(1);
      continue;
    }
    off += static_cast<std::size_t>(n);
  }
  return true;
}

bool channel_input_waiting(Channel c) {
  DWORD avail = 0;
  // Bytes, or the host's close or an error (the peek fails): each is for the read to deal with.
  if (!PeekNamedPipe(c, nullptr, 0, nullptr, &avail, nullptr)) return true;
  return avail > 0;
}

std::string channel_error_text(long error) {
  const DWORD code = static_cast<DWORD>(-error);
  char buf[256];
  DWORD n = FormatMessageA(FORMAT_MESSAGE_FROM_SYSTEM | FORMAT_MESSAGE_IGNORE_INSERTS, nullptr,
                           code, 0, buf, sizeof buf, nullptr);
  while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == '.')) --n;
  std::string text(buf, n);
  return (text.empty() ? "error" : text) + " (Windows error " + std::to_string(code) + ")";
}

int current_pid() {
  return static_cast<int>(GetCurrentProcessId());
}

long read_frames(protocol::FrameReader& reader, Channel c) {
  const std::span<uint8_t> space = reader.read_space();
  const long n = channel_read(c, space.data(), space.size());
  if (n > 0) reader.commit(static_cast<std::size_t>(n));
  return n;
}

std::string map_status_page(const std::string& name,
                            std::unique_ptr<boost::interprocess::mapped_region>* out) {
  namespace bip = boost::interprocess;
  try {
    // The view keeps the section; the handle (and, once the host forgets it, the name) goes.
    bip::windows_shared_memory shm(bip::open_only, name.c_str(), bip::read_write);
    *out = std::make_unique<bip::mapped_region>(shm, bip::read_write, 0, protocol::kStatusPageSize);
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}

}  // namespace outrun::platform
