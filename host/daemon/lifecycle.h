// outrund's life as one state (design/daemon.md "Lifecycle"): starting, listening, draining,
// finished, in that order and never back. The Server holds one, on the loop thread.
#pragma once

#include <cstdint>

namespace outrun::daemon {

class Lifecycle {
 public:
  enum class State : uint8_t {
    kStarting,   // the Host, the tags engine and the socket are made; no handle on the loop yet
    kListening,  // start_serving: accepting, reading the clients, admitting evaluations
    kDraining,   // SIGTERM/SIGINT: no accept, no read; what is in flight is answered
    kFinished,   // finish(): every daemon handle closed, the main thread told (served())
  };

  State state() const { return state_; }
  // Moves to `next` when it is later than the current state (a step may be skipped: the fuzz
  // target goes from listening to finished); false, and nothing changes, when it is not: a
  // second SIGTERM while draining, a finish() after finish().
  bool advance(State next) {
    if (next <= state_) return false;
    state_ = next;
    return true;
  }
  // What each state allows (the refusals of the others).
  bool accepting() const { return state_ == State::kListening; }  // accept and read clients
  bool admitting() const { return state_ <= State::kListening; }  // no "outrund is stopping"
  bool finished() const { return state_ == State::kFinished; }

 private:
  State state_ = State::kStarting;
};

}  // namespace outrun::daemon
