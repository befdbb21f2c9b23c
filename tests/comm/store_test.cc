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
