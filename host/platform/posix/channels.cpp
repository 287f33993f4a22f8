// The worker's channels on POSIX (worker_os.h): two socketpairs, blocking I/O with the system
// calls the worker's seccomp filter allows, and the worker's side of its status page.
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <cerrno>
#include <cstring>

#include "outrun/platform/worker_os.h"
#include "outrun/protocol/frame.h"
#include "outrun/protocol/status_page.h"

namespace outrun::platform {

std::string open_worker_channels(WorkerChannels* out) {
  int to_worker[2] = {-1, -1}, from_worker[2] = {-1, -1};
  // Frames to the worker go through one socketpair, results back through another.
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, to_worker) != 0 ||
      socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, from_worker) != 0) {
    const std::string err = std::string("socketpair failed: ") + strerror(errno);
    for (int fd : {to_worker[0], to_worker[1]})
      if (fd >= 0) close(fd);
    return err;
  }
  fcntl(to_worker[0], F_SETFL, fcntl(to_worker[0], F_GETFL) | O_NONBLOCK);
  fcntl(from_worker[0], F_SETFL, fcntl(from_worker[0], F_GETFL) | O_NONBLOCK);
  out->host_write = to_worker[0];
  out->worker_read = to_worker[1];
  out->host_read = from_worker[0];
  out->worker_write = from_worker[1];
  return {};
}

void close_channel(Channel* c) {
  if (*c >= 0) close(*c);
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

std::vector<std::string> worker_channel_args(const WorkerChannels&, const std::string& page_name) {
  return {"--fd", "3", "--out-fd", "4", "--status-page", page_name};
}

bool channel_from_arg(unsigned long long value, Channel* out) {
  if (value > 1024) return false;
  *out = static_cast<int>(value);
  return true;
}

long channel_read(Channel c, void* buf, std::size_t size) {
  for (;;) {
    const ssize_t n = ::read(c, buf, size);
    if (n >= 0) return n;
    if (errno == EINTR) continue;
    return -errno;
  }
}

bool channel_write_all(Channel c, std::span<const uint8_t> data) {
  const uint8_t* p = data.data();
  std::size_t left = data.size();
  while (left > 0) {
    const ssize_t n = ::send(c, p, left, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      left -= static_cast<std::size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      return false;
    }
  }
  return true;
}

// recvfrom is in the confinement filter (poll is not); one syscall that never blocks.
bool channel_input_waiting(Channel c) {
  char byte;
  const ssize_t n = ::recv(c, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  // A frame, the host's close or an error: each is for the read to deal with.
  return !(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
}

std::string channel_error_text(long error) {
  return std::strerror(static_cast<int>(-error));
}

int current_pid() {
  return static_cast<int>(getpid());
}

long read_frames(protocol::FrameReader& reader, Channel c) {
  return reader.read_from(c);
}

std::string map_status_page(const std::string& name,
                            std::unique_ptr<boost::interprocess::mapped_region>* out) {
  namespace bip = boost::interprocess;
  try {
    bip::shared_memory_object shm(bip::open_only, name.c_str(), bip::read_write);
    *out = std::make_unique<bip::mapped_region>(shm, bip::read_write, 0, protocol::kStatusPageSize);
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}

}  // namespace outrun::platform
