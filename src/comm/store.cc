// The rendezvous store's server loop, client and the launcher-environment reader.
#include "comm/store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

namespace h2 {
namespace {

void put_u32(std::string& out, uint32_t v) { out.append(reinterpret_cast<const char*>(&v), 4); }

std::string frame(char op, const std::vector<std::string>& fields) {
  std::string body(1, op);
  for (const std::string& f : fields) {
    put_u32(body, static_cast<uint32_t>(f.size()));
    body += f;
  }
  std::string out;
  put_u32(out, static_cast<uint32_t>(body.size()));
  return out + body;
}

// Reads the length-prefixed strings after the op byte; false when the frame is malformed.
bool parse_fields(const std::string& body, std::vector<std::string>& fields, size_t expected) {
  size_t pos = 1;
  while (pos < body.size()) {
    if (body.size() - pos < 4) return false;
    uint32_t n;
    std::memcpy(&n, body.data() + pos, 4);
    pos += 4;
    if (n > body.size() - pos) return false;
    fields.push_back(body.substr(pos, n));
    pos += n;
  }
  return fields.size() == expected;
}

bool send_all(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

sockaddr_in resolve(const std::string& host, int port, const std::string& what) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) == 1) return addr;
  // A host name (as Slurm gives them): its first IPv4 address.
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (rc != 0 || found == nullptr) {
    throw Error(ErrorCode::kConfig,
                cat(what, ": cannot resolve '", host, "' to an IPv4 address (H2_MASTER_ADDR): ", ::gai_strerror(rc)));
  }
  addr.sin_addr = reinterpret_cast<const sockaddr_in*>(found->ai_addr)->sin_addr;
  ::freeaddrinfo(found);
  return addr;
}

}  // namespace

struct StoreServer::State {
  std::string token;
  StoreLimits limits;
  int listen_fd = -1;
  int wake[2] = {-1, -1};
  std::thread thread;
  std::atomic<int64_t> rejected{0};
  std::atomic<int> connected{0};

  struct Client {
    std::string in;
    std::chrono::steady_clock::time_point since;  // connected at
    bool authed = false;
    int rank = -1;      // set by 'R': this connection is that rank's lifeline
    bool left = false;  // said 'Q' before closing: a clean exit, not a death
  };
  std::map<int, Client> clients;
  std::map<std::string, std::string> data;
  std::map<std::string, std::vector<int>> waiting;  // key -> clients blocked in get
  bool refused = false;                             // the last handle() refused a token (already counted)

  void drop(int fd, bool bad) {
    if (bad) ++rejected;
    ::close(fd);
    --connected;
    const Client& c = clients[fd];
    if (c.rank >= 0 && !c.left) {  // a registered rank vanished without saying goodbye: record it as dead
      data[kDeadRanksKey] += std::to_string(c.rank) + ",";
    }
    clients.erase(fd);
    for (auto& [key, fds] : waiting) fds.erase(std::remove(fds.begin(), fds.end(), fd), fds.end());
    publish(kDeadRanksKey);
  }

  void publish(const std::string& key) {
    auto it = waiting.find(key);
    if (it == waiting.end()) return;
    const std::string reply = frame('V', {data[key]});
    for (int fd : it->second) send_all(fd, reply);
    waiting.erase(it);
  }

  // Handles one complete frame body; false means drop the client.
  bool handle(int fd, Client& c, const std::string& body) {
    const char op = body[0];
    std::vector<std::string> f;
    if (!c.authed) {
      if (op != 'H' || !parse_fields(body, f, 1) || f[0] != token) {
        ++rejected;  // counted before the reply, so a client that sees the refusal also sees the count
        send_all(fd, frame('E', {"wrong job token"}));
        refused = true;
        return false;
      }
      c.authed = true;
      return send_all(fd, frame('O', {}));
    }
    switch (op) {
      case 'S':
        if (!parse_fields(body, f, 2)) return false;
        data[f[0]] = f[1];
        if (!send_all(fd, frame('O', {}))) return false;
        publish(f[0]);
        return true;
      case 'G':
        if (!parse_fields(body, f, 1)) return false;
        if (data.count(f[0]) > 0) return send_all(fd, frame('V', {data[f[0]]}));
        waiting[f[0]].push_back(fd);
        return true;
      case 'T':
        if (!parse_fields(body, f, 1)) return false;
        return send_all(fd, data.count(f[0]) > 0 ? frame('V', {data[f[0]]}) : frame('N', {}));
      case 'R': {
        if (!parse_fields(body, f, 1)) return false;
        char* end = nullptr;
        const long r = std::strtol(f[0].c_str(), &end, 10);
        if (end == f[0].c_str() || *end != '\0' || r < 0) return false;
        c.rank = static_cast<int>(r);
        return send_all(fd, frame('O', {}));
      }
      case 'Q':
        c.left = true;
        return send_all(fd, frame('O', {}));
      case 'A': {
        if (!parse_fields(body, f, 2)) return false;
        char* end = nullptr;
        const long long delta = std::strtoll(f[1].c_str(), &end, 10);
        if (end == f[1].c_str() || *end != '\0') return false;
        const long long now = (data.count(f[0]) ? std::strtoll(data[f[0]].c_str(), nullptr, 10) : 0) + delta;
        data[f[0]] = std::to_string(now);
        if (!send_all(fd, frame('V', {data[f[0]]}))) return false;
        publish(f[0]);
        return true;
      }
      default:
        return false;
    }
  }

