// The virtual-tag engine (design/tags.md): a dependency graph of tags over source tags, waves of
// source updates evaluated glitch-free in topological order per connected component, OPC UA
// status rules, per-tag state, hot reload.
//
// Threading: one mutex guards everything. Evaluations are submitted to the runner and change
// batches are delivered outside it (a runner may complete inline, InProcess does). Submissions
// made while this thread is already submitting are queued and run by the outermost loop, so an
// InProcess chain of tags does not recurse.
#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <queue>
#include <set>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "log_ring.h"
#include "outrun/tags.h"
#include "outrun/thread_annotations.h"
#include "prelude.h"

namespace outrun::tags {

namespace {

using Clock = std::chrono::steady_clock;

DateTime system_now() {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  return DateTime::from_unix_micros(us);
}

bool is_number(const Value& v) {
  return v.is<int64_t>() || v.is<double>() || v.is<uint64_t>() || v.is<float>();
}
double number_of(const Value& v) {
  if (auto* i = std::get_if<int64_t>(&v.v)) return static_cast<double>(*i);
  if (auto* d = std::get_if<double>(&v.v)) return *d;
  if (auto* u = std::get_if<uint64_t>(&v.v)) return static_cast<double>(*u);
  if (auto* f = std::get_if<float>(&v.v)) return static_cast<double>(*f);
  return 0;
}

// Rough encoded size of a value, for the kept-state bound.
std::size_t value_bytes(const Value& v) {
  std::size_t n = 16;
  if (auto* s = std::get_if<std::string>(&v.v))
    n += s->size();
  else if (auto* b = std::get_if<Bytes>(&v.v))
    n += b->data.size();
  else if (auto* a = std::get_if<Array>(&v.v))
    for (const auto& x : *a) n += value_bytes(x);
  else if (auto* m = std::get_if<Map>(&v.v))
    for (const auto& e : *m) n += e.key.size() + value_bytes(e.value);
  return n;
}

// The uid charged for the sources a definition made (not a writer's).
constexpr uint32_t kDefinitionsUid = 0xFFFFFFFFu;
// Compile checks of one apply in flight at once: a large definition does not put thousands of
// evaluations in front of everyone else's in the workers' queues.
constexpr std::size_t kMaxChecksInFlight = 64;

const Value* map_get(const Value& m, std::string_view key) {
  if (auto* map = std::get_if<Map>(&m.v))
    for (const auto& e : *map)
      if (e.key == key) return &e.value;
  return nullptr;
}

// The wrapper's own result form (prelude.h): a map whose keys start with NUL.
bool wrapped(const Value& r) {
  auto* m = std::get_if<Map>(&r.v);
  return m != nullptr && !m->empty() && !m->front().key.empty() && m->front().key[0] == '\0';
}
const Value* field(const Value& r, std::string_view key) {
  return wrapped(r) ? map_get(r, key) : nullptr;
}

using namespace std::string_view_literals;

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

struct Dispatch {
  Runner* runner;
  Script script;
  Inputs inputs;
  Callback done;
};

// The outermost submitting loop of this thread, if any (see the file comment).
thread_local std::vector<Dispatch>* tl_dispatch_queue = nullptr;

void run_dispatches(std::vector<Dispatch>&& ds) {
  if (ds.empty()) return;
  if (tl_dispatch_queue != nullptr) {
    for (auto& d : ds) tl_dispatch_queue->push_back(std::move(d));
    return;
  }
  std::vector<Dispatch> q = std::move(ds);
  tl_dispatch_queue = &q;
  for (std::size_t i = 0; i < q.size(); ++i) {
    Dispatch d = std::move(q[i]);  // q may grow (and move) while this one runs
    d.runner->evaluate(d.script, std::move(d.inputs), std::move(d.done));
  }
  tl_dispatch_queue = nullptr;
}

// A numeric change beyond the input's deadband; entering or leaving NaN always passes.
bool numeric_changed(const InputSpec& spec, double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) != std::isnan(b);
  double limit = spec.deadband_value;
  if (spec.deadband == DeadbandKind::percent) {
    const double range = spec.range_high - spec.range_low;
    limit = spec.deadband_value / 100.0 * (range != 0 ? std::fabs(range) : std::fabs(a));
  }
  return std::fabs(b - a) > limit;
}

// Whether an input's value moved from `a` to `b` as far as its deadband is concerned: without a
// deadband any difference (NaN equals NaN); numbers beyond the deadband; arrays element by
// element, a change of length always counting (OPC 10000-8 6.2).
bool value_changed(const InputSpec& spec, const Value& a, const Value& b) {
  if (spec.deadband == DeadbandKind::none) return !same_value(a, b);
  if (is_number(a) && is_number(b)) return numeric_changed(spec, number_of(a), number_of(b));
  const auto* x = std::get_if<Array>(&a.v);
  const auto* y = std::get_if<Array>(&b.v);
  if (x == nullptr || y == nullptr) return !same_value(a, b);
  if (x->size() != y->size()) return true;
  for (std::size_t i = 0; i < x->size(); ++i) {
    const Value& p = (*x)[i];
    const Value& q = (*y)[i];
    if (is_number(p) && is_number(q) ? numeric_changed(spec, number_of(p), number_of(q))
                                     : !same_value(p, q))
      return true;
  }
  return false;
}

// The code of a StatusCode (severity and sub-code), without its structure and info bits.
StatusCode code_only(StatusCode c) {
  return c & 0xFFFF0000u;
}

}  // namespace

bool same_value(const Value& a, const Value& b) {
  if (a.v.index() != b.v.index()) return false;
  if (auto* d = std::get_if<double>(&a.v)) {
    const double e = std::get<double>(b.v);
    return *d == e || (std::isnan(*d) && std::isnan(e));
  }
  if (auto* f = std::get_if<float>(&a.v)) {
    const float g = std::get<float>(b.v);
    return *f == g || (std::isnan(*f) && std::isnan(g));
  }
  if (auto* x = std::get_if<Array>(&a.v)) {  // nesting is bounded (kMaxValueDepth)
    const Array& y = std::get<Array>(b.v);
    if (x->size() != y.size()) return false;
    for (std::size_t i = 0; i < x->size(); ++i)
      if (!same_value((*x)[i], y[i])) return false;
    return true;
  }
  if (auto* m = std::get_if<Map>(&a.v)) {
    const Map& n = std::get<Map>(b.v);
    if (m->size() != n.size()) return false;
    for (std::size_t i = 0; i < m->size(); ++i)
      if ((*m)[i].key != n[i].key || !same_value((*m)[i].value, n[i].value)) return false;
    return true;
  }
  return a == b;
}

std::size_t value_size(const Value& v) {
  return value_bytes(v);
}

bool DataValue::same_as(const DataValue& o) const {
  return status == o.status && source_time == o.source_time && same_value(value, o.value);
}

bool same_definition(const TagDefinition& a, const TagDefinition& b) {
  return a.id == b.id && a.script == b.script && a.inputs == b.inputs && a.type == b.type &&
         a.trigger == b.trigger && a.timestamps == b.timestamps && a.keep_state == b.keep_state &&
         a.reset_state == b.reset_state && a.max_state_bytes == b.max_state_bytes &&
         a.last_usable == b.last_usable && a.evaluate_bad_inputs == b.evaluate_bad_inputs &&
         a.every_update == b.every_update && a.config_error == b.config_error;
}

// A source tag or a virtual tag.
struct Node {
  std::string id;
  bool is_virtual = false;
  bool alive = true;
  uint32_t generation = 0;  // bumped when the slot is reused
  uint32_t self = 0;        // its index
  DataValue value;
  std::vector<uint32_t> dependents;  // virtual tags that list this node as an input
  int component = -1;                // -1: nothing depends on it (a source) / set for tags

  // Source: an update waiting for its component's running wave to end, and (when a dependent
  // asks for every_update) the ones after it, oldest first.
  bool has_pending = false;
  DataValue pending;
  bool queue_updates = false;  // a dependent has every_update (set by rebuild)
  std::deque<DataValue> queue;
  std::size_t queue_bytes = 0;  // value_size of the queue's values
  // Bounds (design/tags.md "Bounds"): the writer that created it (0: none), its uid, whether a
  // definition made it (then it goes when no tag uses it any more), the uid charged with what it
  // holds (its last writer) and how much.
  uint64_t owner = 0;
  uint32_t owner_uid = 0;
  bool from_definition = false;
  uint32_t charged_uid = kDefinitionsUid;
  std::size_t charged = 0;

  // Virtual tag.
  TagDefinition def;
  // A definition that could not be installed (design/tags.md "Broken definitions"): no script,
  // no inputs in the graph, status BadConfigurationError with this reason.
  bool broken = false;
  std::string broken_reason;
  ErrorCode broken_code = ErrorCode::invalid_argument;
  bool broken_compile = false;  // its script did not compile (found by the check, not the file)
  uint64_t version = 0;
  std::string key;
  Script script;
  std::vector<uint32_t> input_nodes;  // parallel to def.inputs
  std::vector<DataValue> used;        // the inputs' values at the last evaluation
  std::vector<bool> used_set;
  int topo = 0;
  TagCounters counters;
  // Its script's recent log lines (Engine::logs), made at its first line.
  std::unique_ptr<outrun::detail::LogRing> logs;
  bool evaluated = false;  // at least one evaluation completed
  // Whether the script's source mentions status, source_time, prev: only then are they sent.
  bool uses_status = true, uses_times = true, uses_prev = true;
  DateTime last_eval_time;  // evaluation time of the last completed evaluation
  uint64_t completed = 0;   // evaluations completed (not counting a worker that was down)
  uint64_t results = 0;     // results received, of any status
  bool have_last_good = false;
  DataValue last_good;
  bool down = false;
  DateTime down_since;
  bool need_initial = false;    // evaluate in the next wave (new or redefined)
  bool awaiting_input = false;  // new, with no input value yet: the first one triggers it
  bool pending_root = false;    // a root of the component's next wave
  bool kept_state_present = false;
  Value kept_state;
  Value import_state;  // a state to start the next evaluation from (hot reload)
  bool has_import = false;
  // The state store (TagsOptions::state_sink): the kept state changed since it was last told,
  // the script's hex SHA-256 it is told with, and what the restore at definition said.
  bool state_dirty = false;
  std::string script_sha;
  std::string state_note;
  // Periodic.
  DateTime next_due;
  bool due_set = false;
  uint64_t timer_seq = 0;  // the periodic timer that is current; older ones are dropped
  // Updates of an input were merged or dropped since the last published value: the next one
  // carries the Overflow bit.
  bool overflow_pending = false;
  // Per wave.
  uint64_t wave = 0;    // the wave whose per-wave fields below are current
  uint64_t listed = 0;  // the wave this tag is part of
  int wait = 0;         // virtual inputs of this wave not finished yet
  bool triggered = false;
  bool trig_time_set = false;
  DateTime trig_time;
  bool in_flight = false;
  Clock::time_point submitted;
  DateTime eval_time;  // of the evaluation in flight
};

struct Component {
  bool running = false;
  bool pending = false;  // sources or roots wait for the next wave
  uint64_t wave = 0;
  DateTime pending_time;
  DateTime time;              // the running wave's evaluation time
  Clock::time_point started;  // of the running wave
  std::size_t remaining = 0;  // tags of the running wave not finished
  std::vector<uint32_t> pending_sources;
  std::vector<uint32_t> pending_roots;
  std::vector<uint32_t> wave_tags;  // scratch
  std::vector<Change> changes;
  std::vector<int> change_topo;  // parallel to changes
};

