// A connection's phase (design/daemon.md "Connection phases"): awaiting its hello, open,
// checking a Register's source, closed. Held in Conn::phase, on the loop thread.
#pragma once

#include <cstdint>

namespace outrun::daemon {

class ConnPhase {
 public:
  enum class State : uint8_t {
    kAwaitingHello,  // accepted; its first frame must be a ClientHello (hello_timeout)
    kOpen,           // said hello: its frames are read and handled
    kChecking,       // a Register with `check` waits for its verdict: not read, frames wait
    kClosed,         // close_conn: its poll handle is closing, its writer closed
  };

  State state() const { return state_; }
  bool awaiting_hello() const { return state_ == State::kAwaitingHello; }
  bool checking() const { return state_ == State::kChecking; }
  bool closed() const { return state_ == State::kClosed; }
  // Its socket may be read and its frames handled (the daemon's lifecycle and its byte budget
  // permitting).
  bool reads() const { return state_ == State::kAwaitingHello || state_ == State::kOpen; }

  // The moves; each false (nothing changes) from any other state.
  bool said_hello() { return move(State::kAwaitingHello, State::kOpen); }
  bool begin_check() { return move(State::kOpen, State::kChecking); }
  bool end_check() { return move(State::kChecking, State::kOpen); }
  // From any state but kClosed: false when it was closed already.
  bool close() {
    if (state_ == State::kClosed) return false;
    state_ = State::kClosed;
    return true;
  }

 private:
  bool move(State from, State to) {
    if (state_ != from) return false;
    state_ = to;
    return true;
  }
  State state_ = State::kAwaitingHello;
};

}  // namespace outrun::daemon
