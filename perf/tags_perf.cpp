#include "tags_perf.h"

#include <cmath>
#include <cstdio>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "floors.h"
#include "measure.h"
#include "outrun/in_process.h"
#include "outrun/tags.h"
#include "state_store.h"

namespace outrun::perf {

namespace {

struct TagsFig {
  PacedFig paced;
  double evals_per_update = 0;
  double coalesced = 0;
};

std::vector<tags::TagDefinition> workload(int groups, bool keep_state) {
  std::vector<tags::TagDefinition> defs;
  auto tag = [&](std::string id, std::string script, std::vector<std::string> inputs) {
    tags::TagDefinition d;
    d.id = std::move(id);
    d.script = keep_state ? "state.n = (state.n or 0) + 1 " + script : script;
    for (auto& i : inputs) {
      tags::InputSpec in;
      in.tag = i;
      d.inputs.push_back(in);
    }
    d.keep_state = keep_state;
    defs.push_back(std::move(d));
  };
  for (int g = 0; g < groups; ++g) {
    const std::string n = std::to_string(g);
    tag("A" + n, "return inputs.S" + n + " * 2", {"S" + n});
    tag("B" + n, "return inputs.S" + n + " + 1", {"S" + n});
    tag("C" + n, "return inputs.A" + n + " + inputs.B" + n, {"A" + n, "B" + n});
    tag("D" + n, "return inputs.C" + n + " / 2", {"C" + n});
  }
  return defs;
}

// One paced run of the workload over `runner`; nullopt-like false on failure.
bool run_tags(Runner& runner, const TagsParams& tp, bool keep_state, const std::vector<int>& pids,
              TagsFig* out, std::shared_ptr<tags::StateSink> sink = nullptr) {
  const int G = tp.groups;
  // The latest send of each group and the first not yet completed: a coalesced update completes
  // with the later one that carried it.
  std::vector<int64_t> next_done(static_cast<std::size_t>(G));
  for (int g = 0; g < G; ++g) next_done[static_cast<std::size_t>(g)] = g;
  std::unordered_map<std::string, int> d_group;
  for (int g = 0; g < G; ++g) d_group.emplace("D" + std::to_string(g), g);
  std::mutex mu;
  Paced* pacer = nullptr;
  bool measuring = false;
  tags::TagsOptions to;
  to.state_sink = std::move(sink);
  to.on_change = [&](const std::vector<tags::Change>& batch) {
    for (const auto& c : batch) {
      auto it = d_group.find(c.tag);
      if (it == d_group.end() || pacer == nullptr) continue;
      const int g = it->second;
      const auto* d = std::get_if<double>(&c.value.value.v);
      if (d == nullptr) continue;  // the initial evaluation, before any send
      const int64_t i = std::llround((2 * *d - 1) / 3);
      std::lock_guard lock(mu);
      int64_t& nd = next_done[static_cast<std::size_t>(g)];
      // Good, with the Overflow bit when updates of the group were merged (design/tags.md).
      const bool correct =
          i % G == g && (c.value.status & ~tags::kOverflowBits) == tags::codes::Good;
      for (; nd <= i; nd += G) pacer->complete(nd, correct);
    }
  };
  std::unique_ptr<tags::Engine> engine;
  if (Error e = tags::Engine::create(runner, to, &engine)) return false;
  if (Error e = engine->apply(workload(G, keep_state))) {
    std::fprintf(stderr, "outrun-perf: tags: %s\n", e.message.c_str());
    return false;
  }
  engine->wait_idle();
  const uint64_t evals0 = engine->counters().evaluations;
  const uint64_t coal0 = engine->counters().coalesced;
  Paced p(tp.rate, tp.warmup_s, tp.duration_s);
  pacer = &p;
  Window w;
  w.pids = pids;
  std::vector<std::string> sources;
  for (int g = 0; g < G; ++g) sources.push_back("S" + std::to_string(g));
  uint64_t evals_start = evals0;
  const bool drained = p.run(
      [&](int64_t i) {
        std::vector<tags::SourceUpdate> u(1);
        u[0].tag = sources[static_cast<std::size_t>(i % G)];
        u[0].value.value = Value(i);
        u[0].value.status = tags::codes::Good;
        (void)engine->update(u);
      },
      [&] {
        measuring = true;
        evals_start = engine->counters().evaluations;
        w.start();
      });
  w.stop();
  (void)measuring;
  out->paced = paced_fig(p, w, drained);
  const auto c = engine->counters();
  out->evals_per_update =
      static_cast<double>(c.evaluations - evals_start) / static_cast<double>(p.measured());
  out->coalesced = static_cast<double>(c.coalesced - coal0);
  engine->wait_idle();
  engine.reset();
  return true;
}

void put(Figs& f, const std::string& prefix, const TagsFig& t) {
  f[prefix + "p50_us"] = t.paced.lat.p50_us;
  f[prefix + "p99_us"] = t.paced.lat.p99_us;
  f[prefix + "p999_us"] = t.paced.lat.p999_us;
  f[prefix + "host_us_per_update"] = t.paced.us_per_msg;
  f[prefix + "workers_us_per_update"] = t.paced.other_us_per_msg;
  f[prefix + "evals_per_update"] = t.evals_per_update;
  f[prefix + "coalesced_count"] = t.coalesced;
}

}  // namespace

bool tags_section(const TagsParams& tp, const HostOptions& ho, Figs& f,
                  const std::function<void(double, double)>& count) {
  auto counted = [&](const TagsFig& t) {
    count(static_cast<double>(t.paced.measured), static_cast<double>(t.paced.wrong));
  };
  {
    std::unique_ptr<Host> host;
    if (Error err = Host::create(ho, &host)) {
      std::fprintf(stderr, "outrun-perf: tags: cannot start the host: %s\n", err.message.c_str());
      return false;
    }
    TagsFig t;
    if (!run_tags(*host, tp, false, host->worker_pids(), &t)) return false;
    put(f, "tags.", t);
    counted(t);
    TagsFig k;
    if (!run_tags(*host, tp, true, host->worker_pids(), &k)) return false;
    put(f, "tags.keep_state_", k);
    counted(k);
    f["tags.keep_state_extra_us_per_update"] = k.paced.us_per_msg - t.paced.us_per_msg;
    if (!tp.state_dir.empty()) {
      // keep_state with outrund's state store (design/daemon.md "State store"), 1 s commits.
      std::remove((tp.state_dir + "/" + daemon::kStateFileName).c_str());
      std::shared_ptr<daemon::StateStore> store;
      daemon::StateStoreOpened opened;
      std::string err;
      daemon::StateStoreOptions so;
      so.dir = tp.state_dir;
      if (!daemon::StateStore::open(so, &store, &opened, &err)) {
        std::fprintf(stderr, "outrun-perf: tags: %s\n", err.c_str());
        return false;
      }
      TagsFig s;
      if (!run_tags(*host, tp, true, host->worker_pids(), &s, store)) return false;
      store->close();
      put(f, "tags.state_store_", s);
      counted(s);
      f["tags.state_store_extra_us_per_update"] = s.paced.us_per_msg - k.paced.us_per_msg;
    }
  }
  InProcess ip;
  TagsFig i;
  if (!run_tags(ip, tp, false, {}, &i)) return false;
  put(f, "tags.inproc_", i);
  counted(i);
  return true;
}

}  // namespace outrun::perf
