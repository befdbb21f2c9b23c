// The rendezvous store: key-value semantics across clients, the job token, malformed frames, timeouts, and the
// launcher environment.
#include "comm/store.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <thread>

#include "test_util.h"

namespace h2 {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

TEST(Store, SetGetAddAcrossClients) {
  StoreServer server("127.0.0.1", 0, "secret");
  StoreClient a("127.0.0.1", server.port(), "secret", 5s), b("127.0.0.1", server.port(), "secret", 5s);
  std::string got;
  std::thread waiter([&] { got = b.get("addr/1"); });  // blocks until a sets it
  std::this_thread::sleep_for(50ms);
  a.set("addr/1", std::string("bytes\0with nul", 14));
  waiter.join();
  EXPECT_EQ(got, std::string("bytes\0with nul", 14));
  EXPECT_EQ(a.add("barrier", 1), 1);
  EXPECT_EQ(b.add("barrier", 1), 2);
  EXPECT_EQ(a.get("barrier"), "2");
}

TEST(Store, WrongTokenIsRefused) {
  StoreServer server("127.0.0.1", 0, "secret");
  EXPECT_THAT(
      testing_util::error_of([&] { StoreClient c("127.0.0.1", server.port(), "guess", 2s); }, ErrorCode::kInternal),
      HasSubstr("refused this rank: wrong job token (check H2_JOB_TOKEN)"));
  EXPECT_EQ(server.rejected_connections(), 1);
}

TEST(Store, ImpossibleFrameIsDroppedOthersServed) {
  StoreServer server("127.0.0.1", 0, "t");
  StoreClient good("127.0.0.1", server.port(), "t", 5s);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(server.port()));
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const uint32_t huge = 0xffffffffu;
  ASSERT_EQ(::send(fd, &huge, 4, 0), 4);
  char c;
  EXPECT_EQ(::recv(fd, &c, 1, 0), 0);  // the server closed this connection
  ::close(fd);
  good.set("k", "v");  // and still serves the others
  EXPECT_EQ(good.get("k"), "v");
  EXPECT_EQ(server.rejected_connections(), 1);
}

// A raw connection to the store, and whether the server closed it within `wait` (recv sees the end).
int raw_connection(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  return fd;
}
bool closed_by_server(int fd, std::chrono::milliseconds wait) {
  timeval tv{.tv_sec = wait.count() / 1000, .tv_usec = (wait.count() % 1000) * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char c;
  const bool closed = ::recv(fd, &c, 1, 0) == 0;
  ::close(fd);
  return closed;
}

// Before a client shows the token it can make the server hold little: a frame longer than a hello is refused
// unread (a 1 MiB one used to be buffered, up to 64 MiB a connection), a silent connection is closed after the
// hello timeout (one used to delay the job's exit by 30 s), and connections past the limits are closed at once;
// the job's own clients are served throughout.
TEST(Store, UnauthenticatedClientsAreBounded) {
  {
    StoreServer patient("127.0.0.1", 0, "t", StoreLimits{.hello_timeout = 60s});  // only the length can close it
    const int big = raw_connection(patient.port());
    const uint32_t mib = 1u << 20;
    ASSERT_EQ(::send(big, &mib, 4, 0), 4);
    EXPECT_TRUE(closed_by_server(big, 2000ms));
    EXPECT_EQ(patient.rejected_connections(), 1);
  }
  StoreServer server("127.0.0.1", 0, "t", StoreLimits{.hello_timeout = 300ms, .max_unauthenticated = 2});
  StoreClient good("127.0.0.1", server.port(), "t", 5s);
  const int idle1 = raw_connection(server.port()), idle2 = raw_connection(server.port());
  std::this_thread::sleep_for(100ms);  // both accepted, neither has said anything
  const int third = raw_connection(server.port());
  EXPECT_TRUE(closed_by_server(third, 2000ms));  // over max_unauthenticated
  EXPECT_TRUE(closed_by_server(idle1, 3000ms));  // the hello timeout
  EXPECT_TRUE(closed_by_server(idle2, 3000ms));
  EXPECT_EQ(server.rejected_connections(), 3);
  good.set("k", "v");
  EXPECT_EQ(good.get("k"), "v");
}

TEST(Store, TimeoutsNameTheStoreAndKey) {
  StoreServer server("127.0.0.1", 0, "t");
  StoreClient c("127.0.0.1", server.port(), "t", 100ms);
  EXPECT_THAT(testing_util::error_of([&] { c.get("never"); }, ErrorCode::kInternal),
              HasSubstr(cat(":", server.port(), ": no answer to get('never') within 100 ms")));
  const int unused = server.port();
  EXPECT_THAT(
      testing_util::error_of([&] { StoreClient d("127.0.0.1", unused + 1 == 65536 ? 1 : unused + 1, "t", 100ms); },
                             ErrorCode::kInternal),
      HasSubstr("cannot connect within 100 ms"));
}

TEST(JobEnv, ReadsEachLauncher) {
  auto from = [](std::map<std::string, std::string> vars) {
    return job_env_from([vars = std::move(vars)](const char* name) -> const char* {
      const auto it = vars.find(name);
      return it == vars.end() ? nullptr : it->second.c_str();
    });
  };
  const JobEnv h2 = from({{"H2_RANK", "2"}, {"H2_WORLD_SIZE", "4"}, {"H2_MASTER_PORT", "1234"}, {"H2_JOB_TOKEN", "x"}});
  EXPECT_EQ(h2.source, "h2");
  EXPECT_EQ(h2.rank, 2);
  EXPECT_EQ(h2.master_port, 1234);
  const JobEnv mpi = from({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "3"}});
  EXPECT_EQ(mpi.source, "mpirun");
  EXPECT_EQ(mpi.world_size, 3);
  EXPECT_EQ(from({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "8"}}).source, "srun");
  EXPECT_EQ(from({}).source, "single");
  EXPECT_THAT(testing_util::error_of(
                  [&] {
                    from({{"H2_RANK", "two"}, {"H2_WORLD_SIZE", "4"}});
                  },
                  ErrorCode::kConfig),
              HasSubstr("H2_RANK='two' is not an integer"));
  EXPECT_THAT(testing_util::error_of(
                  [&] {
                    from({{"H2_RANK", "4"}, {"H2_WORLD_SIZE", "4"}});
                  },
                  ErrorCode::kConfig),
              HasSubstr("rank 4 is not below the world size 4"));
  EXPECT_THAT(testing_util::error_of(
                  [&] {
                    from({{"SLURM_PROCID", "0"}});
                  },
                  ErrorCode::kConfig),
              HasSubstr("SLURM_NTASKS is not set"));
  // A port past 65535 used to wrap (70000 bound 4464).
  EXPECT_THAT(testing_util::error_of(
                  [&] {
                    from({{"H2_MASTER_PORT", "70000"}});
                  },
                  ErrorCode::kConfig),
              HasSubstr("H2_MASTER_PORT='70000' is not an integer in [1, 65535]"));
}

// The store's address may be a host name (Slurm gives them), not only a numeric IPv4 address.
TEST(Store, ClientsReachTheServerByHostName) {
  StoreServer server("127.0.0.1", 0, "t");
  StoreClient c("localhost", server.port(), "t", 2s);
  c.set("k", "v");
  EXPECT_EQ(c.get("k"), "v");
  EXPECT_THAT(testing_util::error_of(
                  [&] { StoreClient("no-such-host.invalid", server.port(), "t", std::chrono::milliseconds(100)); },
                  ErrorCode::kConfig),
              HasSubstr("cannot resolve 'no-such-host.invalid'"));
}

}  // namespace
}  // namespace h2
