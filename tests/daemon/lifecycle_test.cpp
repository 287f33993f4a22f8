// outrund's lifecycle (host/daemon/lifecycle.h): one state, forward only, and what each state
// allows. The daemon's moves through it are tested end to end in daemon_test.cpp (SIGTERM drains,
// a second SIGTERM, stopping past the drain deadline).
#include "lifecycle.h"

#include <doctest/doctest.h>

using outrun::daemon::Lifecycle;
using State = Lifecycle::State;

TEST_CASE("Lifecycle: starting, listening, draining, finished, forward only") {
  Lifecycle l;
  CHECK(l.state() == State::kStarting);
  CHECK(!l.accepting());
  CHECK(l.admitting());  // nothing reaches it before listening
  CHECK(l.advance(State::kListening));
  CHECK(l.accepting());
  CHECK(l.admitting());
  CHECK(!l.advance(State::kListening));  // no move to where it is
  CHECK(l.advance(State::kDraining));
  CHECK(!l.accepting());
  CHECK(!l.admitting());  // evaluations are refused "outrund is stopping"
  CHECK(!l.finished());
  CHECK(!l.advance(State::kDraining));   // a second SIGTERM while draining
  CHECK(!l.advance(State::kListening));  // never back
  CHECK(l.state() == State::kDraining);
  CHECK(l.advance(State::kFinished));
  CHECK(l.finished());
  CHECK(!l.admitting());
  CHECK(!l.advance(State::kFinished));  // finish() once
  CHECK(!l.advance(State::kDraining));  // a SIGTERM after the drain
  CHECK(l.state() == State::kFinished);
}

TEST_CASE("Lifecycle: a step may be skipped, as the fuzz target stops without a drain") {
  Lifecycle l;
  CHECK(l.advance(State::kListening));
  CHECK(l.advance(State::kFinished));
  CHECK(!l.accepting());
  CHECK(!l.advance(State::kDraining));
}