struct Engine::Impl {
  Impl(Runner& r, TagsOptions o) : runner(r), opts(std::move(o)) {
    log_budget.limit = opts.max_log_bytes;
  }

  Runner& runner;
  TagsOptions opts;

  // Guards everything below (the nodes and components they point to with it) but the timer
  // thread's handle and apply_mu.
  mutable Mutex mu;
  CondVar cv;  // waves ending, evaluations completing, deliveries
  // The timer thread's own (a new timer, closing): on `cv` it woke at every evaluation's end
  // and wave's end for nothing, 33k times a second at 10k updates/s.
  CondVar timer_cv;
  // What the tags' log rings hold together (TagsOptions::max_log_bytes); outlives the nodes.
  outrun::detail::LogBudget log_budget;
  std::vector<std::unique_ptr<Node>> nodes GUARDED_BY(mu);
  std::vector<uint32_t> free_nodes GUARDED_BY(mu);
  std::unordered_map<std::string, uint32_t, StringHash, std::equal_to<>> by_id GUARDED_BY(mu);
  std::vector<uint32_t> topo_order GUARDED_BY(mu);  // virtual tags
  std::vector<Component> comps GUARDED_BY(mu);
  std::size_t sources GUARDED_BY(mu) = 0;
  std::size_t source_bytes GUARDED_BY(mu) = 0;  // what the sources hold (charged)
  std::unordered_map<uint32_t, SourceUsage> usage GUARDED_BY(mu);  // by uid
  // Tags ready to be processed and components ready for their next wave: one loop works them off
  // (drain), so a chain of any length costs no stack (finish -> process -> finish ...).
  std::deque<uint32_t> ready_tags GUARDED_BY(mu);
  std::vector<int> ready_comps GUARDED_BY(mu);
  bool draining GUARDED_BY(mu) = false;
  uint64_t next_wave GUARDED_BY(mu) = 1;
  int paused GUARDED_BY(mu) = 0;
  std::size_t in_flight GUARDED_BY(mu) = 0;
  bool closing GUARDED_BY(mu) = false;
  EngineCounters counters GUARDED_BY(mu);
  DateTime manual_clock GUARDED_BY(mu);
  bool manual_clock_set GUARDED_BY(mu) = false;
  mutable DateTime last_now GUARDED_BY(mu);  // now() never goes back

  // Deliveries: in wave order, one at a time.
  std::deque<std::vector<Change>> deliveries GUARDED_BY(mu);
  bool delivering GUARDED_BY(mu) = false;

  // Timers: retries, and periodic tags in real time.
  struct Timer {
    Clock::time_point at;
    uint32_t node;
    uint32_t generation;
    bool periodic;
    uint64_t seq;  // periodic: the node's timer_seq when armed
    bool operator>(const Timer& o) const { return at > o.at; }
  };
  std::priority_queue<Timer, std::vector<Timer>, std::greater<Timer>> timers GUARDED_BY(mu);
  std::thread timer_thread;

  // Rows of the state store not claimed yet by a definition (TagsOptions::restored), by id.
  std::unordered_map<std::string, RestoredTag, StringHash, std::equal_to<>> restored GUARDED_BY(mu);

  Mutex apply_mu;  // one apply/remove at a time; taken before mu

  DateTime now() const REQUIRES(mu) {
    if (manual_clock_set) return manual_clock;
    const DateTime t = opts.clock ? opts.clock() : system_now();
    if (t > last_now) last_now = t;
    return last_now;
  }

  Node* find(std::string_view id) const REQUIRES(mu) {
    auto it = by_id.find(id);
    return it == by_id.end() ? nullptr : nodes[it->second].get();
  }

  uint32_t new_node(const std::string& id) REQUIRES(mu) {
    uint32_t idx;
    if (!free_nodes.empty()) {
      idx = free_nodes.back();
      free_nodes.pop_back();
      const uint32_t gen = nodes[idx]->generation + 1;
      nodes[idx] = std::make_unique<Node>();
      nodes[idx]->generation = gen;
    } else {
      idx = static_cast<uint32_t>(nodes.size());
      nodes.push_back(std::make_unique<Node>());
    }
    nodes[idx]->id = id;
    nodes[idx]->self = idx;
    by_id[id] = idx;
    return idx;
  }

  // A tag defined as new: its row of the state store, if any (design/tags.md "State across
  // restarts"). Its state goes back to its script (keep_state; not when the script changed and
  // reset_state), its last usable value is shown as UncertainLastUsableValue until evaluated.
  void restore(Node& n) REQUIRES(mu) {
    auto r = restored.find(n.id);
    auto say = [&](std::string note) {
      n.state_note = note;
      n.counters.last_error = note;
      n.value.diagnostics = std::move(note);
    };
    if (r == restored.end()) {
      if (!opts.restore_note.empty()) say(opts.restore_note);
      return;
    }
    RestoredTag rt = std::move(r->second);
    restored.erase(r);
    if (!rt.problem.empty()) {
      say("state store: " + rt.problem + "; the tag starts from {}");
      return;
    }
    const TagDefinition& d = n.def;
    if (rt.has_state && d.keep_state) {
      if (d.reset_state && rt.script_sha256 != n.script_sha) {
        // A changed script with reset_state: as a hot reload, it starts from {}.
      } else if (value_bytes(rt.state) > d.max_state_bytes) {
        say("state store: the stored state is larger than max_state_bytes (" +
            std::to_string(d.max_state_bytes) + "); the tag starts from {}");
      } else {
        n.kept_state = rt.state;
        n.kept_state_present = true;
        n.import_state = std::move(rt.state);
        n.has_import = true;
      }
    }
    if (rt.has_value && severity(rt.value.status) != Severity::bad) {
      DataValue dv = std::move(rt.value);
      n.have_last_good = true;
      n.last_good = dv;
      dv.status = codes::UncertainLastUsableValue;
      dv.diagnostics = n.state_note.empty()
                           ? "restored: the last value before the restart, not evaluated since"
                           : n.state_note;
      n.value = std::move(dv);
    }
  }

  // The tag's state store note: the store's own (its budget) before the restore's.
  std::string state_note_of(const Node& n) const REQUIRES(mu) {
    if (opts.state_sink)
      if (std::string s = opts.state_sink->note(n.id); !s.empty()) return s;
    return n.state_note;
  }

  // ---- source accounting ----

  std::size_t held_bytes(const Node& n) const {
    return n.id.size() + value_bytes(n.value.value) +
           (n.has_pending ? value_bytes(n.pending.value) : 0) + n.queue_bytes;
  }
  void uncharge(Node& n) REQUIRES(mu) {
    if (n.charged == 0) return;
    source_bytes -= n.charged;
    auto it = usage.find(n.charged_uid);
    it->second.bytes -= n.charged;
    if (it->second.bytes == 0 && it->second.sources == 0) usage.erase(it);
    n.charged = 0;
  }
  // What a source holds now, charged to `uid` (a virtual tag holds nothing here).
  void recharge(Node& n, uint32_t uid) REQUIRES(mu) {
    uncharge(n);
    n.charged_uid = uid;
    if (!n.alive || n.is_virtual) return;
    n.charged = held_bytes(n);
    source_bytes += n.charged;
    usage[uid].bytes += n.charged;
  }
  // The source no longer counts against its creator's max_uid_sources.
  void disown(Node& n) REQUIRES(mu) {
    if (n.owner == 0) return;
    auto it = usage.find(n.owner_uid);
    --it->second.sources;
    if (it->second.bytes == 0 && it->second.sources == 0) usage.erase(it);
    n.owner = 0;
  }

  void free_node(uint32_t idx) REQUIRES(mu) {
    Node& n = *nodes[idx];
    uncharge(n);
    disown(n);
    by_id.erase(n.id);
    n.alive = false;
    n.logs.reset();
    n.script = Script();
    n.def = TagDefinition();
    n.dependents.clear();
    n.used.clear();
    free_nodes.push_back(idx);
  }

  // ---- graph ----

  // Recomputes dependents, topological order and components. Called with no wave running.
  void rebuild() REQUIRES(mu) {
    for (auto& np : nodes) {
      if (!np->alive) continue;
      np->dependents.clear();
      np->component = -1;
    }
    std::vector<uint32_t> tags;
    for (uint32_t i = 0; i < nodes.size(); ++i) {
      Node& n = *nodes[i];
      if (!n.alive || !n.is_virtual) continue;
      tags.push_back(i);
      for (uint32_t in : n.input_nodes) nodes[in]->dependents.push_back(i);
    }
    // Sources: one a tag uses is the definitions' (no longer its creator's); one a definition
    // made that no tag uses any more goes (design/tags.md "Bounds").
    for (uint32_t i = 0; i < nodes.size(); ++i) {
      Node& n = *nodes[i];
      if (!n.alive || n.is_virtual) continue;
      if (!n.dependents.empty()) {
        if (n.owner != 0) {  // a writer's source a tag now reads: as if a definition made it
          disown(n);
          n.from_definition = true;
        }
      } else if (n.from_definition && n.owner == 0) {
        free_node(i);
        --sources;
      }
    }
    // Kahn's algorithm (cycles were refused before).
    std::vector<int> indeg(nodes.size(), 0);
    for (uint32_t t : tags)
      for (uint32_t in : nodes[t]->input_nodes)
        if (nodes[in]->is_virtual) ++indeg[t];
    std::deque<uint32_t> ready;
    for (uint32_t t : tags)
      if (indeg[t] == 0) ready.push_back(t);
    topo_order.clear();
    while (!ready.empty()) {
      const uint32_t t = ready.front();
      ready.pop_front();
      nodes[t]->topo = static_cast<int>(topo_order.size());
      topo_order.push_back(t);
      for (uint32_t d : nodes[t]->dependents)
        if (--indeg[d] == 0) ready.push_back(d);
    }
    // Components: union-find over tags and their inputs.
    std::vector<uint32_t> parent(nodes.size());
    for (uint32_t i = 0; i < parent.size(); ++i) parent[i] = i;
    auto root = [&](uint32_t x) {
      while (parent[x] != x) x = parent[x] = parent[parent[x]];
      return x;
    };
    for (uint32_t t : tags)
      for (uint32_t in : nodes[t]->input_nodes) parent[root(in)] = root(t);
    // every_update: a source queues its updates when one of its dependents asks for it.
    for (auto& np : nodes) {
      if (!np->alive || np->is_virtual) continue;
      Node& n = *np;
      n.queue_updates = false;
      for (uint32_t d : n.dependents)
        if (nodes[d]->def.every_update) n.queue_updates = true;
      if (!n.queue_updates && !n.queue.empty()) {  // nobody asks any more: the latest one
        n.pending = std::move(n.queue.back());
        n.queue.clear();
        n.queue_bytes = 0;
        recharge(n, n.charged_uid);
      }
    }
    std::unordered_map<uint32_t, int> comp_of_root;
    std::vector<Component> old = std::move(comps);
    comps.clear();
    pending_comps.clear();
    for (uint32_t i = 0; i < nodes.size(); ++i) {
      Node& n = *nodes[i];
      if (!n.alive || (!n.is_virtual && n.dependents.empty())) continue;
      const uint32_t r = root(i);
      auto [it, inserted] = comp_of_root.emplace(r, static_cast<int>(comps.size()));
      if (inserted) comps.emplace_back();
      n.component = it->second;
    }
    // Carry what waits: pending sources and roots.
    DateTime latest;
    for (const auto& c : old)
      if (c.pending && c.pending_time > latest) latest = c.pending_time;
    for (uint32_t i = 0; i < nodes.size(); ++i) {
      Node& n = *nodes[i];
      if (!n.alive) continue;
      if (!n.is_virtual && n.has_pending) {
        if (n.component < 0) {  // nothing depends on it any more: apply now
          n.value = std::move(n.pending);
          n.has_pending = false;
          recharge(n, n.charged_uid);
          continue;
        }
        mark_pending(n.component);
        Component& c = comps[n.component];
        c.pending_sources.push_back(i);
        c.pending_time = latest;
      } else if (n.is_virtual && (n.pending_root || n.need_initial)) {
        mark_pending(n.component);
        Component& c = comps[n.component];
        c.pending_roots.push_back(i);
        if (!(c.pending_time > DateTime{})) c.pending_time = latest;
      }
    }
  }

