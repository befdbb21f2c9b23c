// h2_fuzz: a deterministic mutation fuzzer for H2's input parsers (no coverage guidance: seeded random mutations
// of a corpus). Each target takes bytes and must either accept them or throw h2::Error; any other exception is a
// failure, and a crash (ASan/UBSan in CI) ends the process, which first writes the input that caused it.
//   h2_fuzz TARGET|all [--seconds S] [--seed N] [--corpus DIR] [--out DIR]
// Targets: yaml (cluster, model, training setup, training config, chip catalog, layout), plan (plan.json, then its
// schedule's replay and the simulator), checkpoint (state.json with its manifest + a safetensors file, verified
// and loaded into a model), shard (a token shard and batches from it), store (frames sent to the rendezvous
// store, which must keep serving a well-behaved client), dicomm (point-to-point and all-reduce between two ranks
// that disagree on tags, lengths and counts). The corpus: tests/fuzz/corpus/<target>/.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#endif

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "comm/store.h"
#include "comm/transport/inproc/transport.h"
#include "core/config.h"
#include "core/error.h"
#include "core/file.h"
#include "core/rng.h"
#include "core/safetensors.h"
#include "device/registry.h"
#include "model/dataset.h"
#include "planner/catalog.h"
#include "planner/layout.h"
#include "planner/plan.h"
#include "sim/simulator.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace h2 {
namespace {

namespace fs = std::filesystem;

std::string g_work;  // a scratch folder for targets that need files

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

void fuzz_yaml(const std::string& input) {
  const ConfigNode root = ConfigNode::parse_string(input, "fuzz.yaml");
  const auto attempt = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error&) {
    }
  };
  attempt([&] { load_cluster(root); });
  attempt([&] { load_model(root); });
  attempt([&] { load_train_setup(root); });
  attempt([&] { TrainConfig::from_config(root); });
  attempt([&] { load_catalog(root); });
  attempt([&] {
    const Cluster cluster = load_cluster(ConfigNode::parse_string(
        "chips:\n  - {name: A, peak_tflops: 100, memory_gib: 16, memory_bandwidth_gbps: 1000}\n"
        "groups:\n  - {chip: A, nodes: 2, chips_per_node: 4, intra_node_gbps: 100, nic_gbps: 10}\n",
        "cluster"));
    const TransformerShape shape{.layers = 8,
                                 .hidden = 256,
                                 .heads = 4,
                                 .kv_heads = 4,
                                 .ffn = 1024,
                                 .vocab = 1000,
                                 .seq_len = 128,
                                 .tied_embeddings = true};
    const CostModel costs(cluster, shape, TrainSetup{.global_batch = 16});
    cost_layout(costs, load_layout(root, costs));
  });
}

void fuzz_plan(const std::string& input) {
  const Plan plan = Plan::from_json(input, "fuzz.json");
  replay_plan(plan);
  simulate(plan);
}

// state.json, a NUL, then the bytes of model.safetensors.
void fuzz_checkpoint(const std::string& input) {
  const size_t nul = input.find('\0');
  const std::string folder = g_work + "/checkpoint";
  fs::remove_all(folder);
  fs::create_directories(folder);
  write_bytes(folder + "/state.json", input.substr(0, nul));
  write_bytes(folder + "/model.safetensors", nul == std::string::npos ? "" : input.substr(nul + 1));
  try {
    const SafetensorsFile file(folder + "/model.safetensors");
    for (const SafetensorsEntry& e : file.entries()) (void)e.name.size();
  } catch (const Error&) {
  }
  const CheckpointState state = read_checkpoint_state(folder);
  verify_checkpoint(folder);
  static auto device = create_device(DeviceSpec{.backend = "cpu", .mem_capacity_bytes = size_t{256} << 20});
  if (state.model.n_layer > 4 || state.model.n_embd > 64 || state.model.vocab_size > 512 || state.model.seq_len > 64) {
    return;  // a model this target does not build (the model's own limits are the yaml target's)
  }
  Gpt model(state.model, *device, GptRange::whole(state.model), 1, state.model.seq_len);
  load_checkpoint_by_name(folder, model, nullptr, nullptr);
}

void fuzz_shard(const std::string& input) {
  const std::string path = g_work + "/shard.bin";
  write_bytes(path, input);
  TokenLoader loader({path}, 2, 8, 1, true);
  std::vector<int32_t> in, out;
  for (uint64_t i = 0; i < std::min<uint64_t>(loader.batches_per_epoch(), 4); ++i) loader.next(in, out);
}

