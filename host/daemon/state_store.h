// The tags' state store: keep_state states and the last published DataValue of each virtual tag
// in an SQLite file (WAL) under outrund's state_dir, so that they survive a restart of outrund
// (design/daemon.md "State store", D-state-store).
//
// The engine tells the store (tags::StateSink) under its lock; the store only keeps the latest
// row of each tag in memory (one per tag: the handoff is bounded by the number of tags) and a
// writer thread of its own writes them, one transaction per flush interval. A wave never waits
// for the disk; a SIGKILL loses at most the last interval.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "outrun/tags.h"
#include "outrun/thread_annotations.h"

struct sqlite3;

namespace outrun::daemon {

struct StateStoreOptions {
  std::string dir;  // the file is dir/kStateFileName; the directory must exist
  // The longest a published value or state waits in memory before the writer commits it: what a
  // SIGKILL (or a power loss) can lose.
  std::chrono::milliseconds flush_interval{1000};
  // What the rows hold together (ids, values, states, as stored). A row that would pass it is
  // stored without its state (the tag's diagnostics and the log say so).
  std::size_t max_bytes = std::size_t{256} << 20;
};

inline constexpr const char* kStateFileName = "tags-state.sqlite";
// The schema's version (the `meta` table's row 'version'); another version is set aside.
inline constexpr int kStateFormatVersion = 1;
// A stored state is never larger than what the engine accepts for max_state_bytes.
inline constexpr std::size_t kMaxStoredStateBytes = 8u << 20;

// What open() found.
struct StateStoreOpened {
  std::vector<tags::RestoredTag> rows;  // each tag's row; a bad row has `problem` set
  // The file could not be used (not SQLite, torn, failed quick_check, another version) and was
  // renamed to this path; the store started empty. "" otherwise.
  std::string set_aside;
  std::string set_aside_reason;
  std::size_t bad_rows = 0;
};

class StateStore final : public tags::StateSink {
 public:
  // Opens (or creates) the store and reads every row. A file that cannot be used is renamed
  // `<file>.corrupt-<UTC time>` and a new one is made; false (with *error) only when no store
  // can be made at all (the directory is not writable). Logs what it found.
  static bool open(const StateStoreOptions& options, std::shared_ptr<StateStore>* out,
                   StateStoreOpened* opened, std::string* error);
  ~StateStore() override;  // close()
  StateStore(const StateStore&) = delete;
  StateStore& operator=(const StateStore&) = delete;

  // Writes what is pending, stops the writer and closes the file (SIGTERM). Idempotent; what
  // the engine says after it is dropped.
  void close() EXCLUDES(mu_);
  // Waits until everything told before this call is committed (tests, perf).
  void flush() EXCLUDES(mu_);

  // tags::StateSink (any thread, with the engine's lock held: a map insert, no I/O).
  void saved(const std::string& id, const tags::DataValue& value, const Value* state,
             const std::string& script_sha256) override EXCLUDES(mu_);
  void removed(const std::string& id) override EXCLUDES(mu_);
  std::string note(const std::string& id) override EXCLUDES(mu_);

  // Bytes the rows hold (as max_bytes counts them), as of the last commit.
  std::size_t stored_bytes() const EXCLUDES(mu_);

 private:
  struct Row {
    bool erase = false;
    tags::DataValue value;
    bool has_state = false;
    Value state;
    std::string script_sha256;
  };
  StateStore(StateStoreOptions options, sqlite3* db);
  void writer_main() EXCLUDES(mu_);
  // One transaction with every row of `batch` (the writer thread's).
  void write(std::unordered_map<std::string, Row>& batch) EXCLUDES(mu_);

  const StateStoreOptions opts_;
  sqlite3* db_;  // the writer thread's once it runs (open() and close() before and after)
  std::thread writer_;

  mutable Mutex mu_;                                              // guards the handoff below
  CondVar cv_;                                                    // a flush asked for, close
  std::unordered_map<std::string, Row> pending_ GUARDED_BY(mu_);  // latest per tag
  std::unordered_map<std::string, std::string> notes_ GUARDED_BY(mu_);
  bool closing_ GUARDED_BY(mu_) = false;
  bool closed_ GUARDED_BY(mu_) = false;
  uint64_t flush_asked_ GUARDED_BY(mu_) = 0;  // flush() calls so far
  uint64_t flush_done_ GUARDED_BY(mu_) = 0;   // of those, the ones a commit has covered
  std::size_t total_ GUARDED_BY(mu_) = 0;     // copy of the writer's total, for stored_bytes()

  // The writer thread's: each stored row's bytes, and their sum.
  std::unordered_map<std::string, std::size_t> sizes_;
  std::size_t bytes_ = 0;
};

}  // namespace outrun::daemon