  int unauthenticated() const {
    int n = 0;
    for (const auto& [fd, c] : clients) n += c.authed ? 0 : 1;
    return n;
  }

  void serve() {
    while (true) {
      std::vector<pollfd> fds = {{listen_fd, POLLIN, 0}, {wake[0], POLLIN, 0}};
      for (const auto& [fd, c] : clients) fds.push_back({fd, POLLIN, 0});
      // Wake at least every 100 ms while a client has yet to show its token, to close it when its time is up.
      if (::poll(fds.data(), fds.size(), unauthenticated() > 0 ? 100 : -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (fds[1].revents != 0) return;  // shutdown
      const auto now = std::chrono::steady_clock::now();
      std::vector<int> late;
      for (const auto& [fd, c] : clients) {
        if (!c.authed && now - c.since > limits.hello_timeout) late.push_back(fd);
      }
      for (int fd : late) drop(fd, true);
      if (fds[0].revents & POLLIN) {
        const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd >= 0 && (static_cast<int>(clients.size()) >= limits.max_clients ||
                        unauthenticated() >= limits.max_unauthenticated)) {
          ::close(fd);  // over the limits: refused before it can hold anything
          ++rejected;
        } else if (fd >= 0) {
          clients[fd] = Client{.since = now};
          ++connected;
        }
      }
      for (size_t i = 2; i < fds.size(); ++i) {
        if (fds[i].revents == 0 || clients.count(fds[i].fd) == 0) continue;  // (closed above for being late)
        const int fd = fds[i].fd;
        char buf[65536];
        const ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n <= 0) {
          if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
          drop(fd, false);
          continue;
        }
        Client& c = clients[fd];
        c.in.append(buf, static_cast<size_t>(n));
        bool ok = true;
        while (ok && c.in.size() >= 4) {
          uint32_t len;
          std::memcpy(&len, c.in.data(), 4);
          if (len == 0 || len > (c.authed ? kMaxFrameBytes : kMaxHelloBytes)) {
            ok = false;  // an impossible length: drop this client, serve the others
            break;
          }
          if (c.in.size() < 4 + static_cast<size_t>(len)) break;
          const std::string body = c.in.substr(4, len);
          c.in.erase(0, 4 + static_cast<size_t>(len));
          ok = handle(fd, c, body);
        }
        if (!ok) drop(fd, !refused);
        refused = false;
      }
    }
  }
};