// Frames to the store over a fresh connection; every 64 inputs a well-behaved client must still be served.
void fuzz_store(const std::string& input) {
  static StoreServer server("127.0.0.1", 0, "fuzz", StoreLimits{.hello_timeout = std::chrono::milliseconds(200)});
  static int64_t runs = 0;
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(server.port()));
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    (void)!::send(fd, input.data(), input.size(), MSG_NOSIGNAL);
    ::shutdown(fd, SHUT_WR);
    timeval tv{.tv_sec = 0, .tv_usec = 20000};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    char buf[4096];
    while (::recv(fd, buf, sizeof(buf), 0) > 0) {
    }
  }
  ::close(fd);
  if (++runs % 64 == 0) {
    StoreClient good("127.0.0.1", server.port(), "fuzz", std::chrono::milliseconds(5000));
    good.set("alive", std::to_string(runs));
    if (good.get("alive") != std::to_string(runs)) throw std::runtime_error("the store stopped serving");
  }
}

// DiComm's point-to-point between two ranks (in-process transport): a header of five little-endian u32 — the tag and
// length rank 1 sends, the tag and length rank 0 expects, and a collective's element count — then the payload. A
// mismatch must end in a CommError within the timeout, never a crash, a hang or a torn buffer.
void fuzz_dicomm(const std::string& input) {
  uint32_t h[5] = {};
  std::memcpy(h, input.data(), std::min(input.size(), sizeof(h)));
  const std::string payload = input.size() > sizeof(h) ? input.substr(sizeof(h)) : "";
  const auto transports = make_inproc_transports(2, 4096);
  std::exception_ptr failed[2];
  std::thread ranks[2];
  for (int r = 0; r < 2; ++r) {
    ranks[r] = std::thread([&, r] {
      try {
        Communicator c(transports[static_cast<size_t>(r)], CommOptions{.timeout = std::chrono::milliseconds(5)});
        if (r == 1) {
          auto send = c.isend(payload.data(), std::min<size_t>(h[1] % 65536, payload.size()), 0, h[0] % (1u << 23));
          c.wait_request(*send, "send", 0);
        } else {
          std::vector<char> buf(h[3] % 65536);
          auto recv = c.irecv(buf.data(), buf.size(), 1, h[2] % (1u << 23));
          c.wait_request(*recv, "recv", 1);
        }
        std::vector<float> values(h[4] % 4096, 1.0f);
        c.all_reduce(values.data(), values.size(), DType::kF32, ReduceOp::kSum);
      } catch (const Error&) {
      } catch (...) {
        failed[r] = std::current_exception();
      }
    });
  }
  for (std::thread& t : ranks) t.join();
  for (const std::exception_ptr& e : failed) {
    if (e) std::rethrow_exception(e);
  }
}

const std::map<std::string, std::function<void(const std::string&)>>& targets() {
  static const std::map<std::string, std::function<void(const std::string&)>> t = {
      {"yaml", fuzz_yaml},   {"plan", fuzz_plan},     {"checkpoint", fuzz_checkpoint},
      {"shard", fuzz_shard}, {"dicomm", fuzz_dicomm}, {"store", fuzz_store}};
  return t;
}