  // The cycles of a proposed graph (id -> definition; inputs not in it are sources): every
  // strongly connected component of more than one tag, with the path of one cycle through it
  // ("A -> C -> B -> A", each tag followed by one of its inputs). Iterative (Tarjan's algorithm
  // with an explicit stack): no recursion whose depth a definition controls.
  struct Cycle {
    std::vector<std::string> members;
    std::string path;
  };
  static std::vector<Cycle> find_cycles(
      const std::unordered_map<std::string, const TagDefinition*, StringHash, std::equal_to<>>&
          defs) {
    std::vector<const std::string*> names;
    std::unordered_map<std::string_view, int> index_of;
    names.reserve(defs.size());
    for (const auto& [id, d] : defs) {
      index_of.emplace(id, static_cast<int>(names.size()));
      names.push_back(&id);
    }
    const int n = static_cast<int>(names.size());
    std::vector<std::vector<int>> adj(n);
    for (int v = 0; v < n; ++v)
      for (const auto& in : defs.at(*names[v])->inputs)
        if (auto it = index_of.find(in.tag); it != index_of.end()) adj[v].push_back(it->second);
    std::vector<int> index(n, -1), low(n, 0), comp(n, -1);
    std::vector<char> on_stack(n, 0);
    std::vector<int> stack;
    struct Frame {
      int v;
      std::size_t e;
    };
    std::vector<Frame> call;
    int counter = 0, comps_found = 0;
    std::vector<Cycle> out;
    for (int s = 0; s < n; ++s) {
      if (index[s] != -1) continue;
      index[s] = low[s] = counter++;
      stack.push_back(s);
      on_stack[s] = 1;
      call.push_back({s, 0});
      while (!call.empty()) {
        const int v = call.back().v;
        if (call.back().e < adj[v].size()) {
          const int w = adj[v][call.back().e++];
          if (index[w] == -1) {
            index[w] = low[w] = counter++;
            stack.push_back(w);
            on_stack[w] = 1;
            call.push_back({w, 0});
          } else if (on_stack[w]) {
            low[v] = std::min(low[v], index[w]);
          }
          continue;
        }
        if (low[v] == index[v]) {
          std::vector<int> members;
          int w;
          do {
            w = stack.back();
            stack.pop_back();
            on_stack[w] = 0;
            comp[w] = comps_found;
            members.push_back(w);
          } while (w != v);
          if (members.size() > 1) {
            // One cycle through the component: follow inputs inside it until one repeats.
            std::unordered_map<int, std::size_t> seen;
            std::vector<int> walk;
            int x = members.back();
            while (!seen.count(x)) {
              seen.emplace(x, walk.size());
              walk.push_back(x);
              for (int y : adj[x])
                if (comp[y] == comps_found) {
                  x = y;
                  break;
                }
            }
            Cycle c;
            for (std::size_t i = seen.at(x); i < walk.size(); ++i)
              c.path += *names[walk[i]] + " -> ";
            c.path += *names[x];
            std::sort(members.begin(), members.end());
            for (int mbr : members) c.members.push_back(*names[mbr]);
            out.push_back(std::move(c));
          }
          ++comps_found;
        }
        call.pop_back();
        if (!call.empty()) low[call.back().v] = std::min(low[call.back().v], low[v]);
      }
    }
    return out;
  }

  // ---- waves ----

  // Whether input i's new DataValue is a change for tag t (against the value it last used): a new
  // status, a value beyond the input's deadband, or -- for a tag that reads its inputs' source
  // timestamps (its timestamp policy, or its script) -- the same value with a new timestamp.
  bool input_changed(const Node& t, std::size_t i, const DataValue& nv) const {
    if (data_changed(t, i, nv)) return true;
    const DataValue& old = t.used[i];
    const bool reads_times = t.def.timestamps != TimestampPolicy::evaluation_time || t.uses_times;
    return reads_times && nv.source_time != old.source_time && same_value(old.value, nv.value);
  }

  // A new status or a value beyond the deadband (not only a new timestamp).
  static bool data_changed(const Node& t, std::size_t i, const DataValue& nv) {
    if (!t.used_set[i]) return true;
    const DataValue& old = t.used[i];
    return old.status != nv.status || value_changed(t.def.inputs[i], old.value, nv.value);
  }

  // An update of source `src` that will never be evaluated (merged into a later one, or dropped
  // from a full every_update queue): the dependents it would have triggered with a new status or
  // value say so with the Overflow bit on their next value (a new timestamp alone, or a value
  // inside the deadband, lost nothing). Every one counts in `coalesced`.
  void lost_update(uint32_t src, const DataValue& lost) REQUIRES(mu) {
    for (uint32_t d : nodes[src]->dependents) {
      Node& t = *nodes[d];
      ++t.counters.coalesced;
      ++counters.coalesced;
      for (std::size_t i = 0; i < t.input_nodes.size(); ++i)
        if (t.input_nodes[i] == src && data_changed(t, i, lost)) t.overflow_pending = true;
    }
  }

  // Whether a change of input `from` (node index) triggers tag `t`; notes the trigger time.
  void consider_trigger(Node& t, uint32_t from) REQUIRES(mu) {
    // A new tag whose inputs had no value yet runs when the first one arrives, whatever its
    // trigger (an on_change tag would anyway; a periodic one does not wait for its period).
    const bool first = t.awaiting_input;
    if (t.def.trigger.kind != TriggerKind::on_change && !first) return;
    const Node& src = *nodes[from];
    for (std::size_t i = 0; i < t.input_nodes.size(); ++i) {
      if (t.input_nodes[i] != from) continue;
      if (!first && (!t.def.inputs[i].trigger || !input_changed(t, i, src.value))) continue;
      t.triggered = true;
      if (!t.trig_time_set || src.value.source_time > t.trig_time)
        t.trig_time = src.value.source_time;
      t.trig_time_set = true;
    }
  }

  bool any_input_set(const Node& t) const REQUIRES(mu) {
    if (t.input_nodes.empty()) return true;
    for (uint32_t in : t.input_nodes) {
      const DataValue& v = nodes[in]->value;
      if (v.status != codes::BadWaitingForInitialData || v.source_time != DateTime{}) return true;
    }
    return false;
  }

  // Components with something pending, to be started (duplicates and stale entries are fine).
  std::vector<int> pending_comps GUARDED_BY(mu);
  void mark_pending(int ci) REQUIRES(mu) {
    Component& c = comps[ci];
    if (!c.pending) pending_comps.push_back(ci);
    c.pending = true;
  }

  void start_waves(std::vector<Dispatch>* out) REQUIRES(mu) {
    if (paused > 0) return;
    // start_wave may mark components pending again: take the list, keep both buffers' capacity.
    due_comps.clear();
    due_comps.swap(pending_comps);
    for (int c : due_comps) {
      const bool startable =
          c < static_cast<int>(comps.size()) && comps[c].pending && !comps[c].running;
      if (startable) start_wave(c, out);
    }
  }
  std::vector<int> due_comps GUARDED_BY(mu);  // scratch of start_waves

  void start_wave(int ci, std::vector<Dispatch>* out) REQUIRES(mu) {
    Component& c = comps[ci];
    c.running = true;
    c.pending = false;
    c.wave = next_wave++;
    c.time = c.pending_time > DateTime{} ? c.pending_time : now();
    c.pending_time = DateTime{};
    c.started = Clock::now();
    ++counters.waves;
    std::vector<uint32_t> seeds;
    // Apply the waiting source updates, then find what they trigger.
    std::vector<uint32_t> changed = std::move(c.pending_sources);
    c.pending_sources.clear();
    bool more = false;
    for (uint32_t s : changed) {
      Node& n = *nodes[s];
      if (!n.has_pending) continue;
      n.value = std::move(n.pending);
      if (n.queue.empty()) {
        n.has_pending = false;
      } else {  // every_update: the next one waits for the next wave
        n.queue_bytes -= value_bytes(n.queue.front().value);
        n.pending = std::move(n.queue.front());
        n.queue.pop_front();
        c.pending_sources.push_back(s);
        more = true;
      }
      recharge(n, n.charged_uid);
    }
    if (more) mark_pending(ci);
    auto mark = [&](Node& t) {
      if (t.wave != c.wave) {
        t.wave = c.wave;
        t.triggered = false;
        t.trig_time_set = false;
        t.wait = 0;
      }
    };
    for (uint32_t s : changed) {
      for (uint32_t d : nodes[s]->dependents) {
        Node& t = *nodes[d];
        mark(t);
        consider_trigger(t, s);
        if (t.triggered) seeds.push_back(d);
      }
    }
    std::vector<uint32_t> roots = std::move(c.pending_roots);
    c.pending_roots.clear();
    for (uint32_t idx : roots) {
      Node& t = *nodes[idx];
      if (!t.alive || !t.is_virtual || t.component != ci || !(t.pending_root || t.need_initial))
        continue;
      if (t.broken || !any_input_set(t)) {
        // A tag none of whose inputs has a value yet keeps BadWaitingForInitialData until its
        // first input arrives (whatever triggered it); a broken one is never evaluated.
        if (t.need_initial && !t.broken) t.awaiting_input = true;
        t.need_initial = false;
        t.pending_root = false;
        continue;
      }
      mark(t);
      t.triggered = true;
      t.pending_root = false;
      t.need_initial = false;
      seeds.push_back(idx);
    }
    // The wave: every tag reachable from a triggered one (each may or may not run).
    std::vector<uint32_t>& wave_tags = c.wave_tags;
    wave_tags.clear();
    std::vector<uint32_t>& stack = seeds;
    while (!stack.empty()) {
      const uint32_t t = stack.back();
      stack.pop_back();
      Node& tn = *nodes[t];
      mark(tn);
      if (tn.listed == c.wave) continue;
      tn.listed = c.wave;
      wave_tags.push_back(t);
      for (uint32_t d : tn.dependents) stack.push_back(d);
    }
    for (uint32_t t : wave_tags)
      for (uint32_t d : nodes[t]->dependents) ++nodes[d]->wait;
    c.remaining = wave_tags.size();
    c.changes.clear();
    c.change_topo.clear();
    if (wave_tags.empty()) {
      end_wave(ci, out);
      return;
    }
    // process() may end the wave (and start the next, which reuses wave_tags): take a copy of
    // the ready ones first.
    for (uint32_t t : wave_tags)
      if (nodes[t]->wait == 0) ready_tags.push_back(t);
    drain(out);
  }