StoreServer::StoreServer(const std::string& host, int port, std::string token, StoreLimits limits)
    : state_(std::make_unique<State>()) {
  state_->token = std::move(token);
  state_->limits = limits;
  const std::string where = cat("rendezvous store ", host, ":", port);
  const sockaddr_in addr = resolve(host, port, where);
  state_->listen_fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  ::setsockopt(state_->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(state_->listen_fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(state_->listen_fd, 256) != 0) {
    const std::string reason = std::strerror(errno);
    ::close(state_->listen_fd);
    throw Error(ErrorCode::kIo, cat(where, ": cannot listen: ", reason, " (is the port in use? set H2_MASTER_PORT)"));
  }
  sockaddr_in bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(state_->listen_fd, reinterpret_cast<sockaddr*>(&bound), &len);
  port_ = ntohs(bound.sin_port);
  if (::pipe2(state_->wake, O_CLOEXEC) != 0) throw Error(ErrorCode::kIo, cat(where, ": pipe: ", std::strerror(errno)));
  state_->thread = std::thread([s = state_.get()] { s->serve(); });
}

StoreServer::~StoreServer() {
  const char b = 1;
  (void)!::write(state_->wake[1], &b, 1);
  state_->thread.join();
  for (const auto& [fd, c] : state_->clients) ::close(fd);
  ::close(state_->listen_fd);
  ::close(state_->wake[0]);
  ::close(state_->wake[1]);
}

int64_t StoreServer::rejected_connections() const { return state_->rejected; }

bool StoreServer::wait_for_clients_to_leave(std::chrono::milliseconds timeout) const {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (state_->connected > 0) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

StoreClient::StoreClient(const std::string& host, int port, const std::string& token, std::chrono::milliseconds timeout)
    : where_(cat("rendezvous store ", host, ":", port)), timeout_(timeout) {
  const sockaddr_in addr = resolve(host, port, where_);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (::connect(fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0) break;
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    if (std::chrono::steady_clock::now() > deadline) {
      throw CommError(cat(where_, ": cannot connect within ", timeout.count(), " ms: ", std::strerror(err),
                          " (is rank 0 running, and H2_MASTER_ADDR/H2_MASTER_PORT the same on every rank?)"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  call('H', token, std::string(), "hello");
}

StoreClient::~StoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

std::optional<std::string> StoreClient::call(char op, const std::string& a, const std::string& b,
                                             const std::string& what) {
  std::vector<std::string> fields;
  if (op != 'Q') fields.push_back(a);
  if (op == 'S' || op == 'A') fields.push_back(b);
  if (!send_all(fd_, frame(op, fields))) throw CommError(cat(where_, ": connection lost sending ", what));
  std::string in;
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  while (true) {
    if (in.size() >= 4) {
      uint32_t len;
      std::memcpy(&len, in.data(), 4);
      if (len == 0 || len > kMaxFrameBytes) throw CommError(cat(where_, ": malformed reply to ", what));
      if (in.size() >= 4 + static_cast<size_t>(len)) {
        const std::string body = in.substr(4, len);
        std::vector<std::string> f;
        if (body[0] == 'E') {
          throw CommError(
              cat(where_, " refused this rank: ", parse_fields(body, f, 1) ? f[0] : "error", " (check H2_JOB_TOKEN)"));
        }
        if (body[0] == 'O') return "";
        if (body[0] == 'N') return std::nullopt;  // try_get of a missing key
        if (body[0] == 'V' && parse_fields(body, f, 1)) return f[0];
        throw CommError(cat(where_, ": malformed reply to ", what));
      }
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd p{fd_, POLLIN, 0};
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) == 0) {
      throw CommError(cat(where_, ": no answer to ", what, " within ", timeout_.count(), " ms"));
    }
    char buf[65536];
    const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
    if (n <= 0) throw CommError(cat(where_, ": connection closed during ", what, " (the store or rank 0 is gone)"));
    in.append(buf, static_cast<size_t>(n));
  }
}

void StoreClient::set(const std::string& key, const std::string& value) { call('S', key, value, "set('" + key + "')"); }
std::string StoreClient::get(const std::string& key) { return call('G', key, "", "get('" + key + "')").value_or(""); }
std::optional<std::string> StoreClient::try_get(const std::string& key) {
  return call('T', key, "", "try_get('" + key + "')");
}

void StoreClient::register_rank(int rank) { call('R', std::to_string(rank), "", "register"); }
void StoreClient::leave() { call('Q', "", "", "leave"); }

std::vector<int> StoreClient::dead_ranks() {
  std::vector<int> out;
  const std::optional<std::string> list = try_get(kDeadRanksKey);
  if (!list) return out;
  for (size_t pos = 0; pos < list->size();) {
    const size_t comma = list->find(',', pos);
    out.push_back(std::atoi(list->substr(pos, comma - pos).c_str()));
    pos = comma == std::string::npos ? list->size() : comma + 1;
  }
  return out;
}

int64_t StoreClient::add(const std::string& key, int64_t delta) {
  return std::strtoll(call('A', key, std::to_string(delta), "add('" + key + "')").value_or("").c_str(), nullptr, 10);
}

JobEnv job_env_from(const std::function<const char*(const char*)>& env) {
  auto integer = [&](const char* name, int lo, int hi = 1 << 24) {
    const char* v = env(name);
    if (v == nullptr) throw Error(ErrorCode::kConfig, cat("environment variable ", name, " is not set"));
    char* end = nullptr;
    errno = 0;
    const long x = std::strtol(v, &end, 10);
    if (end == v || *end != '\0' || errno == ERANGE || x < lo || x > hi) {
      throw Error(ErrorCode::kConfig,
                  cat("environment variable ", name, "='", v, "' is not an integer in [", lo, ", ", hi, "]"));
    }
    return static_cast<int>(x);
  };
  JobEnv j;
  if (env("H2_RANK") != nullptr) {
    j.source = "h2";
    j.rank = integer("H2_RANK", 0);
    if (env("H2_WORLD_SIZE") == nullptr) throw Error(ErrorCode::kConfig, "H2_RANK is set but H2_WORLD_SIZE is not");
    j.world_size = integer("H2_WORLD_SIZE", 1);
  } else if (env("OMPI_COMM_WORLD_RANK") != nullptr) {
    j.source = "mpirun";
    j.rank = integer("OMPI_COMM_WORLD_RANK", 0);
    j.world_size = integer("OMPI_COMM_WORLD_SIZE", 1);
  } else if (env("SLURM_PROCID") != nullptr) {
    j.source = "srun";
    j.rank = integer("SLURM_PROCID", 0);
    j.world_size = integer("SLURM_NTASKS", 1);
  } else {
    j.source = "single";
  }
  if (j.rank >= j.world_size) {
    throw Error(ErrorCode::kConfig,
                cat("rank ", j.rank, " is not below the world size ", j.world_size, " (", j.source, ")"));
  }
  if (const char* a = env("H2_MASTER_ADDR")) j.master_addr = a;
  if (env("H2_MASTER_PORT") != nullptr) j.master_port = integer("H2_MASTER_PORT", 1, 65535);
  if (const char* t = env("H2_JOB_TOKEN")) j.token = t;
  return j;
}

JobEnv job_env() {
  return job_env_from([](const char* name) { return std::getenv(name); });
}

}  // namespace h2
