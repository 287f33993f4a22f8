// outrun tags run -f TAGS_FILE [--updates FILE|-] [--in-process] [--json] [--shards K]
//                [--timeout MS]
// The offline runner of design/tags.md: defines the tags of a TOML file, feeds one wave per JSON
// line and prints every output change. Same input, same output: the evaluation time is each
// wave's `t`, periodic tags run on that clock, and each wave is finished before the next starts.
#include "tags_cmd.h"

#include <signal.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include "json_values.h"
#include "outrun/client.h"
#include "outrun/host.h"
#include "outrun/in_process.h"
#include "outrun/tags.h"
#include "tags_file.h"

namespace outrun::cli {

namespace {

struct TagsRunArgs {
  std::string file;
  std::string updates;
  bool in_process = false;
  bool json = false;
  bool strict = false;
  int shards = 1;
  int timeout_ms = 100;
};

std::string escape_text(std::string_view s) {
  return tags::file::printable(s);
}

void print_change(const tags::Change& c, bool json, const char* kind = nullptr) {
  if (json) {
    nlohmann::ordered_json j = tags::file::change_to_json(c.tag, c.value);
    if (kind) j["kind"] = kind;
    std::cout << j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
    return;
  }
  std::cout << escape_text(c.tag) << " = " << escape_text(to_display_string(c.value.value)) << "  "
            << tags::status_code_name(c.value.status);
  if (c.value.source_time.ticks != 0) std::cout << "  " << format_datetime(c.value.source_time);
  if (!c.value.diagnostics.empty()) std::cout << "  (" << escape_text(c.value.diagnostics) << ")";
  if (kind) std::cout << "  [" << kind << "]";
  std::cout << "\n";
}

DateTime wall_now() {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  return DateTime::from_unix_micros(us);
}

int run_tags(const TagsRunArgs& a) {
  std::vector<tags::TagDefinition> defs;
  std::string err;
  {
    std::vector<std::string> file_errors;
    if (!tags::file::load_tags_file(a.file, &defs, &file_errors)) {
      for (const auto& line : tags::file::describe_errors(file_errors, {}))
        std::cerr << "outrun: " << line << "\n";
      return 2;
    }
  }
  std::istream* in = nullptr;
  std::ifstream updates_file;
  if (a.updates == "-") {
    in = &std::cin;
  } else if (!a.updates.empty()) {
    updates_file.open(a.updates, std::ios::binary);
    if (!updates_file) {
      std::cerr << "outrun: cannot read '" << a.updates << "'\n";
      return 2;
    }
    in = &updates_file;
  }
  const std::string updates_name = a.updates == "-" ? "<stdin>" : a.updates;

  std::unique_ptr<Host> host;
  std::unique_ptr<InProcess> inproc;
  Runner* runner = nullptr;
  if (a.in_process) {
    InProcessOptions o;
    o.timeout = std::chrono::milliseconds(a.timeout_ms);
    inproc = std::make_unique<InProcess>(o);
    runner = inproc.get();
  } else {
    HostOptions o;
    o.shards = a.shards;
    o.timeout = std::chrono::milliseconds(a.timeout_ms);
    if (Error e = Host::create(o, &host)) {
      std::cerr << "outrun: " << to_string(e.code) << ": " << e.message << "\n";
      return 3;
    }
    runner = host.get();
  }

  std::mutex mu;
  std::vector<tags::Change> pending;
  DateTime clock = wall_now();
  tags::TagsOptions to;
  to.on_change = [&](const std::vector<tags::Change>& batch) {
    std::lock_guard lock(mu);
    pending.insert(pending.end(), batch.begin(), batch.end());
  };
  to.clock = [&] {
    std::lock_guard lock(mu);
    return clock;
  };
  to.real_time_periodic = false;
  std::unique_ptr<tags::Engine> engine;
  if (Error e = tags::Engine::create(*runner, to, &engine)) {
    std::cerr << "outrun: " << e.message << "\n";
    return 3;
  }
  std::unordered_map<std::string, std::size_t> order;
  auto order_of = [&](const std::string& id) {
    auto it = order.find(id);
    return it == order.end() ? order.size() : it->second;
  };
  auto flush = [&] {
    engine->wait_idle(std::chrono::milliseconds(60000));
    std::vector<tags::Change> out;
    {
      std::lock_guard lock(mu);
      out.swap(pending);
    }
    // Components run concurrently over workers: order the changes of one line by the graph's
    // topological order (stable: one tag's changes keep their order), so output is deterministic.
    std::stable_sort(out.begin(), out.end(), [&](const tags::Change& x, const tags::Change& y) {
      return order_of(x.tag) < order_of(y.tag);
    });
    for (const auto& c : out) print_change(c, a.json);
  };

  // The first wave's time is the time of the definitions, so that a file of waves gives the same
  // output on every run.
  std::string line;
  std::size_t line_no = 0;
  bool have_line = false;
  tags::file::Wave wave;
  auto next_wave = [&]() -> int {  // 1: a wave, 0: end, 2: error
    while (in != nullptr && std::getline(*in, line)) {
      ++line_no;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      if (!tags::file::parse_wave(line, &wave, &err)) {
        std::cerr << "outrun: " << escape_text(updates_name) << ":" << line_no << ": "
                  << escape_text(err) << "\n";
        return 2;
      }
      return 1;
    }
    return 0;
  };
  int r = next_wave();
  if (r == 2) return 2;
  have_line = r == 1;
  if (have_line && wave.has_time) {
    std::lock_guard lock(mu);
    clock = wave.time;
  }
  // Every broken definition is reported (FILE:LINE:COL); not strict, the others run and the
  // broken ones show BadConfigurationError, and the exit code is 1 at the end.
  tags::ApplyOptions ao;
  ao.strict = a.strict;
  tags::ApplyResult applied;
  const Error apply_error = engine->apply(defs, ao, &applied);
  for (const auto& problem : tags::file::describe_errors({}, applied.errors))
    std::cerr << "outrun: " << problem << "\n";
  if (apply_error) {
    if (applied.errors.empty())
      std::cerr << "outrun: " << escape_text(a.file) << ": " << to_string(apply_error.code) << ": "
                << escape_text(apply_error.message) << "\n";
    return 1;
  }
  const int done = applied.errors.empty() ? 0 : 1;
  for (const auto& id : engine->ids()) order.emplace(id, order.size());
  engine->advance_clock(to.clock());
  flush();
  while (have_line) {
    const DateTime t = wave.has_time ? wave.time : wall_now();
    {
      std::lock_guard lock(mu);
      clock = t;
    }
    engine->advance_clock(t);
    if (Error e = engine->update(wave.updates, t)) {
      std::cerr << "outrun: " << escape_text(updates_name) << ":" << line_no << ": "
                << escape_text(e.message) << "\n";
      return 2;
    }
    for (const auto& id : wave.triggers) {
      if (Error e = engine->trigger(id)) {
        std::cerr << "outrun: " << escape_text(updates_name) << ":" << line_no << ": "
                  << escape_text(e.message) << "\n";
        return 2;
      }
    }
    flush();
    for (const auto& id : wave.reads) {
      tags::DataValue dv;
      if (Error e = engine->read(id, &dv)) {
        std::cerr << "outrun: " << escape_text(updates_name) << ":" << line_no << ": "
                  << escape_text(e.message) << "\n";
        return 2;
      }
      flush();
      print_change({id, dv}, a.json, "read");
    }
    r = next_wave();
    if (r == 2) return 2;
    have_line = r == 1;
  }
  return done;
}

// ---- Through outrund ----

struct DaemonArgs {
  const std::string* socket = nullptr;
  std::string file;
  bool replace = false;
  bool json = false;
  std::vector<std::string> ids;
};

int exit_for(const Error& e) {
  return e.code == ErrorCode::unavailable ? 3 : e.code == ErrorCode::invalid_argument ? 2 : 1;
}

int fail(const Error& e, const std::string& where = {}) {
  std::cerr << "outrun: " << where << to_string(e.code) << ": " << escape_text(e.message) << "\n";
  return exit_for(e);
}

int connect_daemon(const DaemonArgs& a, std::unique_ptr<Client>* out) {
  ClientOptions o;
  if (a.socket) o.socket = *a.socket;
  o.name = "outrun-tags";
  o.reply_timeout = std::chrono::milliseconds(60000);
  if (Error e = Client::connect(o, out)) {
    fail(e);
    return 3;
  }
  return 0;
}

std::string dump(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

int tags_define(const DaemonArgs& a) {
  std::ifstream in(a.file, std::ios::binary);
  if (!in) {
    std::cerr << "outrun: cannot read '" << a.file << "'\n";
    return 2;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  std::unique_ptr<Client> c;
  if (int r = connect_daemon(a, &c)) return r;
  std::string json;
  if (Error e = c->define_tags(ss.str(), a.replace, &json)) return fail(e, a.file + ": ");
  const auto doc = nlohmann::json::parse(json, nullptr, false);
  if (a.json || doc.is_discarded()) {
    std::cout << json << "\n";
  } else {
    // What changed, as a person reads it: one line per kind, the ids after the count.
    auto line = [&](const char* what, const char* key) {
      if (!doc.contains(key) || !doc[key].is_array()) return;
      std::cout << what << ": " << doc[key].size();
      std::size_t shown = 0;
      for (const auto& id : doc[key]) {
        if (!id.is_string()) continue;
        if (++shown > 20) {
          std::cout << " ...";
          break;
        }
        std::cout << (shown == 1 ? "  " : ", ") << escape_text(id.get<std::string>());
      }
      std::cout << "\n";
    };
    line("defined or changed", "changed");
    line("unchanged", "unchanged");
    line("removed", "removed");
    line("broken (BadConfigurationError)", "broken");
  }
  // Every broken definition, named by this file's LINE:COL; exit 1 when there is one.
  int rc = 0;
  if (!doc.is_discarded() && doc.contains("errors") && doc["errors"].is_array())
    for (const auto& e : doc["errors"]) {
      const std::string loc = e.value("location", "");
      std::cerr << "outrun: " << escape_text(a.file) << (loc.empty() ? "" : ":") << escape_text(loc)
                << ": " << escape_text(e.value("message", "")) << "\n";
      rc = 1;
    }
  return rc;
}

// The DataValue shown for a tag outrund does not know.
tags::DataValue unknown_tag(const std::string& why) {
  tags::DataValue dv;
  dv.status = tags::codes::BadNodeIdUnknown;
  dv.diagnostics = why;
  return dv;
}

int tags_list(const DaemonArgs& a) {
  std::unique_ptr<Client> c;
  if (int r = connect_daemon(a, &c)) return r;
  std::string json;
  if (Error e = c->list_tags_json(&json)) return fail(e);
  if (a.json) {
    std::cout << json << "\n";
    return 0;
  }
  const auto doc = nlohmann::json::parse(json, nullptr, false);
  if (doc.is_discarded() || !doc.contains("tags")) {
    std::cerr << "outrun: outrund sent a document that is not JSON\n";
    return 1;
  }
  for (const auto& t : doc["tags"]) {
    const auto& v = t.value("value", nlohmann::json::object());
    const auto& k = t.value("counters", nlohmann::json::object());
    std::cout << escape_text(t.value("id", "")) << "  " << escape_text(v.value("status", "?"))
              << "  "
              << escape_text(
                     v.contains("value")
                         ? v["value"].dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                         : "null")
              << "  evaluations=" << k.value("evaluations", uint64_t{0});
    // The counters of `outrun stats` "tags" and the OPC UA Diagnostics, per tag.
    if (k.contains("by_status") && k["by_status"].is_object())
      for (auto it = k["by_status"].begin(); it != k["by_status"].end(); ++it)
        if (it.key() != "ok") std::cout << " " << escape_text(it.key()) << "=" << it.value();
    for (const char* key : {"coalesced", "overflows", "skipped_bad", "busy"})
      if (k.value(key, uint64_t{0}) > 0 || std::string_view(key) == "coalesced")
        std::cout << " " << key << "=" << k.value(key, uint64_t{0});
    const std::string err = k.value("last_error", "");
    if (!err.empty()) std::cout << "  last_error=" << escape_text(err);
    std::cout << "\n";
  }
  return 0;
}

int tags_update(const DaemonArgs& a) {
  std::istream* in = &std::cin;
  std::ifstream f;
  if (a.file != "-") {
    f.open(a.file, std::ios::binary);
    if (!f) {
      std::cerr << "outrun: cannot read '" << a.file << "'\n";
      return 2;
    }
    in = &f;
  }
  const std::string name = a.file == "-" ? "<stdin>" : a.file;
  std::unique_ptr<Client> c;
  if (int r = connect_daemon(a, &c)) return r;
  std::string line, err;
  std::size_t line_no = 0;
  while (std::getline(*in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = name + ":" + std::to_string(line_no) + ": ";
    tags::file::Wave wave;
    if (!tags::file::parse_wave(line, &wave, &err)) {
      std::cerr << "outrun: " << where << escape_text(err) << "\n";
      return 2;
    }
    if (!wave.triggers.empty()) {
      std::cerr << "outrun: " << where << "\"trigger\" is not available through outrund\n";
      return 2;
    }
    if (!wave.updates.empty())
      if (Error e = c->update_sources(wave.updates, wave.has_time ? wave.time : DateTime{}))
        return fail(e, where);
    if (!wave.reads.empty()) {
      std::vector<tags::Change> values;
      if (Error e = c->read_tags(wave.reads, &values)) return fail(e, where);
      for (const auto& v : values) print_change(v, true, "read");
    }
  }
  return 0;
}

int tags_read(const DaemonArgs& a) {
  std::unique_ptr<Client> c;
  if (int r = connect_daemon(a, &c)) return r;
  std::vector<tags::Change> values;
  Error e = c->read_tags(a.ids, &values);
  if (!e) {
    for (const auto& v : values) print_change(v, a.json);
    return 0;
  }
  if (e.code != ErrorCode::invalid_argument || a.ids.size() < 2) {
    if (e.code == ErrorCode::invalid_argument && a.ids.size() == 1) {
      print_change({a.ids[0], unknown_tag(e.message)}, a.json);
      return 1;
    }
    return fail(e);
  }
  // outrund refuses a read naming an unknown tag as a whole; read each alone, so that the
  // others are answered and each unknown one is marked BadNodeIdUnknown (OPC UA's answer).
  int rc = 0;
  for (const auto& id : a.ids) {
    std::vector<tags::Change> one;
    if (Error e1 = c->read_tags({id}, &one)) {
      if (e1.code != ErrorCode::invalid_argument) return fail(e1);
      print_change({id, unknown_tag(e1.message)}, a.json);
      rc = 1;
    } else {
      for (const auto& v : one) print_change(v, a.json);
    }
  }
  return rc;
}

int tags_remove(const DaemonArgs& a) {
  std::unique_ptr<Client> c;
  if (int r = connect_daemon(a, &c)) return r;
  if (Error e = c->remove_tags(a.ids)) return fail(e);
  std::cout << "removed: " << a.ids.size() << "\n";
  return 0;
}

int tags_watch(const DaemonArgs& a) {
  // SIGINT/SIGTERM are taken with sigtimedwait: blocked before the reader thread starts.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::unique_ptr<Client> c;
  if (int r = connect_daemon(a, &c)) return r;
  std::mutex out_mu;
  Error e = c->subscribe(a.ids, [&](const std::vector<tags::Change>& changes) {
    std::lock_guard lock(out_mu);
    for (const auto& ch : changes)
      std::cout << dump(tags::file::change_to_json(ch.tag, ch.value)) << "\n";
    std::cout.flush();
  });
  if (e) return fail(e);
  for (;;) {
    timespec ts{0, 200 * 1000 * 1000};
    const int sig = sigtimedwait(&set, nullptr, &ts);
    if (sig == SIGINT || sig == SIGTERM) break;
    if (!c->connected()) {
      std::cerr << "outrun: the connection to outrund was lost\n";
      return 3;
    }
  }
  return 0;
}

}  // namespace

void add_tags_commands(CLI::App& app, int* rc, const std::string* socket) {
  auto* tags_cmd = app.add_subcommand("tags", "virtual tags (design/tags.md)");
  tags_cmd->require_subcommand(1);
  auto args = std::make_shared<TagsRunArgs>();
  auto* run = tags_cmd->add_subcommand(
      "run", "offline: define the tags of a TOML file, feed waves of updates, print the changes");
  run->add_option("-f,--file", args->file, "tags file (TOML)")->required();
  run->add_option("--updates", args->updates, "JSON lines, one wave per line ('-': stdin)");
  run->add_flag("--in-process", args->in_process, "run the scripts in this process (trusted)");
  run->add_flag("--json", args->json, "print JSON lines");
  run->add_flag("--strict", args->strict,
                "refuse the whole file when a definition is broken (exit 1), instead of running "
                "the others");
  run->add_option("--shards", args->shards, "worker processes")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  run->add_option("--timeout", args->timeout_ms, "soft timeout T per evaluation, ms")
      ->check(CLI::Range(1, 3600000))
      ->capture_default_str();
  run->callback([args, rc] { *rc = run_tags(*args); });
  add_tags_test_command(*tags_cmd, rc);

  auto d = std::make_shared<DaemonArgs>();
  d->socket = socket;
  auto* define =
      tags_cmd->add_subcommand("define", "outrund: define the tags of a TOML file (admin)");
  define->add_option("-f,--file", d->file, "tags file (TOML; no script_file)")->required();
  define->add_flag("--replace", d->replace, "remove the daemon's tags that are not in the file");
  define->add_flag("--json", d->json, "print the daemon's JSON answer");
  define->callback([d, rc] { *rc = tags_define(*d); });
  auto* list = tags_cmd->add_subcommand("list", "outrund: the tags, their values and counters");
  list->add_flag("--json", d->json, "the daemon's JSON document");
  list->callback([d, rc] { *rc = tags_list(*d); });
  auto* update =
      tags_cmd->add_subcommand("update", "outrund: one wave of source updates per JSON line");
  update->add_option("-f,--file", d->file, "JSON lines ('-': stdin)")->required();
  update->callback([d, rc] { *rc = tags_update(*d); });
  auto* watch =
      tags_cmd->add_subcommand("watch", "outrund: print changes as JSON lines until SIGINT");
  watch->add_option("tags", d->ids, "tags to watch (none: all)");
  watch->callback([d, rc] { *rc = tags_watch(*d); });
  auto* read = tags_cmd->add_subcommand("read", "outrund: the current values of tags");
  read->add_option("tags", d->ids, "tags")->required();
  read->add_flag("--json", d->json, "JSON lines");
  read->callback([d, rc] { *rc = tags_read(*d); });
  auto* remove = tags_cmd->add_subcommand("remove", "outrund: remove virtual tags (admin)");
  remove->add_option("tags", d->ids, "tags")->required();
  remove->callback([d, rc] { *rc = tags_remove(*d); });
}

}  // namespace outrun::cli