  // Works off the ready tags and components (see ready_tags). Only the outermost call loops.
  void drain(std::vector<Dispatch>* out) REQUIRES(mu) {
    if (draining) return;
    draining = true;
    while (!ready_tags.empty() || !ready_comps.empty()) {
      if (!ready_tags.empty()) {
        const uint32_t t = ready_tags.front();
        ready_tags.pop_front();
        process(t, out);
        continue;
      }
      const int ci = ready_comps.back();
      ready_comps.pop_back();
      if (ci < static_cast<int>(comps.size()) && comps[ci].pending && !comps[ci].running &&
          paused == 0)
        start_wave(ci, out);
    }
    draining = false;
  }

  void process(uint32_t idx, std::vector<Dispatch>* out) REQUIRES(mu) {
    Node& t = *nodes[idx];
    if (!t.triggered || t.broken) {
      finish(idx, false, out);
      return;
    }
    t.awaiting_input = false;
    if (!t.def.evaluate_bad_inputs) {
      // A Bad input (or one never written): the tag is not evaluated and takes the first such
      // input's status, with no value and that input's source timestamp (design/tags.md).
      for (std::size_t i = 0; i < t.input_nodes.size(); ++i) {
        const DataValue& in = nodes[t.input_nodes[i]]->value;
        if (severity(in.status) != Severity::bad) continue;
        ++t.counters.skipped_bad;
        ++counters.skipped_bad;
        for (std::size_t j = 0; j < t.input_nodes.size(); ++j) {  // what it was not evaluated on
          t.used[j] = nodes[t.input_nodes[j]]->value;
          t.used_set[j] = true;
        }
        DataValue dv;
        dv.status = code_only(in.status);
        dv.source_time = in.source_time;
        dv.server_time = comps[t.component].time;
        const std::string& name =
            t.def.inputs[i].name.empty() ? t.def.inputs[i].tag : t.def.inputs[i].name;
        dv.diagnostics = "not evaluated: input '" + name + "' is " + status_code_name(in.status);
        publish(idx, std::move(dv), out);
        return;
      }
    }
    submit(idx, out, false);
  }

  // A tag of the running wave is done; `changed`: its output changed.
  void finish(uint32_t idx, bool changed, std::vector<Dispatch>* out) REQUIRES(mu) {
    Node& t = *nodes[idx];
    Component& c = comps[t.component];
    for (uint32_t d : t.dependents) {
      Node& dn = *nodes[d];
      if (dn.wave != c.wave) continue;
      if (changed) consider_trigger(dn, idx);
      if (--dn.wait == 0) ready_tags.push_back(d);
    }
    if (--c.remaining == 0) end_wave(t.component, out);
    drain(out);
  }

  void end_wave(int ci, std::vector<Dispatch>* out) REQUIRES(mu) {
    Component& c = comps[ci];
    c.running = false;
    counters.last_wave =
        std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - c.started);
    if (!c.changes.empty()) {
      if (c.changes.size() > 1) {
        std::vector<std::pair<int, std::size_t>> order;
        order.reserve(c.changes.size());
        for (std::size_t i = 0; i < c.changes.size(); ++i) order.emplace_back(c.change_topo[i], i);
        std::sort(order.begin(), order.end());
        std::vector<Change> sorted;
        sorted.reserve(c.changes.size());
        for (const auto& [topo, i] : order) sorted.push_back(std::move(c.changes[i]));
        c.changes = std::move(sorted);
      }
      c.change_topo.clear();
      if (opts.on_change) deliveries.push_back(std::move(c.changes));
      c.changes.clear();
    }
    cv.notify_all();
    if (c.pending && paused == 0) {
      ready_comps.push_back(ci);
      drain(out);
    }
  }

  // ---- evaluations ----

  Value prev_value(const Node& t) const {
    if (!t.evaluated) return Value();
    Map m;
    m.push_back({"source_time", Value(t.value.source_time.unix_seconds())});
    m.push_back({"status", Value(static_cast<int64_t>(t.value.status))});
    m.push_back({"value", t.value.value});
    return Value(std::move(m));
  }

  // Builds the evaluation of `t` (mode: "" run, "c" check, "x" export).
  Inputs build_inputs(Node& t, std::string_view mode, DateTime time) REQUIRES(mu) {
    Inputs in;
    in.reserve(t.input_nodes.size() + 1);
    Map st, tm;
    if (t.uses_status) st.reserve(t.input_nodes.size());
    if (t.uses_times) tm.reserve(t.input_nodes.size());
    if (mode.empty()) {
      for (std::size_t i = 0; i < t.input_nodes.size(); ++i) {
        const Node& src = *nodes[t.input_nodes[i]];
        const std::string& name =
            t.def.inputs[i].name.empty() ? t.def.inputs[i].tag : t.def.inputs[i].name;
        in.push_back({name, src.value.value});
        if (t.uses_status) st.push_back({name, Value(static_cast<int64_t>(src.value.status))});
        if (t.uses_times) tm.push_back({name, Value(src.value.source_time.unix_seconds())});
        t.used[i] = src.value;
        t.used_set[i] = true;
      }
    }
    Map ctx;
    ctx.reserve(8);
    if (mode.empty()) {
      if (t.uses_status) ctx.push_back({"s", Value(std::move(st))});
      if (t.uses_times) ctx.push_back({"t", Value(std::move(tm))});
      ctx.push_back({"n", Value(time.unix_seconds())});
      if (t.evaluated && t.uses_prev) ctx.push_back({"p", prev_value(t)});
      if (t.def.keep_state) ctx.push_back({"ks", Value(true)});
    } else {
      ctx.push_back({"m", Value(std::string(mode))});
    }
    if (t.has_import) {
      ctx.push_back({"st", t.import_state});
    } else if (t.def.keep_state && t.kept_state_present && mode.empty()) {
      ctx.push_back({"k", Value(true)});
    }
    in.push_back({"__c", Value(std::move(ctx))});
    return in;
  }

  void submit(uint32_t idx, std::vector<Dispatch>* out, bool with_state) REQUIRES(mu) {
    Node& t = *nodes[idx];
    Component& c = comps[t.component];
    if (with_state && t.kept_state_present) {
      t.import_state = t.kept_state;
      t.has_import = true;
    }
    Inputs inputs = build_inputs(t, "", c.time);
    if (opts.on_submit) opts.on_submit(t.id, &inputs);
    t.in_flight = true;
    t.submitted = Clock::now();
    ++in_flight;
    ++t.counters.evaluations;
    ++counters.evaluations;
    // 16 bytes of capture: std::function keeps it without an allocation. The engine's destructor
    // waits for every evaluation in flight, so `this` outlives the callback.
    t.eval_time = c.time;
    const uint32_t gen = t.generation;
    Impl* self = this;
    out->push_back({&runner, t.script, std::move(inputs),
                    [self, idx, gen](Result r) { self->on_result(idx, gen, std::move(r)); }});
  }

  void on_result(uint32_t idx, uint32_t gen, Result r) EXCLUDES(mu) {
    std::vector<Dispatch> out;
    {
      MutexLock lock(mu);
      Node& t = *nodes[idx];
      if (t.alive && t.generation == gen) {  // always: removal waits for waves
        t.in_flight = false;
        ++t.results;
        complete(idx, t.eval_time, std::move(r), &out);
      }
    }
    run_dispatches(std::move(out));
    deliver();
    // Last: the destructor waits for this count, and nothing below touches the engine.
    MutexLock lock(mu);
    --in_flight;
    cv.notify_all();
  }

  // The script's lines into the tag's ring, and to TagsOptions::on_log.
  void record_logs(Node& t, const Result& r) REQUIRES(mu) {
    if (!t.logs) t.logs = std::make_unique<outrun::detail::LogRing>();
    const int64_t now_us = std::chrono::duration_cast<std::chrono::microseconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count();
    t.logs->append(r.logs, r.logs_dropped, now_us, &log_budget);
    if (opts.on_log) opts.on_log(t.id, r.logs);
  }

  // A failed evaluation's diagnostics end with the last lines its script logged (at most 3).
  static std::string log_tail(const Result& r) {
    if (r.logs.empty()) return {};
    std::string s = "; last log lines:";
    const std::size_t from = r.logs.size() > 3 ? r.logs.size() - 3 : 0;
    for (std::size_t i = from; i < r.logs.size(); ++i) {
      s += i == from ? " [" : " | [";
      s += outrun::detail::script_level_name(r.logs[i].level);
      s += "] ";
      s += r.logs[i].text;
    }
    return s;
  }

  void complete(uint32_t idx, DateTime time, Result r, std::vector<Dispatch>* out) REQUIRES(mu) {
    Node& t = *nodes[idx];
    if (opts.on_result) opts.on_result(t.id, r);
    t.has_import = false;
    t.counters.last_duration =
        std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t.submitted);
    const auto si = static_cast<std::size_t>(r.status);
    if (si < std::size(t.counters.by_status)) {
      ++t.counters.by_status[si];
      ++counters.by_status[si];
    }
    if (!r.logs.empty() || r.logs_dropped != 0) [[unlikely]]
      record_logs(t, r);

    if (r.status == Status::ok) {
      const Value* ns = field(r.value, "\0ns"sv);
      if (ns != nullptr && ns->is<bool>() && ns->as<bool>()) {
        // A fresh worker: send the kept state and run again, in the same wave.
        ++t.counters.state_restores;
        submit(idx, out, true);
        return;
      }
    }
    if (r.status == Status::busy) {
      ++t.counters.busy;
      ++counters.busy;
      schedule_retry(idx);
      finish(idx, false, out);
      return;
    }

    DataValue dv;
    dv.server_time = time;
    const bool worker_down = r.status == Status::worker_lost || r.status == Status::unavailable ||
                             r.status == Status::cancelled;
    if (worker_down) {
      if (!t.down) {
        t.down = true;
        t.down_since = time;
      }
      const auto down_for =
          std::chrono::microseconds(time.unix_micros() - t.down_since.unix_micros());
      if (t.have_last_good && down_for < t.def.last_usable) {
        dv.value = t.last_good.value;
        dv.source_time = t.last_good.source_time;
        dv.status = codes::UncertainLastUsableValue;
      } else {
        dv.status = codes::BadResourceUnavailable;
        dv.source_time = time;
      }
      dv.diagnostics = std::string(to_string(r.status)) + ": " + r.error;
      t.counters.last_error = dv.diagnostics;
      if (!closing) schedule_retry(idx);
    } else {
      t.down = false;
      t.evaluated = true;
      t.last_eval_time = time;
      ++t.completed;
      dv.source_time = source_time_for(t, time);
      if (r.status != Status::ok) {
        dv.status = status_code_for(r.status);
        dv.diagnostics = std::string(to_string(r.status)) + ": " + r.error + log_tail(r);
        t.counters.last_error = dv.diagnostics;
      } else {
        result_to_datavalue(t, r.value, &dv);
      }
      if (severity(dv.status) != Severity::bad) {
        t.have_last_good = true;
        t.last_good = dv;
      }
    }
    publish(idx, std::move(dv), out);
  }

  // A tag's new output: a Bad one carries no value (OPC 10000-4 7.11); the Overflow bit when
  // updates were merged since the last one; notified when it differs from the current one.
  void publish(uint32_t idx, DataValue dv, std::vector<Dispatch>* out) REQUIRES(mu) {
    Node& t = *nodes[idx];
    if (severity(dv.status) == Severity::bad) dv.value = Value();
    if (t.overflow_pending) {
      t.overflow_pending = false;
      dv.status |= kOverflowBits;
      ++t.counters.overflows;
      ++counters.overflows;
    }
    const bool changed = !dv.same_as(t.value);
    if (changed) t.value = dv;
    if (opts.state_sink && (changed || t.state_dirty)) {
      t.state_dirty = false;
      opts.state_sink->saved(t.id, t.value,
                             t.def.keep_state && t.kept_state_present ? &t.kept_state : nullptr,
                             t.script_sha);
    }
    if (changed) {
      ++t.counters.changes;
      ++counters.changes;
      comps[t.component].changes.push_back({t.id, std::move(dv)});
      comps[t.component].change_topo.push_back(t.topo);
    } else {
      t.value.server_time = dv.server_time;
    }
    finish(idx, changed, out);
  }

  DateTime source_time_for(const Node& t, DateTime time) const REQUIRES(mu) {
    switch (t.def.timestamps) {
      case TimestampPolicy::evaluation_time:
        return time;
      case TimestampPolicy::triggering_input:
        if (t.trig_time_set) return t.trig_time;
        return time;
      case TimestampPolicy::newest_input: {
        bool any = false;
        DateTime newest;
        for (uint32_t in : t.input_nodes) {
          const DataValue& v = nodes[in]->value;
          if (v.status == codes::BadWaitingForInitialData && v.source_time == DateTime{}) continue;
          if (!any || v.source_time > newest) newest = v.source_time;
          any = true;
        }
        return any ? newest : time;
      }
    }
    return time;
  }

  void result_to_datavalue(Node& t, const Value& result, DataValue* dv) REQUIRES(mu) {
    const bool w = wrapped(result);
    const Value* v = w ? map_get(result, "\0v"sv) : &result;
    const Value* s = w ? map_get(result, "\0s"sv) : nullptr;
    const Value* st = w ? map_get(result, "\0st"sv) : nullptr;
    if (st != nullptr && t.def.keep_state) {
      if (value_bytes(*st) <= t.def.max_state_bytes) {
        t.kept_state = *st;
        t.kept_state_present = true;
        t.state_dirty = true;
      } else {
        t.counters.last_error = "state is larger than max_state_bytes (" +
                                std::to_string(t.def.max_state_bytes) + "); not kept";
      }
    }
    // The status: the script's, or the worst severity among the inputs (keeping that input's code).
    StatusCode code = codes::Good;
    if (s != nullptr && !s->is_nil()) {
      bool ok = false;
      if (auto* i = std::get_if<int64_t>(&s->v);
          i && *i >= 0 && *i <= static_cast<int64_t>(UINT32_MAX)) {
        code = static_cast<StatusCode>(*i);
        ok = true;
      } else if (auto* d = std::get_if<double>(&s->v);
                 d && *d >= 0 && *d <= UINT32_MAX && *d == std::floor(*d)) {
        code = static_cast<StatusCode>(*d);
        ok = true;
      } else if (auto* name = std::get_if<std::string>(&s->v)) {
        ok = parse_status_code(*name, &code);
      }
      if (!ok) {
        dv->status = codes::BadInternalError;
        dv->diagnostics =
            "the script returned an invalid status (a StatusCode number or name is expected)";
        t.counters.last_error = dv->diagnostics;
        return;
      }
    } else {
      int worst = 0;
      for (uint32_t in : t.input_nodes) {
        const StatusCode ic = nodes[in]->value.status;
        const int sev = static_cast<int>(severity(ic));
        if (sev > worst) {
          worst = sev;
          code = code_only(ic);
        }
      }
    }
    const Value nil;
    const Value& raw = v != nullptr ? *v : nil;
    if (raw.is_nil()) {
      if (severity(code) == Severity::bad) {
        dv->status = code;
        return;
      }
      dv->status = codes::BadTypeMismatch;
      dv->diagnostics = "the script returned nil with a status that is not Bad";
      t.counters.last_error = dv->diagnostics;
      return;
    }
    std::string reason;
    const StatusCode cc = coerce(raw, t.def.type, &dv->value, &reason);
    if (cc != codes::Good) {
      dv->value = Value();
      dv->status = cc;
      dv->diagnostics = reason;
      t.counters.last_error = reason;
      return;
    }
    dv->status = code;
  }

  // ---- timers ----

  void schedule_retry(uint32_t idx) REQUIRES(mu) {
    Node& t = *nodes[idx];
    timers.push({Clock::now() + opts.retry_delay, idx, t.generation, false, 0});
    timer_cv.notify_one();
  }

  void timer_loop() EXCLUDES(mu) {
    MutexLock lock(mu);
    while (!closing) {
      if (timers.empty()) {
        timer_cv.wait(mu);
        continue;
      }
      const Timer top = timers.top();
      if (Clock::now() < top.at) {
        timer_cv.wait_until(mu, top.at);
        continue;
      }
      timers.pop();
      Node& t = *nodes[top.node];
      if (!t.alive || t.generation != top.generation || !t.is_virtual || t.broken) continue;
      if (top.periodic) {
        // One timer per periodic tag: a redefinition arms a new one and this one is dropped.
        if (t.def.trigger.kind != TriggerKind::periodic || top.seq != t.timer_seq) continue;
        Clock::time_point next = top.at + t.def.trigger.period;
        if (next <= Clock::now()) {  // fell behind: skip what was missed
          ++t.counters.coalesced;
          ++counters.coalesced;
          next = Clock::now() + t.def.trigger.period;
        }
        timers.push({next, top.node, top.generation, true, top.seq});
      }
      add_root(t);
      std::vector<Dispatch> out;
      start_waves(&out);
      lock.unlock();
      run_dispatches(std::move(out));
      deliver();
      lock.lock();
    }
  }

  void add_root(Node& t) REQUIRES(mu) {
    mark_pending(t.component);
    Component& c = comps[t.component];
    if (t.pending_root) {
      ++t.counters.coalesced;
      ++counters.coalesced;
    } else {
      c.pending_roots.push_back(t.self);
    }
    t.pending_root = true;
    if (!(c.pending_time > DateTime{})) c.pending_time = now();
  }

  // ---- deliveries ----

  void deliver() EXCLUDES(mu) {
    MutexLock lock(mu);
    if (delivering) return;
    delivering = true;
    while (!deliveries.empty()) {
      std::vector<Change> batch = std::move(deliveries.front());
      deliveries.pop_front();
      lock.unlock();
      if (opts.on_change) opts.on_change(batch);
      lock.lock();
    }
    delivering = false;
    cv.notify_all();
  }

  bool idle_locked() const REQUIRES(mu) {
    if (delivering || !deliveries.empty()) return false;
    for (const auto& c : comps)
      if (c.running || (c.pending && paused == 0)) return false;
    return true;
  }

  bool no_wave_running_locked() const REQUIRES(mu) {
    for (const auto& c : comps)
      if (c.running) return false;
    return in_flight == 0;
  }
};

