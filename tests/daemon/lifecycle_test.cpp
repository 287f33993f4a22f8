// outrund's lifecycle (host/daemon/lifecycle.h) and a connection's phase (conn_phase.h): one
// state each, their moves, and what each state allows. The daemon's moves through it are tested end
// to end in daemon_test.cpp (SIGTERM drains, a second SIGTERM, stopping past the drain deadline).
#include "lifecycle.h"

#include <doctest/doctest.h>

#include "conn_phase.h"

using outrun::daemon::ConnPhase;
using outrun::daemon::Lifecycle;
using State = Lifecycle::State;
using Phase = ConnPhase::State;

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

TEST_CASE("ConnPhase: hello, a Register check and back, closed once") {
  ConnPhase p;
  CHECK(p.awaiting_hello());
  CHECK(p.reads());         // its hello is read
  CHECK(!p.begin_check());  // no Register before the hello
  CHECK(!p.end_check());
  CHECK(p.said_hello());
  CHECK(p.state() == Phase::kOpen);
  CHECK(!p.said_hello());  // a second hello is a violation, not a move
  CHECK(p.reads());
  CHECK(p.begin_check());
  CHECK(p.checking());
  CHECK(!p.reads());  // neither read nor its frames handled until the verdict
  CHECK(!p.begin_check());
  CHECK(p.end_check());
  CHECK(p.state() == Phase::kOpen);
  CHECK(p.reads());
  CHECK(p.close());
  CHECK(p.closed());
  CHECK(!p.reads());
  CHECK(!p.close());  // close_conn once
  CHECK(!p.said_hello());
  CHECK(!p.begin_check());
  CHECK(!p.end_check());  // a verdict after the close changes nothing
  CHECK(p.state() == Phase::kClosed);
}

TEST_CASE("ConnPhase: closed from every phase") {
  ConnPhase before_hello;
  CHECK(before_hello.close());  // no hello in time, refused at its hello
  CHECK(before_hello.closed());
  ConnPhase checking;
  CHECK(checking.said_hello());
  CHECK(checking.begin_check());
  CHECK(checking.close());  // disconnected while its check waited
  CHECK(!checking.checking());
  CHECK(!checking.end_check());
}
