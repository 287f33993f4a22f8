// outrun::Client: the Runner interface over a connection to the outrund daemon
// (design/daemon.md). Scripts run in the daemon's workers; this process only sends frames.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "outrun/runner.h"
#include "outrun/tags.h"

namespace outrun {

struct ClientOptions {
  // Path of the daemon's socket. Empty: $OUTRUN_SOCKET, else the daemon's default
  // (/run/outrun/outrund.sock as root, $XDG_RUNTIME_DIR/outrun/outrund.sock otherwise).
  std::string socket;
  // Shown in the daemon's logs.
  std::string name = "outrun::Client";
  // How long connect() waits for the daemon's hello, and register/control calls for their reply.
  std::chrono::milliseconds reply_timeout{10000};
  // Who may be listening on `socket`: connect() checks the server's SO_PEERCRED uid before it
  // sends anything and fails `unavailable` for any other. Empty: this process's uid and root.
  // (A daemon run under a dedicated service user needs that user's uid here.)
  std::vector<uint32_t> server_uids;
};

class Client final : public Runner {
 public:
  // Connects and exchanges hellos. Fails with `unavailable` when no daemon listens there or it
  // refused this process (the daemon's message says why: permission, too many clients).
  static Error connect(const ClientOptions& options, std::unique_ptr<Client>* out);

  // Closes the connection; evaluations still in flight end `cancelled` before this returns.
  ~Client() override;

  // Registration goes to the daemon (a round trip); the handle is valid while this Client lives.
  Error register_script(std::string_view key, std::string_view source, Script* out) override;
  // With options.check, outrund compile-checks the source first: `compile_error` ("KEY:LINE:
  // ...") and nothing registered when it does not compile (design/decisions.md D-register-check).
  Error register_script(std::string_view key, std::string_view source, Script* out,
                        const RegisterOptions& options);
  // Unregistration goes to the daemon (a round trip). Any client may unregister any key.
  Error unregister_script(std::string_view key) override;
  // Callbacks and futures complete on the client's reader thread. A callback should not block:
  // the reader does not read while it runs. If the connection is lost, what is in flight ends
  // `unavailable`.
  void evaluate(const Script& script, Inputs inputs, Callback done) override;
  Future evaluate(const Script& script, Inputs inputs) override;
  void evaluate_batch(std::vector<Request> requests, BatchCallback done) override;

  // The daemon's shard count (from its hello) and whether the connection is still up.
  int shards() const;
  bool connected() const;

  // Administration (JSON documents as in design/daemon.md).
  Error stats_json(std::string* out);
  Error shards_json(std::string* out);
  // ListScripts: every page (design/protocol.md "Paged ListScripts"), merged into one
  // {"scripts": [...]} document in key order. It grows with the registry (300,000 scripts: about
  // 40 MB); scripts_page_json reads one page at a time.
  Error scripts_json(std::string* out);
  // One ListScripts page: `after` is the "next" of the previous page (empty: the first page),
  // `limit` the most scripts in it (0: the daemon's default, 1000; at most 10,000). The page's
  // "next" is null on the last page.
  Error scripts_page_json(std::string_view after, uint32_t limit, std::string* out);
  // The recent log lines of the script registered under `key` (its owner's uid or an admin) or
  // of a virtual tag (anyone): those numbered `since` and after (0: the oldest kept; a
  // follower passes the last page's `next`). `*_json`: the document as outrund sent it
  // (design/protocol.md "Script logs").
  Error script_logs(std::string_view key, uint64_t since, LogPage* out);
  Error tag_logs(std::string_view id, uint64_t since, LogPage* out);
  Error script_logs_json(std::string_view key, uint64_t since, std::string* out);
  Error tag_logs_json(std::string_view id, uint64_t since, std::string* out);
  Error kill_shard(int shard);
  Error restart_shard(int shard);

  // The daemon's tags engine (design/protocol.md "Tags frames"; design/tags.md). Each call is a
  // round trip. define/remove need an admin uid. `json` gets {"defined": [...], "removed": [...]}.
  Error define_tags(std::string_view toml, bool replace_all, std::string* json = nullptr);
  Error remove_tags(const std::vector<std::string>& ids);
  Error list_tags_json(std::string* out);
  // One wave; `time` empty: the daemon's clock.
  Error update_sources(const std::vector<tags::SourceUpdate>& updates, DateTime time = {});
  // One value per id, in order; an unknown id fails the call (invalid_argument).
  Error read_tags(const std::vector<std::string>& ids, std::vector<tags::Change>* out);
  // Pushes the changes of these tags (empty: all) to `on_changes`, on the reader thread (it
  // must not block; it must not call this Client's round trips). One callback per Client: a
  // later subscribe replaces it (its ids add to the earlier ones).
  using ChangesCallback = std::function<void(const std::vector<tags::Change>&)>;
  Error subscribe(const std::vector<std::string>& ids, ChangesCallback on_changes);
  // Stops these ids (empty: every subscription).
  Error unsubscribe(const std::vector<std::string>& ids = {});

  struct Impl;

 private:
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The socket path ClientOptions::socket = "" resolves to.
std::string default_client_socket();

}  // namespace outrun
