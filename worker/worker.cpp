#include "worker.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <lua.hpp>

#include "lua_values.h"
#include "outrun/protocol/messages.h"
#include "outrun/protocol/script_log.h"
#include "wire_values.h"

namespace outrun::worker {

namespace {
// Relaxed counters: the host reads them as statistics, never to decide anything.
void bump(std::atomic<uint64_t>* c) {
  if (c) c->fetch_add(1, std::memory_order_relaxed);
}
// The soft timeout in nanoseconds. timeout_us comes from the host's frame and may be any u64:
// past 2^40 us (12.7 days) it is saturated, so that neither `* 1000` nor the deadline
// (start + timeout) can overflow int64 -- undefined behaviour that in practice put the
// deadline in the past (found with tests/fuzz; tests/protocol/fuzz_regressions_test.cpp).
int64_t timeout_ns(uint64_t timeout_us) {
  constexpr uint64_t kMaxTimeoutUs = uint64_t{1} << 40;
  return static_cast<int64_t>(std::min(timeout_us, kMaxTimeoutUs) * 1000);
}

}  // namespace

Worker::Worker(const WorkerOptions& options) : opts_(options) {
  if (opts_.out_fd == platform::kNoChannel) opts_.out_fd = opts_.fd;
  budget_.limit = opts_.script_budget;
  budget_.reclaim = &Worker::reclaim;
  budget_.reclaim_ctx = this;
  // Headroom: before an evaluation the idle states are brought down to budget - headroom, so
  // the running script can usually reach its own cap without the allocator evicting anything.
  // Half the budget at most, so that a cap near the budget does not evict everything each time.
  const std::size_t headroom = std::min(opts_.memory_limit, opts_.script_budget / 2);
  evict_above_ = opts_.script_budget - headroom;
}

void Worker::touch(Script* s) {
  if (lru_.next == s) return;
  s->unlink();  // a new script links to itself: unlinking it changes nothing
  s->push_front(&lru_);
}

void Worker::drop_script(uint32_t id) {
  std::unique_ptr<Script>& slot = scripts_[id];
  slot->unlink();  // from lru_ or chunks_, whichever holds it
  // Counted in StatusPage::scripts unless evicted (only its bytecode held, charged).
  const bool evicted = !slot->chunk.empty();
  if (evicted) {
    budget_.used -= slot->chunk.capacity();
    chunk_bytes_ -= slot->chunk.capacity();
  }
  slot.reset();  // lua_close: no script code runs (a __gc is refused by setmetatable)
  if (!evicted && opts_.page) opts_.page->scripts.fetch_sub(1, std::memory_order_relaxed);
}

// The bytecode is charged to the budget like the states: a state costs ~12 KB of Lua memory at
// the least, its chunk's bytecode ~1 KB for a 40-line script (about what its function takes in
// the state), so evicting always frees room.
void Worker::evict_state(Script* s, bool defer) {
  bump(opts_.page ? &opts_.page->evictions : nullptr);
  std::string chunk;
  if (s->compile_outcome.status != wire::Status::Ok || !s->state->dump_chunk(&chunk) ||
      chunk.empty()) {
    drop_script(s->id);
    return;
  }
  chunk.shrink_to_fit();
  // Bytecode keeps at most a quarter of the budget, so that it never crowds out the states: the
  // longest evicted go first.
  const std::size_t cap = opts_.script_budget / 4;
  if (chunk.capacity() > cap) {
    drop_script(s->id);
    return;
  }
  while (chunk_bytes_ + chunk.capacity() > cap && chunks_.prev != &chunks_)
    drop_script(static_cast<Script*>(chunks_.prev)->id);
  s->unlink();
  // Deferred, the state's bytes stay charged beside its bytecode's: only while both fit.
  if (defer && budget_.used + chunk.capacity() <= budget_.limit)
    close_later(std::move(s->state));
  else
    s->state.reset();
  if (opts_.page) opts_.page->scripts.fetch_sub(1, std::memory_order_relaxed);
  s->chunk = std::move(chunk);
  budget_.used += s->chunk.capacity();
  chunk_bytes_ += s->chunk.capacity();
  s->push_front(&chunks_);
}

// A state whose close is put off still holds its bytes: closing_bytes_ is what closing_ holds, so
// that `used - closing_bytes_` is what the budget will hold once they are closed. Nothing runs
// in those states any more, so their accounts, and closing_bytes_, stay exact until then.
void Worker::close_later(std::unique_ptr<sandbox::ScriptState> state) {
  closing_bytes_ += state->memory().used;
  closing_.push_back(std::move(state));
}

void Worker::close_one_deferred() {
  closing_bytes_ -= closing_.back()->memory().used;
  closing_.pop_back();  // lua_close: its frees come off budget_.used
}

bool Worker::evict_down_to(std::size_t target, const sandbox::MemoryAccount* keep, bool defer) {
  // Deferred closes count as freed before an evaluation (idle time closes them); the
  // allocator's reclaim needs the bytes now, so it closes them first, for real.
  // Spares count as room before an evaluation too: the allocator's reclaim frees them at once
  // when the evaluation needs their bytes, and freeing them here instead would throw away, before
  // every evaluation of a full budget, the spare idle time just made (and make it again).
  const auto held = [&] { return budget_.used - (defer ? closing_bytes_ + spares_bytes_ : 0); };
  while (!defer && budget_.used > target && !closing_.empty()) close_one_deferred();
  // Then (the allocator's reclaim) the spares: no script loses anything by them.
  while (!defer && held() > target && !spares_.empty()) {
    spares_bytes_ -= spares_.back()->memory().used;
    spares_.pop_back();
  }
  LruLink* l = lru_.prev;
  while (held() > target && l != &lru_) {
    auto* s = static_cast<Script*>(l);
    l = l->prev;
    if (s->state && &s->state->memory() == keep) continue;
    evict_state(s, defer);
  }
  // Then (a script that needs nearly all of the budget) the bytecode of the longest evicted:
  // those scripts answer NeedSource next time.
  while (held() > target && chunks_.prev != &chunks_)
    drop_script(static_cast<Script*>(chunks_.prev)->id);
  return held() <= target;
}

std::unique_ptr<sandbox::ScriptState> Worker::new_state(std::string* err) {
  if (spares_.empty()) return sandbox::ScriptState::create(opts_.memory_limit, err, &budget_);
  std::unique_ptr<sandbox::ScriptState> state = std::move(spares_.back());
  spares_.pop_back();
  spares_bytes_ -= state->memory().used;
  ++spares_taken_;
  return state;
}

// POSIX: recvfrom is in the confinement filter (poll is not); one syscall that never blocks.
bool Worker::input_waiting() const {
  return platform::channel_input_waiting(opts_.fd);
}

// The work an evaluation would otherwise wait for, done while none is waiting: closing the
// states evicted before earlier evaluations, then making spares (a new state costs ~20 us, its
// close ~8 us). One unit at a time, then a look for input, so a frame waits for one unit at most.
// Spares fill room under budget - headroom, and count as room before an evaluation; the
// allocator's reclaim frees them first when an evaluation needs their bytes. Idle time makes room
// for them by evicting small idle states only: in a full budget, the eviction the next
// evaluation would have made, done early, so that the reload it needs takes a ready state.
void Worker::idle() {
  bool changed = false;
  // Nothing to do (the common case once the spares are made): no syscall.
  while ((!closing_.empty() || spares_.size() < kSpareStates) && !input_waiting()) {
    if (!closing_.empty()) {
      close_one_deferred();
    } else if (budget_.used + one_spare_bytes_ > evict_above_) {
      // No room: the least recently used state makes some, when it is no bigger than the
      // spares still wanted (a full budget of small states: the eviction the next evaluation
      // that needs a state would make anyway), and not the most recently used one (the likeliest
      // next). A big idle state is not closed for spares; they wait for room instead.
      LruLink* l = lru_.prev;
      if (l == &lru_ || l == lru_.next) break;
      auto* lru = static_cast<Script*>(l);
      if (lru->state &&
          lru->state->memory().used > (kSpareStates - spares_.size()) * one_spare_bytes_)
        break;
      evict_state(lru, true);  // closed on the next round, after another look for input
    } else {
      std::string err;
      making_spare_ = true;
      std::unique_ptr<sandbox::ScriptState> spare =
          sandbox::ScriptState::create(opts_.memory_limit, &err, &budget_);
      making_spare_ = false;
      if (!spare) break;  // memory_limit below a bare state's size: new scripts fail as well
      one_spare_bytes_ = spare->memory().used;
      spares_bytes_ += one_spare_bytes_;
      spares_.push_back(std::move(spare));
      ++spares_made_;
    }
    changed = true;
  }
  if (changed && opts_.page)
    opts_.page->script_bytes.store(budget_.used, std::memory_order_relaxed);
}

bool Worker::reload(Script* s) {
  std::string err;
  // Unlinked while it is built: the budget's reclaim, which may run meanwhile, cannot drop it.
  s->unlink();
  std::string chunk = std::move(s->chunk);
  s->chunk = {};
  budget_.used -= chunk.capacity();
  chunk_bytes_ -= chunk.capacity();
  s->state = new_state(&err);
  if (s->state) s->compile_outcome = s->state->load_chunk(chunk);
  if (!s->state || s->compile_outcome.status != wire::Status::Ok) {
    // Out of room for it now: as if it had never been sent (the host sends the source again).
    // drop_script counts it off StatusPage::scripts, which evict_state already did.
    s->state.reset();
    s->compile_outcome = {};
    if (opts_.page) bump(&opts_.page->scripts);
    drop_script(s->id);
    return false;
  }
  if (opts_.page) {
    bump(&opts_.page->reloads);
    bump(&opts_.page->scripts);
  }
  return true;
}

// ScriptBudget::reclaim: the allocator of the state being built or run needs `bytes` more.
bool Worker::reclaim(void* self, const sandbox::MemoryAccount* asking, std::size_t bytes) {
  auto* w = static_cast<Worker*>(self);
  // A spare is made into free room only: it never pushes anything out.
  if (w->making_spare_ || bytes > w->budget_.limit) return false;
  return w->evict_down_to(w->budget_.limit - bytes, asking, false);
}

bool send_all(platform::Channel fd, std::span<const uint8_t> data) {
  return platform::channel_write_all(fd, data);
}

bool Worker::write_all(const uint8_t* data, std::size_t size) {
  if (send_all(opts_.out_fd, {data, size})) return true;
  io_failed_ = true;
  return false;
}

bool Worker::send_hello() {
  flatbuffers::FlatBufferBuilder fbb(128);
  const auto hello = protocol::encode_hello(fbb, static_cast<int32_t>(platform::current_pid()));
  return write_all(hello.data(), hello.size());
}

int Worker::run() {
  if (!send_hello()) return exit_code(WorkerExit::kIo);
  for (;;) {
    idle();  // the results are out: what it does next waits for nothing
    const long n = platform::read_frames(reader_, opts_.fd);
    if (n == 0) return exit_code(WorkerExit::kOk);  // the host closed its end
    if (n < 0) {
      spdlog::error("read from host failed: {}", platform::channel_error_text(n));
      return exit_code(WorkerExit::kIo);
    }
    protocol::FrameView fv;
    while (reader_.next(fv)) {
      handle(fv.frame);
      if (io_failed_) return exit_code(WorkerExit::kIo);
    }
    if (reader_.error() != protocol::FrameError::kNone) {
      spdlog::error("protocol violation from host: {}", protocol::to_string(reader_.error()));
      flush();
      return exit_code(WorkerExit::kProtocol);
    }
    if (!flush()) return exit_code(WorkerExit::kIo);
    if (shutdown_) return exit_code(WorkerExit::kOk);
    if (opts_.hooks && opts_.hooks->batch_done) [[unlikely]]
      opts_.hooks->batch_done(*this);
  }
}

void Worker::handle(const wire::Frame* frame) {
  protocol::HostMessage m;
  std::string why;
  // Hello/Results are not for a worker; ignore rather than die (forward compatibility).
  if (!protocol::decode_host_frame(frame, &m, &why)) return;
  switch (frame->body_type()) {
    case wire::Body::Evaluate: {
      const auto* items = std::get<protocol::EvaluateMsg>(m).items;
      if (!items) return;
      for (const wire::Evaluation* e : *items) {
        // One clock read per evaluation serves the batch-hold check, its start time (T counts
        // from it) and the status page. Checking before the next evaluation bounds a frame at
        // kFlushBytes + one result (< kMaxFrameSize); the batch's last results go out below.
        now_ns_ = sandbox::monotonic_ns();
        if (!results_.empty() &&
            (out_.GetSize() > kFlushBytes || now_ns_ - first_result_ns_ > kMaxResultHoldNs))
          flush();
        evaluate(e);
      }
      return;
    }
    case wire::Body::Shutdown:
      shutdown_ = true;
      return;
    case wire::Body::Forget: {
      // The host freed these scripts: drop their states. Ids it does not hold are ignored (a
      // state never compiled here, or one already dropped); any id may come back later with
      // other source, always behind this frame.
      const auto* ids = std::get<protocol::ForgetMsg>(m).script_ids;
      if (!ids) return;
      for (const uint32_t id : *ids)
        if (id < scripts_.size() && scripts_[id]) drop_script(id);
      if (opts_.page) opts_.page->script_bytes.store(budget_.used, std::memory_order_relaxed);
      return;
    }
    default:
      return;
  }
}

Worker::Script* Worker::script_for(const wire::Evaluation* e) {
  const uint32_t id = e->script_id();
  if (id >= kMaxScriptId) return nullptr;
  if (id >= scripts_.size()) scripts_.resize(id + 1);
  protocol::ScriptSource src;
  const bool has_source = protocol::evaluation_source(e, &src);
  if (Script* held = scripts_[id].get();
      held && !held->chunk.empty() &&
      (!has_source || std::memcmp(held->sha256.data(), src.sha256.data(), 32) == 0)) {
    if (reload(held)) return held;
    if (!has_source) return nullptr;  // dropped: NeedSource
  }
  if (has_source) {
    if (scripts_[id] && std::memcmp(scripts_[id]->sha256.data(), src.sha256.data(), 32) == 0)
      return scripts_[id].get();
    if (scripts_[id]) drop_script(id);  // other source: its old state makes room for the new one
    auto s = std::make_unique<Script>();
    s->id = id;
    std::memcpy(s->sha256.data(), src.sha256.data(), 32);
    std::string err;
    // Not linked yet: the budget's reclaim, which may run while it is built, cannot drop it.
    s->state = new_state(&err);
    const bool from_bytecode = !src.bytecode.empty();
    if (!s->state) {
      s->compile_outcome = {wire::Status::MemoryLimit, err};
    } else if (from_bytecode) {
      // The host's compile-only process made it from this source (design/sandbox.md "The
      // compiler"); loaded as binary only. Should it not load, the host sends the source instead.
      s->compile_outcome = s->state->load_chunk(
          {reinterpret_cast<const char*>(src.bytecode.data()), src.bytecode.size()});
      if (s->compile_outcome.status != wire::Status::Ok) return nullptr;  // NeedSource
    } else {
      s->compile_outcome = s->state->compile(src.source, sandbox::chunk_name_for(src.chunk_name));
    }
    if (opts_.page) {
      bump(from_bytecode && s->state ? &opts_.page->bytecode_loads : &opts_.page->compiles);
      bump(&opts_.page->scripts);
    }
    scripts_[id] = std::move(s);
  }
  return scripts_[id].get();
}

void Worker::add_result(uint64_t id, wire::Status status, flatbuffers::Offset<wire::Value> value,
                        std::string_view error) {
  if (results_.empty()) first_result_ns_ = now_ns_;
  protocol::LogLinesOffset logs = 0;
  if (log_.count != 0) [[unlikely]] {
    flatbuffers::Offset<wire::LogLine> lines[protocol::kMaxLogLinesPerEvaluation];
    for (std::size_t i = 0; i < log_.count; ++i)
      lines[i] = wire::CreateLogLine(out_, static_cast<wire::LogLevel>(log_.lines[i].level),
                                     out_.CreateString(log_.lines[i].text));
    logs = out_.CreateVector(lines, log_.count);
  }
  results_.push_back(protocol::build_result(out_, id, status, value, error, logs, log_.dropped));
  log_.reset(0);  // an error answer for another evaluation (hooks) carries none of these
}

std::size_t Worker::log_allowance(Script* s) {
  const double elapsed_s = static_cast<double>(now_ns_ - s->log_refill_ns) * 1e-9;
  s->log_refill_ns = now_ns_;
  s->log_tokens = std::min(kLogBurst, s->log_tokens + elapsed_s * kLogLinesPerSecond);
  return std::min(protocol::kMaxLogLinesPerEvaluation, static_cast<std::size_t>(s->log_tokens));
}

void Worker::mark_running(uint64_t id) {
  if (protocol::StatusPage* page = opts_.page) {
    page->running_since_ns.store(now_ns_, std::memory_order_relaxed);
    page->running_id.store(id, std::memory_order_release);
  }
}

void Worker::evaluate(const wire::Evaluation* e) {
  protocol::StatusPage* page = opts_.page;
  if (const Hooks* h = opts_.hooks) [[unlikely]] {  // one compare in outrun-worker (hooks.h)
    if (h->evaluation && h->evaluation(*this, e)) return;
  }
  Script* s = script_for(e);
  if (!s) {
    add_result(
        e->id(),
        e->script_id() >= kMaxScriptId ? wire::Status::InvalidArgument : wire::Status::NeedSource,
        0, e->script_id() >= kMaxScriptId ? "script id out of range" : "");
    return;
  }
  touch(s);
  if (s->compile_outcome.status != wire::Status::Ok) {
    if (page) {
      bump(&page->evaluations);
      bump(&page->errors);
    }
    add_result(e->id(), s->compile_outcome.status, 0, s->compile_outcome.error);
    return;
  }
  // The budget: idle states give way before the evaluation rather than inside its allocations
  // (their closes wait for idle time; see evict_down_to).
  if (budget_.used - closing_bytes_ - spares_bytes_ > evict_above_) [[unlikely]]
    evict_down_to(evict_above_, &s->state->memory(), true);
  // Inputs come as a nested InputList (protocol 2; outrund passes a client's on as they are)
  // or as `inputs`. The frame's verifier does not look inside a nested one: it is verified and
  // checked here with one evaluation's limits (input_list.h), and one that fails ends the
  // evaluation invalid_argument, as bad inputs do.
  const wire::InputList* list = nullptr;
  if (!protocol::evaluation_input_list(e, &list)) {
    add_result(e->id(), wire::Status::InvalidArgument, 0,
               "inputs_buffer is not a valid InputList within one evaluation's limits");
    return;
  }
  mark_running(e->id());  // T counts from here, for the worker's soft deadline and the host's
  log_.reset(log_allowance(s));
  const auto outcome = s->state->run(sandbox::push_wire_inputs, list ? list->inputs() : e->inputs(),
                                     timeout_ns(e->timeout_us()), now_ns_, &log_);
  s->log_tokens -= static_cast<double>(log_.count);
  if (page) {
    page->running_id.store(0, std::memory_order_release);
    page->evaluations.fetch_add(1, std::memory_order_relaxed);
    page->script_bytes.store(budget_.used, std::memory_order_relaxed);
    const auto& mem = s->state->memory();
    if (mem.peak > page->peak_script_bytes.load(std::memory_order_relaxed))
      page->peak_script_bytes.store(mem.peak, std::memory_order_relaxed);
  }
  if (outcome.status != wire::Status::Ok) {
    if (page) {
      bump(&page->errors);
      if (outcome.status == wire::Status::Timeout) bump(&page->timeouts);
      if (outcome.status == wire::Status::MemoryLimit) bump(&page->memory_limits);
    }
    add_result(e->id(), outcome.status, 0, outcome.error);
    return;
  }
  lua_State* L = s->state->L();
  sandbox::WireValueBuilder builder(out_);
  sandbox::ResultConverter conv(L, builder);
  flatbuffers::Offset<wire::Value> value;
  const bool ok = conv.convert(lua_gettop(L), &value);
  lua_settop(L, 1);
  if (!ok) {
    if (page) bump(&page->errors);
    add_result(e->id(), wire::Status::RuntimeError, 0, conv.error());
    return;
  }
  add_result(e->id(), wire::Status::Ok, value, {});
}

bool Worker::flush() {
  if (results_.empty()) return true;
  const auto frame = protocol::finish_results(out_, results_);
  const bool ok = write_all(frame.data(), frame.size());
  out_.Clear();
  results_.clear();
  return ok;
}

}  // namespace outrun::worker
