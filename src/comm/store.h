// The rendezvous store (docs/architecture.md, "comm"): a small key-value server that rank 0 runs and every
// rank connects to, as torchrun's TCPStore does. Ranks publish what the others need to connect (transport
// addresses) and wait for each other's keys.
//
// Security and robustness: the server binds only the address it is given (loopback by default); every client
// must first present the job token (H2_JOB_TOKEN) or is disconnected; before that it may send kMaxHelloBytes
// (so an unauthenticated client cannot make the server buffer more), must do so within hello_timeout, and only
// max_unauthenticated such clients are held at once (StoreLimits); frames longer than kMaxFrameBytes or
// malformed are rejected and the connection dropped, without affecting other clients. Every client call has a
// timeout whose error names the store's address and the key.
//
// Wire format (version 1): each frame is a little-endian u32 length, then that many bytes: an op byte and
// length-prefixed (u32) strings. Ops: 'H' hello(token) -> 'O' | 'E'; 'S' set(key, value) -> 'O';
// 'G' get(key) -> 'V' value, sent once the key exists; 'T' try_get(key) -> 'V' value | 'N'; 'A' add(key, delta
// as decimal text) -> 'V' new value; 'R' register(rank) -> 'O'; 'Q' leave -> 'O'.
//
// Liveness: a rank registers its connection ('R'); if that connection closes without 'Q' (the process died),
// the server appends the rank to the key kDeadRanksKey, so peers stuck waiting on it can name it at once.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/transport/transport.h"

namespace h2 {

inline constexpr uint32_t kMaxFrameBytes = 64u << 20;
inline constexpr uint32_t kMaxHelloBytes = 1024;  // before its token is checked a client may send no more

// What the server grants a client before and after it has shown the token.
struct StoreLimits {
  std::chrono::milliseconds hello_timeout{5000};  // a connection that has not shown the token by then is closed
  int max_clients = 4096;                         // connections past this are closed at once
  int max_unauthenticated = 64;                   // of them, not yet past the token check
};
inline constexpr const char* kDeadRanksKey = "h2/dead";  // "3,5,": ranks whose connection died

class StoreServer {
 public:
  // Binds host:port (port 0 picks a free one) and serves in a background thread until destroyed.
  StoreServer(const std::string& host, int port, std::string token, StoreLimits limits = {});
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;
  int port() const { return port_; }
  int64_t rejected_connections() const;  // wrong token or malformed frames, for tests and logs
  // Waits until no client is connected, at most `timeout`: rank 0 keeps the store up until the other ranks
  // have left (or died), so none of them loses it while it still needs it. False on timeout.
  bool wait_for_clients_to_leave(std::chrono::milliseconds timeout) const;

 private:
  struct State;
  std::unique_ptr<State> state_;
  int port_ = 0;
};

class StoreClient {
 public:
  // Connects, retrying until `timeout` (the server may start after the client), and presents the token.
  StoreClient(const std::string& host, int port, const std::string& token, std::chrono::milliseconds timeout);
  ~StoreClient();
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  void set(const std::string& key, const std::string& value);
  std::string get(const std::string& key);                     // waits until some rank sets the key
  std::optional<std::string> try_get(const std::string& key);  // never waits
  int64_t add(const std::string& key, int64_t delta);
  // This connection is rank `rank`'s lifeline: closing it without leave() marks the rank dead.
  void register_rank(int rank);
  void leave();
  std::vector<int> dead_ranks();  // ranks whose lifeline closed without leave(), in order of death

 private:
  std::optional<std::string> call(char op, const std::string& a, const std::string& b, const std::string& what);
  std::string where_;
  int fd_ = -1;
  std::chrono::milliseconds timeout_;
};

// Where this process sits in the job, from the launcher's environment: h2 launch / torchrun style
// (H2_RANK, H2_WORLD_SIZE, H2_MASTER_ADDR, H2_MASTER_PORT, H2_JOB_TOKEN), Open MPI's mpirun
// (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE), or Slurm's srun (SLURM_PROCID, SLURM_NTASKS).
struct JobEnv {
  int rank = 0;
  int world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string token;
  std::string source;  // "h2", "mpirun", "srun" or "single" (no launcher)
};
// Throws Error(kConfig) naming the variable when a value is malformed or inconsistent.
JobEnv job_env_from(const std::function<const char*(const char*)>& getenv_fn);
JobEnv job_env();

}  // namespace h2