// ---- Engine ----

namespace {

bool id_is_valid(const std::string& id) {
  if (id.empty() || id.size() > kMaxTagIdSize) return false;
  for (unsigned char ch : id)
    if (ch < 0x20 || ch == 0x7f) return false;
  return true;
}

Error validate(const TagDefinition& d) {
  auto bad = [&](std::string why) {
    return Error{ErrorCode::invalid_argument, "tag '" + d.id + "': " + why};
  };
  if (d.id.empty() || d.id.size() > kMaxTagIdSize)
    return {ErrorCode::invalid_argument,
            "a tag id must be 1.." + std::to_string(kMaxTagIdSize) + " bytes"};
  for (unsigned char ch : d.id)
    if (ch < 0x20 || ch == 0x7f) return bad("the id contains a control character");
  if (d.script.size() > kMaxSourceSize - 4096)
    return bad("the script is larger than " + std::to_string(kMaxSourceSize - 4096) + " bytes");
  if (d.inputs.size() > kMaxTagInputs)
    return bad("more than " + std::to_string(kMaxTagInputs) + " inputs");
  std::set<std::string> names, tags;
  for (const auto& in : d.inputs) {
    if (in.tag.empty() || in.tag.size() > kMaxTagIdSize)
      return bad("an input's tag id must be 1..256 bytes");
    if (in.tag == d.id) return bad("cycle: " + d.id + " -> " + d.id);
    const std::string& name = in.name.empty() ? in.tag : in.name;
    if (name.size() > kMaxTagIdSize)
      return bad("input name '" + name + "' is longer than 256 bytes");
    if (name.rfind("__", 0) == 0)
      return bad("input name '" + name + "': names starting with '__' are reserved");
    if (!names.insert(name).second) return bad("input name '" + name + "' is used twice");
    if (!tags.insert(in.tag).second) return bad("input '" + in.tag + "' is listed twice");
    if (in.deadband != DeadbandKind::none &&
        !(in.deadband_value >= 0 && std::isfinite(in.deadband_value)))
      return bad("input '" + in.tag + "': a deadband must be a finite number >= 0");
    if (in.deadband == DeadbandKind::percent && in.deadband_value > 100)
      return bad("input '" + in.tag + "': a percent deadband must be 0..100");
    if (!std::isfinite(in.range_low) || !std::isfinite(in.range_high) ||
        in.range_low > in.range_high)
      return bad("input '" + in.tag + "': range must be finite with low <= high");
  }
  if (static_cast<std::size_t>(d.type.type) > static_cast<std::size_t>(DataType::ByteString))
    return bad("unknown DataType");
  if (d.trigger.kind == TriggerKind::periodic && d.trigger.period < std::chrono::milliseconds(1))
    return bad("a periodic trigger needs a period of at least 1 ms");
  if (d.trigger.max_age.count() < 0) return bad("max_age must be >= 0");
  if (d.last_usable.count() < 0) return bad("last_usable must be >= 0");
  if (d.max_state_bytes > (8u << 20)) return bad("max_state_bytes is larger than 8 MiB");
  return {};
}

// A syntax error Lua finds at the end of the script is reported on the wrapper's closing line
// (one past the script's last): name the script's last line instead.
std::string user_lines(const std::string& error, const TagDefinition& d) {
  const std::string prefix = "tag:" + d.id + ":";
  if (error.rfind(prefix, 0) != 0) return error;
  const std::size_t colon = error.find(':', prefix.size());
  if (colon == std::string::npos) return error;
  const std::string num = error.substr(prefix.size(), colon - prefix.size());
  if (num.empty() || num.find_first_not_of("0123456789") != std::string::npos || num.size() > 9)
    return error;
  const long line = std::stol(num);
  const long last = 1 + static_cast<long>(std::count(d.script.begin(), d.script.end(), '\n'));
  if (line <= last) return error;
  std::string rest = error.substr(colon);
  if (auto p = rest.find("near 'end'"); p != std::string::npos)
    rest.replace(p, 10, "at the end of the script");
  return prefix + std::to_string(last) + rest;
}

// Where a compile error is in the tags file: the script's line N is line script_line + N - 1 of
// script_origin (Lua gives no column: 1). Without an origin, the definition's location.
std::string script_location(const std::string& error, const TagDefinition& d) {
  const std::string prefix = "tag:" + d.id + ":";
  if (d.script_line <= 0 || error.rfind(prefix, 0) != 0) return d.location;
  const std::size_t colon = error.find(':', prefix.size());
  const std::string num = error.substr(prefix.size(), colon - prefix.size());
  if (colon == std::string::npos || num.empty() || num.size() > 9 ||
      num.find_first_not_of("0123456789") != std::string::npos)
    return d.location;
  return (d.script_origin.empty() ? "" : d.script_origin + ":") +
         std::to_string(d.script_line + std::stol(num) - 1) + ":1";
}

Result wait_result(Future& f, std::chrono::milliseconds timeout) {
  if (f.wait_for(timeout) != std::future_status::ready)
    return {Status::unavailable, Value(), "no answer from the runner in time", -1};
  return f.get();
}

}  // namespace