// The input being run, written out when the process dies on it (with open/write only: from a signal handler, or
// from the sanitizers' death callback).
std::string g_current, g_crash_path;
void write_current() {
  const int fd = ::open(g_crash_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) {
    (void)!::write(fd, g_current.data(), g_current.size());
    ::close(fd);
  }
}
extern "C" void write_current_and_die(int sig) {
  write_current();
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

std::string mutate(std::string s, Rng& rng, const std::vector<std::string>& corpus) {
  static const char* kTokens[] = {"-1",   "0",     "1e308", ".inf", ".nan", "4294967298", "9223372036854775807",
                                  "[]",   "{}",    "\"\"",  ":",    "\n",   "- ",         "null",
                                  "true", "\"x\"", ",",     "]",    "}"};
  const int edits = 1 + static_cast<int>(rng.below(6));
  for (int e = 0; e < edits; ++e) {
    const size_t at = s.empty() ? 0 : rng.below(s.size());
    switch (rng.below(7)) {
      case 0:  // flip a bit
        if (!s.empty()) s[at] = static_cast<char>(s[at] ^ (1 << rng.below(8)));
        break;
      case 1:  // an interesting byte
        if (!s.empty()) s[at] = "\x00\xff\x7f\x80\x01"[rng.below(5)];
        break;
      case 2:  // delete a run
        s.erase(at, 1 + rng.below(16));
        break;
      case 3:  // duplicate a run
        s.insert(at, s.substr(at, 1 + rng.below(32)));
        break;
      case 4:  // a token that parsers find hard
        s.insert(at, kTokens[rng.below(std::size(kTokens))]);
        break;
      case 5: {  // splice another input in
        const std::string& other = corpus[rng.below(corpus.size())];
        if (!other.empty()) s.insert(at, other.substr(rng.below(other.size()), 1 + rng.below(64)));
        break;
      }
      default:  // random bytes
        for (uint64_t i = 0, n = 1 + rng.below(8); i < n; ++i)
          s.insert(s.begin() + static_cast<long>(std::min(at, s.size())), static_cast<char>(rng.below(256)));
    }
  }
  return s.size() > (1u << 20) ? s.substr(0, 1u << 20) : s;
}

// Runs one target for `seconds`: every corpus input once, then mutations. 0 when nothing but h2::Error came out.
int run_target(const std::string& name, double seconds, uint64_t seed, const std::string& corpus_dir,
               const std::string& out_dir) {
  std::vector<std::string> corpus;
  const std::string dir = corpus_dir + "/" + name;
  if (fs::is_directory(dir)) {
    for (const auto& entry : fs::directory_iterator(dir)) corpus.push_back(read_file(entry.path().string()));
  }
  if (corpus.empty()) corpus.push_back("");
  const auto& target = targets().at(name);
  Rng rng(seed);
  g_crash_path = out_dir + "/crash-" + name;
  int64_t runs = 0, rejected = 0;
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0;; ++i) {
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (i >= corpus.size() && elapsed > seconds) break;
    g_current = i < corpus.size() ? corpus[i] : mutate(corpus[rng.below(corpus.size())], rng, corpus);
    try {
      target(g_current);
    } catch (const Error&) {
      ++rejected;
    } catch (const std::exception& e) {
      const std::string path = out_dir + "/failure-" + name;
      write_bytes(path, g_current);
      std::fprintf(stderr, "h2_fuzz %s: FAILED after %lld inputs: %s (not an h2::Error); the input is in %s\n",
                   name.c_str(), static_cast<long long>(runs), e.what(), path.c_str());
      return 1;
    }
    ++runs;
  }
  std::printf("h2_fuzz %-10s %8lld inputs in %.0f s (%lld rejected with an error), seed %llu: no crash\n", name.c_str(),
              static_cast<long long>(runs), seconds, static_cast<long long>(rejected),
              static_cast<unsigned long long>(seed));
  return 0;
}

int run(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: h2_fuzz TARGET|all [--seconds S] [--seed N] [--corpus DIR] [--out DIR]\n");
    return 2;
  }
  double seconds = 10;
  uint64_t seed = 1;
  std::string corpus = std::string(H2_SOURCE_DIR) + "/tests/fuzz/corpus", out = ".";
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--seconds")
      seconds = std::atof(value.c_str());
    else if (flag == "--seed")
      seed = std::strtoull(value.c_str(), nullptr, 10);
    else if (flag == "--corpus")
      corpus = value;
    else if (flag == "--out")
      out = value;
    else {
      std::fprintf(stderr, "h2_fuzz: unknown option %s\n", flag.c_str());
      return 2;
    }
  }
  g_work = (fs::temp_directory_path() / ("h2_fuzz_" + std::to_string(::getpid()))).string();
  fs::create_directories(g_work);
  for (int sig : {SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL}) ::signal(sig, write_current_and_die);
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_set_death_callback(write_current);
#endif
  std::vector<std::string> names;
  if (std::string(argv[1]) == "all") {
    for (const auto& [name, f] : targets()) names.push_back(name);
  } else if (targets().count(argv[1])) {
    names.push_back(argv[1]);
  } else {
    std::fprintf(stderr, "h2_fuzz: no target %s (yaml, plan, checkpoint, shard, store, dicomm or all)\n", argv[1]);
    return 2;
  }
  int status = 0;
  for (const std::string& name : names) status |= run_target(name, seconds, seed, corpus, out);
  fs::remove_all(g_work);
  return status;
}

}  // namespace
}  // namespace h2

int main(int argc, char** argv) { return h2::run(argc, argv); }