Engine::Engine(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

Error Engine::create(Runner& runner, TagsOptions options, std::unique_ptr<Engine>* out) {
  if (options.retry_delay.count() <= 0)
    return {ErrorCode::invalid_argument, "retry_delay must be positive"};
  if (options.wait_timeout.count() <= 0)
    return {ErrorCode::invalid_argument, "wait_timeout must be positive"};
  auto impl = std::make_shared<Impl>(runner, std::move(options));
  Impl* p = impl.get();
  {
    MutexLock lock(p->mu);
    for (auto& r : p->opts.restored) {
      std::string id = r.id;
      p->restored[std::move(id)] = std::move(r);
    }
    p->opts.restored.clear();
  }
  p->timer_thread = std::thread([p] { p->timer_loop(); });
  out->reset(new Engine(std::move(impl)));
  return {};
}

Engine::~Engine() {
  Impl& m = *impl_;
  std::vector<std::string> keys;
  {
    MutexLock lock(m.mu);
    m.closing = true;
    m.cv.notify_all();
    m.timer_cv.notify_all();
  }
  if (m.timer_thread.joinable()) m.timer_thread.join();
  {
    MutexLock lock(m.mu);
    // Every evaluation ends exactly once (the runner's promise), and the callbacks point here.
    m.cv.wait(m.mu, [&]() REQUIRES(m.mu) { return m.in_flight == 0 && !m.delivering; });
    for (auto& n : m.nodes)
      if (n->alive && n->is_virtual) keys.push_back(n->key);
  }
  for (const auto& k : keys) (void)m.runner.unregister_script(k);
}

Error Engine::apply(const std::vector<TagDefinition>& defs, bool replace_all) {
  ApplyOptions o;
  o.replace_all = replace_all;
  o.strict = true;
  return apply(defs, o, nullptr);
}

Error Engine::apply(const std::vector<TagDefinition>& defs, const ApplyOptions& opt,
                    ApplyResult* result) {
  Impl& m = *impl_;
  ApplyResult local;
  ApplyResult& res = result != nullptr ? *result : local;
  res = ApplyResult();
  MutexLock apply_lock(m.apply_mu);
  auto whole = [&](ErrorCode code, std::string message) {
    res.defined.clear();
    res.unchanged.clear();
    res.removed.clear();
    return Error{code, std::move(message)};
  };
  // Strict: the first broken definition refuses the set (every one is still in res.errors).
  auto strict_failure = [&]() -> Error {
    if (!opt.strict || res.errors.empty()) return {};
    for (auto& e : res.errors) e.installed = false;
    const DefinitionError& e = res.errors.front();
    return whole(e.code, e.message);
  };
  // ---- 1. Each definition on its own.
  struct Item {
    const TagDefinition* def = nullptr;
    std::string broken;    // why it cannot run ("" if it can, so far)
    std::string location;  // where the reason is, when not the definition's own location
    ErrorCode code = ErrorCode::invalid_argument;
    bool unchanged = false;
    // The plan (changed or new ones).
    Script script;
    bool new_script = false;
    bool existed = false;
    Script old_script;
    bool carry_state = false;
    Value state;
    bool has_state = false;
  };
  std::vector<Item> items;
  items.reserve(defs.size());
  std::unordered_map<std::string_view, std::size_t> item_of;
  for (const auto& d : defs) {
    if (!id_is_valid(d.id)) {
      res.errors.push_back({"", d.location,
                            d.config_error.empty() ? validate(d).message : d.config_error,
                            ErrorCode::invalid_argument});
      continue;
    }
    if (!item_of.emplace(d.id, items.size()).second) {
      res.errors.push_back(
          {d.id, d.location, "tag '" + d.id + "' is defined twice", ErrorCode::invalid_argument});
      continue;
    }
    Item it;
    it.def = &d;
    if (!d.config_error.empty())
      it.broken = "tag '" + d.id + "': " + d.config_error;
    else if (Error e = validate(d))
      it.broken = e.message;
    items.push_back(std::move(it));
  }
  std::vector<std::string> removed;
  {
    MutexLock lock(m.mu);
    if (m.closing) return whole(ErrorCode::unavailable, "the tags engine is closing");
    // ---- 2. The graph as it would be: tags that can run, with their inputs.
    std::unordered_map<std::string, const TagDefinition*, StringHash, std::equal_to<>> proposed;
    std::size_t total = items.size();
    if (!opt.replace_all)
      for (auto& n : m.nodes)
        if (n->alive && n->is_virtual && !item_of.count(n->id)) {
          ++total;
          if (!n->broken) proposed.emplace(n->id, &n->def);
        }
    for (const auto& it : items)
      if (it.broken.empty()) proposed.emplace(it.def->id, it.def);
    if (opt.replace_all)
      for (auto& n : m.nodes)
        if (n->alive && n->is_virtual && !item_of.count(n->id)) removed.push_back(n->id);
    if (total > std::min(m.opts.max_tags, kMaxTags))
      return whole(ErrorCode::invalid_argument,
                   "the definitions would make " + std::to_string(total) +
                       " virtual tags, more than max_tags (" +
                       std::to_string(std::min(m.opts.max_tags, kMaxTags)) + ")");
    for (const auto& cyc : Impl::find_cycles(proposed)) {
      // The cycle's tags of this set cannot run (the others were running without it).
      for (const auto& id : cyc.members)
        if (auto f = item_of.find(id); f != item_of.end() && items[f->second].broken.empty())
          items[f->second].broken = "tag '" + id + "': cycle: " + cyc.path;
    }
    std::unordered_set<std::string_view> new_sources;
    for (const auto& it : items) {
      if (!it.broken.empty()) continue;
      for (const auto& in : it.def->inputs)
        if (!proposed.count(in.tag) && !item_of.count(in.tag) && m.find(in.tag) == nullptr)
          new_sources.insert(in.tag);
    }
    if (m.sources + new_sources.size() > m.opts.max_sources)
      return whole(ErrorCode::invalid_argument, "the definitions need more than max_sources (" +
                                                    std::to_string(m.opts.max_sources) +
                                                    ") source tags");
    // ---- 3. What is unchanged is left alone.
    for (auto& it : items) {
      const TagDefinition& d = *it.def;
      Node* n = m.find(d.id);
      if (n != nullptr && n->is_virtual) {
        const bool same_outcome =
            n->broken ? (!it.broken.empty() ? n->broken_reason == it.broken : n->broken_compile)
                      : it.broken.empty();
        if (same_definition(n->def, d) && same_outcome) {
          it.unchanged = true;
          if (n->broken) {  // still reported: the file still has the error
            it.broken = n->broken_reason;
            it.code = n->broken_code;
          }
          continue;
        }
        it.existed = !n->broken;
        it.old_script = n->script;
        it.carry_state = !d.reset_state;
        if (!n->broken && n->def.script == d.script) it.script = n->script;
      }
    }
  }
  for (const auto& it : items)
    if (!it.broken.empty())
      res.errors.push_back({it.def->id, it.def->location, it.broken, it.code});
  // Strict with an error already: the scripts are still compiled, so that every error is
  // reported, but nothing will change.
  const bool refused = opt.strict && !res.errors.empty();
  // ---- 4. Register and compile outside the lock: every new script is checked before anything
  // changes.
  for (auto& it : items) {
    if (it.unchanged || !it.broken.empty() || it.script.valid()) continue;
    const std::string wrapped = detail::wrap_script(it.def->script);
    if (auto err = m.runner.register_script(kInternalKeyPrefix + ("tag:" + it.def->id), wrapped,
                                            &it.script)) {
      it.broken = "tag '" + it.def->id + "': " + err.message;
      it.code = err.code;
      res.errors.push_back({it.def->id, it.def->location, it.broken, it.code});
      continue;
    }
    it.new_script = true;
  }
  // Pause: no wave may run while states move and the graph changes.
  {
    MutexLock lock(m.mu);
    ++m.paused;
    if (!m.cv.wait_for(m.mu, m.opts.wait_timeout,
                       [&]() REQUIRES(m.mu) { return m.no_wave_running_locked(); })) {
      --m.paused;
      std::vector<Dispatch> out;
      m.start_waves(&out);
      lock.unlock();
      run_dispatches(std::move(out));
      return whole(ErrorCode::unavailable,
                   "evaluations still running after wait_timeout; nothing changed");
    }
  }
  auto unpause = [&](std::vector<Dispatch>* out) REQUIRES(m.mu) {
    --m.paused;
    m.start_waves(out);
  };
  Error failure;
  // Export the old states (hot reload), then check-compile the new scripts with them.
  for (auto& it : items) {
    if (refused || !it.new_script || !it.existed || !it.carry_state) continue;
    Inputs in{{"__c", Value(Map{{"m", Value("x")}})}};
    auto f = m.runner.evaluate(it.old_script, std::move(in));
    Result r = wait_result(f, m.opts.wait_timeout);
    if (r.status == Status::ok)
      if (const Value* st = field(r.value, "\0st"sv)) {
        it.state = *st;
        it.has_state = true;
      }
    if (!it.has_state) {
      MutexLock lock(m.mu);
      if (Node* n = m.find(it.def->id); n && n->kept_state_present) {
        it.state = n->kept_state;
        it.has_state = true;
      }
    }
  }
  // At most kMaxChecksInFlight at once, in order.
  std::deque<std::pair<Item*, Future>> checks;
  std::size_t next_check = 0;
  for (;;) {
    while (checks.size() < kMaxChecksInFlight && next_check < items.size()) {
      Item& it = items[next_check++];
      if (!it.new_script) continue;
      Map ctx{{"m", Value("c")}};
      if (it.has_state) ctx.push_back({"st", it.state});
      checks.emplace_back(&it,
                          m.runner.evaluate(it.script, Inputs{{"__c", Value(std::move(ctx))}}));
    }
    if (checks.empty()) break;
    Item* it = checks.front().first;
    Future f = std::move(checks.front().second);
    checks.pop_front();
    Result r = wait_result(f, m.opts.wait_timeout);
    if (r.status == Status::ok) continue;
    const TagDefinition& d = *it->def;
    if (r.status == Status::compile_error) {
      const std::string why = user_lines(r.error, d);
      it->broken = "tag '" + d.id + "': compile_error: " + why;
      it->code = ErrorCode::compile_error;
      it->location = script_location(why, d);
      res.errors.push_back({d.id, it->location, it->broken, it->code});
    } else if (!failure) {  // the check did not run (the runner is down, busy, ...)
      failure = {ErrorCode::unavailable,
                 "tag '" + d.id + "': " + std::string(to_string(r.status)) + ": " + r.error};
    }
  }
  // Every error in the order of the definitions.
  std::stable_sort(res.errors.begin(), res.errors.end(),
                   [&](const DefinitionError& a, const DefinitionError& b) {
                     auto pos = [&](const DefinitionError& e) {
                       auto f = item_of.find(e.id);
                       return f == item_of.end() ? std::size_t{0} : f->second;
                     };
                     return pos(a) < pos(b);
                   });
  if (!failure) failure = strict_failure();
  std::vector<Dispatch> out;
  std::vector<std::string> unregister;
  {
    MutexLock lock(m.mu);
    if (failure) {
      unpause(&out);
    } else {
      std::vector<Change> configured;  // tags that became broken (or changed their reason)
      const DateTime now = m.now();
      for (auto& it : items) {
        const TagDefinition& d = *it.def;
        if (it.unchanged) {
          Node& n = *m.find(d.id);
          n.def.location = d.location;
          n.def.script_origin = d.script_origin;
          n.def.script_line = d.script_line;
          res.unchanged.push_back(d.id);
          continue;
        }
        uint32_t idx;
        if (Node* n = m.find(d.id)) {
          idx = m.by_id[d.id];
          if (!n->is_virtual) {  // a source becomes a virtual tag
            --m.sources;
            n->value = DataValue();
            n->has_pending = false;
            n->queue.clear();
            n->queue_bytes = 0;
            n->from_definition = false;
            m.uncharge(*n);
            m.disown(*n);
          }
        } else {
          idx = m.new_node(d.id);
        }
        Node& n = *m.nodes[idx];
        const bool had_script = n.is_virtual && !n.broken;
        const bool was_virtual = n.is_virtual;
        n.is_virtual = true;
        n.def = d;
        ++n.version;
        n.key = kInternalKeyPrefix + ("tag:" + d.id);
        ++n.timer_seq;  // a periodic timer of the old definition is dropped
        n.pending_root = false;
        if (!it.broken.empty()) {
          if (had_script || it.new_script) unregister.push_back(n.key);
          n.broken = true;
          n.broken_reason = it.broken;
          n.broken_code = it.code;
          n.broken_compile = it.code == ErrorCode::compile_error;
          n.script = Script();
          n.input_nodes.clear();
          n.used.clear();
          n.used_set.clear();
          n.kept_state_present = false;
          n.kept_state = Value();
          n.need_initial = false;
          n.evaluated = false;
          DataValue dv;
          dv.status = codes::BadConfigurationError;
          const std::string& loc = it.location.empty() ? d.location : it.location;
          dv.diagnostics = loc.empty() ? it.broken : loc + ": " + it.broken;
          dv.source_time = now;
          dv.server_time = now;
          n.counters.last_error = dv.diagnostics;
          if (!dv.same_as(n.value) || dv.diagnostics != n.value.diagnostics) {
            n.value = dv;
            configured.push_back({d.id, std::move(dv)});
          }
          continue;
        }
        res.defined.push_back(d.id);
        n.broken = false;
        n.broken_reason.clear();
        n.broken_compile = false;
        n.script = it.script;
        // "status" also covers the helpers' usual argument (is_good(status.X)).
        n.uses_status = d.script.find("status") != std::string::npos;
        n.uses_times = d.script.find("source_time") != std::string::npos;
        n.uses_prev = d.script.find("prev") != std::string::npos;
        n.input_nodes.clear();
        for (const auto& in : d.inputs) {
          uint32_t src;
          if (auto f = m.by_id.find(in.tag); f != m.by_id.end()) {
            src = f->second;
          } else {
            src = m.new_node(in.tag);
            ++m.sources;
            m.nodes[src]->from_definition = true;
            m.recharge(*m.nodes[src], kDefinitionsUid);
          }
          n.input_nodes.push_back(src);
        }
        n.used.assign(d.inputs.size(), DataValue());
        n.used_set.assign(d.inputs.size(), false);
        if (it.new_script) n.kept_state_present = d.keep_state && it.has_state;
        if (n.kept_state_present && it.has_state) n.kept_state = it.state;
        if (!d.keep_state) {
          n.kept_state_present = false;
          n.kept_state = Value();
        }
        n.script_sha = n.script.valid() ? n.script.sha256_hex() : std::string();
        if (!was_virtual || (!had_script && m.restored.count(d.id) != 0)) m.restore(n);
        n.need_initial =
            d.trigger.kind == TriggerKind::on_change || d.trigger.kind == TriggerKind::periodic;
        n.awaiting_input = false;
        // A periodic tag runs once now (need_initial) and then every period from now.
        n.due_set = d.trigger.kind == TriggerKind::periodic;
        n.next_due = DateTime::from_unix_micros(
            now.unix_micros() +
            std::chrono::duration_cast<std::chrono::microseconds>(d.trigger.period).count());
        if (d.trigger.kind == TriggerKind::periodic && m.opts.real_time_periodic) {
          m.timers.push({Clock::now() + d.trigger.period, idx, n.generation, true, n.timer_seq});
          m.timer_cv.notify_one();
        }
      }
      // The inputs of the tags that remain (one pass, not one per removed tag).
      std::unordered_set<uint32_t> still_used;
      {
        std::unordered_set<std::string_view> gone(removed.begin(), removed.end());
        for (auto& o : m.nodes)
          if (o->alive && o->is_virtual && !gone.count(o->id))
            still_used.insert(o->input_nodes.begin(), o->input_nodes.end());
      }
      for (const auto& id : removed) {
        const uint32_t idx = m.by_id.at(id);
        Node& n = *m.nodes[idx];
        // Still an input of a remaining tag: it stays, as a source.
        const bool used = still_used.count(idx) != 0;
        if (!n.broken) unregister.push_back(n.key);
        if (m.opts.state_sink) m.opts.state_sink->removed(id);
        if (used) {
          n.is_virtual = false;
          n.broken = false;
          n.script = Script();
          n.def = TagDefinition();
          n.value = DataValue();
          n.from_definition = true;
          ++m.sources;
          m.recharge(n, kDefinitionsUid);
        } else {
          m.free_node(idx);
        }
        res.removed.push_back(id);
      }
      for (auto& e : res.errors)
        e.installed = !e.id.empty() && m.find(e.id) != nullptr && m.find(e.id)->broken;
      m.rebuild();
      if (!configured.empty() && m.opts.on_change) m.deliveries.push_back(std::move(configured));
      unpause(&out);
    }
  }
  for (const auto& key : unregister) (void)m.runner.unregister_script(key);
  run_dispatches(std::move(out));
  m.deliver();
  if (failure) {
    res.defined.clear();
    res.unchanged.clear();
    res.removed.clear();
    for (auto& e : res.errors) e.installed = false;
  }
  return failure;
}

Error Engine::remove(std::string_view id) {
  Impl& m = *impl_;
  MutexLock apply_lock(m.apply_mu);
  MutexLock lock(m.mu);
  Node* n = m.find(id);
  if (n == nullptr || !n->is_virtual)
    return {ErrorCode::invalid_argument, "'" + std::string(id) + "' is not a virtual tag"};
  if (!n->dependents.empty()) {
    std::string users;
    for (uint32_t d : n->dependents) users += (users.empty() ? "" : ", ") + m.nodes[d]->id;
    return {ErrorCode::invalid_argument, "tag '" + std::string(id) + "' is an input of " + users};
  }
  ++m.paused;
  const bool quiet = m.cv.wait_for(m.mu, m.opts.wait_timeout,
                                   [&]() REQUIRES(m.mu) { return m.no_wave_running_locked(); });
  std::vector<Dispatch> out;
  std::string key;
  if (quiet) {
    n = m.find(id);
    if (!n->broken) key = n->key;
    if (m.opts.state_sink) m.opts.state_sink->removed(n->id);
    m.free_node(m.by_id.at(std::string(id)));
    m.rebuild();
  }
  --m.paused;
  m.start_waves(&out);
  lock.unlock();
  run_dispatches(std::move(out));
  m.deliver();
  if (!quiet)
    return {ErrorCode::unavailable,
            "evaluations still running after wait_timeout; nothing changed"};
  if (key.empty()) return {};  // a broken tag has no script
  return m.runner.unregister_script(key);
}

Error Engine::update(const std::vector<SourceUpdate>& updates) {
  DateTime time;
  {
    MutexLock lock(impl_->mu);  // now() reads the manual clock advance_clock() sets
    time = impl_->now();
  }
  return update(updates, time);
}

Error Engine::update(const std::vector<SourceUpdate>& updates, DateTime time) {
  return update_at(updates, time, UpdateOptions{});
}

Error Engine::update(const std::vector<SourceUpdate>& updates, const UpdateOptions& options) {
  DateTime time;
  {
    MutexLock lock(impl_->mu);
    time = impl_->now();
  }
  return update_at(updates, time, options);
}

Error Engine::update_at(const std::vector<SourceUpdate>& updates, DateTime time,
                        const UpdateOptions& o) {
  Impl& m = *impl_;
  std::vector<Dispatch> out;
  {
    MutexLock lock(m.mu);
    if (m.closing) return {ErrorCode::unavailable, "the tags engine is closing"};
    // Everything is checked before anything changes: ids, who may create a source, the counts,
    // one value's size, and what the sources would hold (total and the writer's uid).
    std::size_t new_sources = 0;
    // Bytes the update adds (per node: what it will hold minus what it holds, the node's whole
    // charge moving to this writer's uid); a second update of one id counts in full.
    std::size_t total_after = m.source_bytes;
    std::size_t uid_after = 0;
    if (auto it = m.usage.find(o.uid); it != m.usage.end()) uid_after = it->second.bytes;
    std::unordered_set<std::string_view> seen;
    for (const auto& u : updates) {
      if (u.tag.empty() || u.tag.size() > kMaxTagIdSize)
        return {ErrorCode::invalid_argument,
                "a tag id must be 1.." + std::to_string(kMaxTagIdSize) + " bytes"};
      const Node* n = m.find(u.tag);
      if (n != nullptr && n->is_virtual)
        return {ErrorCode::invalid_argument,
                "'" + u.tag + "' is a virtual tag: its value comes from its script"};
      const std::size_t vb = value_bytes(u.value.value);
      if (vb > m.opts.max_source_value_bytes)
        return {ErrorCode::invalid_argument,
                "the value of source tag '" + u.tag + "' is " + std::to_string(vb) +
                    " bytes, more than max_source_value_bytes (" +
                    std::to_string(m.opts.max_source_value_bytes) + ")"};
      const bool again = !seen.insert(u.tag).second;
      if (n == nullptr) {
        if (!o.may_create)
          return {ErrorCode::invalid_argument,
                  "unknown source tag '" + u.tag +
                      "': this writer may update the sources that exist (inputs of the defined "
                      "tags, or created by an admin) but not create one"};
        if (!again) {
          ++new_sources;
          total_after += u.tag.size() + vb;
          uid_after += u.tag.size() + vb;
        } else {
          total_after += vb;
          uid_after += vb;
        }
        continue;
      }
      std::size_t before = n->charged, after;
      if (again)
        after = before + vb;
      else if (n->component < 0)
        after = before - value_bytes(n->value.value) + vb;
      else if (!n->has_pending)
        after = before + vb;
      else if (n->queue_updates)
        after = before + vb;
      else
        after = before - value_bytes(n->pending.value) + vb;
      total_after = total_after - before + after;
      uid_after = uid_after - (n->charged_uid == o.uid ? before : 0) + after;
    }
    if (m.sources + new_sources > m.opts.max_sources)
      return {ErrorCode::invalid_argument,
              "more than max_sources (" + std::to_string(m.opts.max_sources) + ") source tags"};
    if (new_sources > 0 && o.owner != 0) {
      std::size_t mine = 0;
      if (auto it = m.usage.find(o.uid); it != m.usage.end()) mine = it->second.sources;
      if (mine + new_sources > o.max_uid_sources)
        return {ErrorCode::invalid_argument,
                "uid " + std::to_string(o.uid) + " has created " + std::to_string(mine) +
                    " source tags no tag uses; " + std::to_string(new_sources) +
                    " more would pass its max_uid_sources (" + std::to_string(o.max_uid_sources) +
                    ")"};
    }
    if (total_after > m.opts.max_source_bytes && total_after > m.source_bytes)
      return {ErrorCode::invalid_argument, "the source tags would hold " +
                                               std::to_string(total_after) +
                                               " bytes, more than max_source_bytes (" +
                                               std::to_string(m.opts.max_source_bytes) + ")"};
    if (uid_after > o.max_uid_bytes) {
      std::size_t now = 0;
      if (auto it = m.usage.find(o.uid); it != m.usage.end()) now = it->second.bytes;
      if (uid_after > now)
        return {ErrorCode::invalid_argument, "the source tags uid " + std::to_string(o.uid) +
                                                 " wrote would hold " + std::to_string(uid_after) +
                                                 " bytes, more than its max_uid_bytes (" +
                                                 std::to_string(o.max_uid_bytes) + ")"};
    }
    for (const auto& u : updates) {
      uint32_t idx;
      if (auto it = m.by_id.find(u.tag); it != m.by_id.end()) {
        idx = it->second;
      } else {
        idx = m.new_node(u.tag);
        ++m.sources;
        if (o.owner != 0) {
          m.nodes[idx]->owner = o.owner;
          m.nodes[idx]->owner_uid = o.uid;
          ++m.usage[o.uid].sources;
        }
      }
      Node& n = *m.nodes[idx];
      DataValue dv = u.value;
      dv.server_time = time;
      if (dv.source_time == DateTime{}) dv.source_time = time;
      dv.diagnostics.clear();
      if (n.component < 0) {
        n.value = std::move(dv);
        m.recharge(n, o.uid);
        continue;
      }
      m.mark_pending(n.component);
      Component& c = m.comps[n.component];
      if (!n.has_pending) {
        c.pending_sources.push_back(idx);
        n.pending = std::move(dv);
        n.has_pending = true;
      } else if (n.queue_updates) {  // every_update: queued, the oldest dropped past the bound
        n.queue_bytes += value_bytes(dv.value);
        n.queue.push_back(std::move(dv));
        if (n.queue.size() > m.opts.max_update_queue) {
          m.lost_update(idx, n.queue.front());
          n.queue_bytes -= value_bytes(n.queue.front().value);
          n.queue.pop_front();
        }
      } else {  // merged: the latest one wins, and the next output may say so (Overflow)
        m.lost_update(idx, n.pending);
        n.pending = std::move(dv);
      }
      m.recharge(n, o.uid);
      if (time > c.pending_time) c.pending_time = time;
    }
    m.counters.source_updates += updates.size();
    m.start_waves(&out);
  }
  run_dispatches(std::move(out));
  m.deliver();
  return {};
}

namespace {
// An on_read tag that a read evaluates first: never evaluated, or older than its max_age.
bool read_evaluates(const Node& n, DateTime now) {
  if (!n.is_virtual || n.broken || n.def.trigger.kind != TriggerKind::on_read) return false;
  const auto age = std::chrono::microseconds(now.unix_micros() - n.last_eval_time.unix_micros());
  return !n.evaluated || age > n.def.trigger.max_age;
}
}  // namespace

Error Engine::read_now(std::string_view id, DataValue* out, bool* would_wait) {
  Impl& m = *impl_;
  MutexLock lock(m.mu);
  *would_wait = false;
  const Node* n = m.find(id);
  if (n == nullptr) return {ErrorCode::invalid_argument, "unknown tag '" + std::string(id) + "'"};
  if (read_evaluates(*n, m.now()))
    *would_wait = true;
  else
    *out = n->value;
  return {};
}

Error Engine::read(std::string_view id, DataValue* out) {
  Impl& m = *impl_;
  MutexLock lock(m.mu);
  Node* n = m.find(id);
  if (n == nullptr) return {ErrorCode::invalid_argument, "unknown tag '" + std::string(id) + "'"};
  if (read_evaluates(*n, m.now())) {
    const uint64_t target = n->results;
    const uint32_t idx = m.by_id.at(std::string(id));
    const uint32_t gen = n->generation;
    m.add_root(*n);
    std::vector<Dispatch> ds;
    m.start_waves(&ds);
    lock.unlock();
    run_dispatches(std::move(ds));
    m.deliver();
    lock.lock();
    m.cv.wait_for(m.mu, m.opts.wait_timeout, [&]() REQUIRES(m.mu) {
      const Node& t = *m.nodes[idx];
      return m.closing || !t.alive || t.generation != gen || t.results > target;
    });
    if (m.closing) return {ErrorCode::unavailable, "the tags engine is closing"};
    n = m.find(id);
    if (n == nullptr)
      return {ErrorCode::invalid_argument, "tag '" + std::string(id) + "' was removed"};
  }
  *out = n->value;
  return {};
}

Error Engine::trigger(std::string_view id) {
  Impl& m = *impl_;
  std::vector<Dispatch> out;
  {
    MutexLock lock(m.mu);
    Node* n = m.find(id);
    if (n == nullptr || !n->is_virtual)
      return {ErrorCode::invalid_argument, "'" + std::string(id) + "' is not a virtual tag"};
    m.add_root(*n);
    m.start_waves(&out);
  }
  run_dispatches(std::move(out));
  m.deliver();
  return {};
}

void Engine::advance_clock(DateTime t) {
  Impl& m = *impl_;
  std::vector<Dispatch> out;
  {
    MutexLock lock(m.mu);
    m.manual_clock = t;
    m.manual_clock_set = true;
    if (!m.opts.real_time_periodic) {
      const int64_t now_us = t.unix_micros();
      for (uint32_t idx : m.topo_order) {
        Node& n = *m.nodes[idx];
        if (n.def.trigger.kind != TriggerKind::periodic || n.broken) continue;
        const int64_t period =
            std::chrono::duration_cast<std::chrono::microseconds>(n.def.trigger.period).count();
        if (!n.due_set) {
          n.next_due = t;
          n.due_set = true;
        }
        if (now_us < n.next_due.unix_micros()) continue;
        m.add_root(n);
        int64_t due = n.next_due.unix_micros() + period;
        if (due <= now_us) {  // missed periods: one evaluation for all of them
          const int64_t missed = (now_us - due) / period + 1;
          n.counters.coalesced += static_cast<uint64_t>(missed);
          m.counters.coalesced += static_cast<uint64_t>(missed);
          due += missed * period;
        }
        n.next_due = DateTime::from_unix_micros(due);
      }
    }
    m.start_waves(&out);
  }
  run_dispatches(std::move(out));
  m.deliver();
}

bool Engine::wait_idle(std::chrono::milliseconds timeout) {
  Impl& m = *impl_;
  MutexLock lock(m.mu);
  return m.cv.wait_for(m.mu, timeout, [&]() REQUIRES(m.mu) { return m.idle_locked(); });
}

Error Engine::logs(std::string_view id, uint64_t since, std::size_t limit, LogPage* out) const {
  const Impl& m = *impl_;
  MutexLock lock(m.mu);
  const Node* n = m.find(id);
  if (n == nullptr || !n->is_virtual)
    return {ErrorCode::invalid_argument, "unknown tag '" + std::string(id) + "'"};
  *out = n->logs ? n->logs->read(since, limit) : LogPage{};
  return {};
}

Error Engine::info(std::string_view id, TagInfo* out) const {
  const Impl& m = *impl_;
  MutexLock lock(m.mu);
  const Node* n = m.find(id);
  if (n == nullptr) return {ErrorCode::invalid_argument, "unknown tag '" + std::string(id) + "'"};
  out->definition = n->def;
  out->value = n->value;
  out->counters = n->counters;
  if (n->is_virtual) out->counters.state_store = m.state_note_of(*n);
  out->version = n->version;
  return {};
}

std::vector<std::string> Engine::ids() const {
  const Impl& m = *impl_;
  MutexLock lock(m.mu);
  std::vector<std::string> r;
  r.reserve(m.topo_order.size());
  for (uint32_t i : m.topo_order) r.push_back(m.nodes[i]->id);
  return r;
}

bool Engine::read_would_wait(std::string_view id) const {
  MutexLock lock(impl_->mu);
  const Node* n = impl_->find(id);
  return n != nullptr && read_evaluates(*n, impl_->now());
}

bool Engine::contains(std::string_view id) const {
  MutexLock lock(impl_->mu);
  return impl_->find(id) != nullptr;
}

std::size_t Engine::size() const {
  MutexLock lock(impl_->mu);
  return impl_->topo_order.size();
}

Error Engine::page(std::string_view after, std::size_t limit, std::size_t max_bytes,
                   std::vector<TagInfo>* out, bool* more) const {
  const Impl& m = *impl_;
  MutexLock lock(m.mu);
  out->clear();
  *more = false;
  std::size_t start = 0;
  if (!after.empty()) {
    const Node* n = m.find(after);
    if (n == nullptr || !n->is_virtual ||
        static_cast<std::size_t>(n->topo) >= m.topo_order.size() ||
        m.topo_order[n->topo] != n->self)
      return {ErrorCode::invalid_argument,
              "the cursor '" + std::string(after) + "' is not a virtual tag any more; start again"};
    start = static_cast<std::size_t>(n->topo) + 1;
  }
  std::size_t bytes = 0;
  std::size_t i = start;
  for (; i < m.topo_order.size() && out->size() < limit; ++i) {
    const Node& n = *m.nodes[m.topo_order[i]];
    std::size_t b = 256 + n.id.size() + value_bytes(n.value.value) + n.value.diagnostics.size() +
                    n.counters.last_error.size();
    for (const auto& in : n.def.inputs) b += 64 + in.tag.size() + in.name.size();
    if (!out->empty() && bytes + b > max_bytes) break;
    bytes += b;
    TagInfo info;
    TagDefinition& d = info.definition;
    d.id = n.def.id.empty() ? n.id : n.def.id;
    d.inputs = n.def.inputs;
    d.type = n.def.type;
    d.trigger = n.def.trigger;
    d.timestamps = n.def.timestamps;
    d.keep_state = n.def.keep_state;
    d.reset_state = n.def.reset_state;
    d.max_state_bytes = n.def.max_state_bytes;
    d.last_usable = n.def.last_usable;
    d.evaluate_bad_inputs = n.def.evaluate_bad_inputs;
    d.every_update = n.def.every_update;
    d.location = n.def.location;
    d.config_error = n.def.config_error;
    info.value = n.value;
    info.counters = n.counters;
    info.counters.state_store = m.state_note_of(n);
    info.version = n.version;
    out->push_back(std::move(info));
  }
  *more = i < m.topo_order.size();
  return {};
}

std::size_t Engine::forget_sources(uint64_t owner) {
  if (owner == 0) return 0;
  Impl& m = *impl_;
  MutexLock lock(m.mu);
  std::size_t freed = 0;
  for (uint32_t i = 0; i < m.nodes.size(); ++i) {
    Node& n = *m.nodes[i];
    if (!n.alive || n.is_virtual || n.owner != owner) continue;
    if (!n.dependents.empty()) {  // a tag uses it: the definitions' now
      m.disown(n);
      continue;
    }
    m.free_node(i);
    --m.sources;
    ++freed;
  }
  return freed;
}

SourceUsage Engine::source_usage() const {
  MutexLock lock(impl_->mu);
  return SourceUsage{impl_->sources, impl_->source_bytes};
}

SourceUsage Engine::source_usage(uint32_t uid) const {
  MutexLock lock(impl_->mu);
  auto it = impl_->usage.find(uid);
  return it == impl_->usage.end() ? SourceUsage{} : it->second;
}

EngineCounters Engine::counters() const {
  MutexLock lock(impl_->mu);
  EngineCounters c = impl_->counters;
  for (const auto& comp : impl_->comps) c.waves_waiting += comp.running || comp.pending ? 1 : 0;
  return c;
}

}  // namespace outrun::tags
