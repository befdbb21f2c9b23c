// The `h2` executable end to end: exit status and messages on good and bad input.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>

#include "checkpoint_damage.h"
#include "core/config.h"
#include "core/file.h"
#include "core/safetensors.h"
#include "model/test_data.h"
#include "planner/spec.h"
#include "test_util.h"

namespace h2 {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

struct Result {
  int status;
  std::string output;  // stdout and stderr together
};

// `env`: variable assignments for the command, e.g. "H2_FAULT_KILL=1:5".
Result run_h2(const std::string& args, const std::string& env = "") {
  const std::string command = env + " " + std::string(H2_BINARY) + " " + args + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  EXPECT_NE(pipe, nullptr);
  std::string output;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) output.append(buf, n);
  const int raw = pclose(pipe);
  return {WIFEXITED(raw) ? WEXITSTATUS(raw) : -1, output};
}

std::string temp_file(const std::string& name, const std::string& text) {
  const std::string path = testing_util::temp_path(name);
  std::ofstream(path) << text;
  return path;
}

TEST(Cli, VersionAndHelp) {
  const Result version = run_h2("--version");
  EXPECT_EQ(version.status, 0);
  EXPECT_THAT(version.output, HasSubstr("h2 0."));
  const Result help = run_h2("--help");
  EXPECT_EQ(help.status, 0);
  EXPECT_THAT(help.output, HasSubstr("check"));
  EXPECT_THAT(help.output, HasSubstr("devices"));
}

TEST(Cli, CheckOpsPassesOnEveryBackend) {
  const Result r = run_h2("check ops");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("PASS"));
  EXPECT_THAT(r.output, HasSubstr("EMULATED"));
  EXPECT_THAT(r.output, ::testing::Not(HasSubstr("FAIL")));
}

TEST(Cli, UnknownBackendFails) {
  const Result r = run_h2("check ops --backend cpu,tpu");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.output, HasSubstr("h2: error: unknown backend 'tpu'; built backends: ref, cpu, emu"));
}

TEST(Cli, MalformedYamlFailsWithFileAndLine) {
  const std::string path = temp_file("h2_cli_bad.yaml", "chips:\n  - name: a\n    speed: [1,\n");
  const Result r = run_h2("check ops --backend emu --chips " + path);
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.output, HasSubstr("h2: error: " + path + ":"));
  EXPECT_THAT(r.output, HasSubstr("YAML syntax error"));
}

TEST(Cli, BadFieldInChipsFileIsNamed) {
  const std::string path = temp_file("h2_cli_field.yaml", "chips:\n  - {name: a, speed: 3, memory_mib: 8}\n");
  const Result r = run_h2("devices --chips " + path);
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.output, HasSubstr("field 'chips[0].speed'"));
}

// h2 devices lists the cuda backend when it is built, and each GPU or why there is none; asking for a GPU that is
// not there is an error naming the reason, not a crash.
TEST(Cli, DevicesSaysWhatTheCudaBackendFinds) {
  const Result r = run_h2("devices");
  EXPECT_EQ(r.status, 0) << r.output;
#ifdef H2_HAVE_CUDA
  EXPECT_THAT(r.output, HasSubstr("  cuda an NVIDIA GPU"));
  EXPECT_THAT(r.output, ::testing::ContainsRegex("  cuda(:0  .*compute capability|: no CUDA device \\()"));
  const Result check = run_h2("check ops --backend cuda");
  if (r.output.find("no CUDA device") != std::string::npos) {
    EXPECT_EQ(check.status, 1);
    EXPECT_THAT(check.output, HasSubstr("h2: error: no CUDA device"));
  }
#else
  EXPECT_THAT(r.output, Not(HasSubstr("cuda")));
#endif
}

TEST(Cli, MissingFileAndUnknownChip) {
  EXPECT_THAT(run_h2("devices --chips /nonexistent.yaml").output, HasSubstr("/nonexistent.yaml: cannot open"));
  const Result r =
      run_h2(std::string("check ops --backend emu --chips ") + H2_SOURCE_DIR + "/examples/emu_chips.yaml --chip tpu");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.output, HasSubstr("no chip named 'tpu'"));
}

TEST(Cli, UsageErrorsExitTwo) {
  EXPECT_EQ(run_h2("").status, 2);
  EXPECT_EQ(run_h2("frobnicate").status, 2);
  EXPECT_EQ(run_h2("check ops --seed notanumber").status, 2);
  // A count or a time that must be positive says so with the value given.
  for (const char* args : {"plan --budget 0", "plan --budget -1", "plan --budget 2s", "launch -n 0 true"}) {
    const Result r = run_h2(args);
    EXPECT_EQ(r.status, 2) << args;
    EXPECT_THAT(r.output, HasSubstr("must be a number above 0, got '")) << args;
    EXPECT_THAT(r.output, Not(HasSubstr("not in range"))) << args;
  }
  EXPECT_EQ(run_h2("plan --search-threads -3").status, 2);
}

// h2 align names where an emulated chip with a wrong kernel parts from the host (exit 1), and finds two devices with
// the same kernels in agreement (exit 0).
TEST(Cli, AlignNamesTheFirstDivergingOperator) {
  const std::string config = temp_file("h2_align.yaml",
                                       "model: {n_layer: 2, n_head: 2, n_embd: 16, vocab_size: 40, seq_len: 16}\n"
                                       "data: {train: none.bin}\ntrain: {batch_size: 2}\n");
  const std::string chips = std::string(" --chips ") + H2_SOURCE_DIR + "/examples/emu_chips.yaml --config " + config;
  const Result faulty = run_h2("align --a emu:faulty --b cpu" + chips);
  EXPECT_EQ(faulty.status, 1) << faulty.output;
  EXPECT_THAT(faulty.output, HasSubstr("first divergence: h.0.attn.c_attn (forward) (matmul_forward)"));
  const Result same = run_h2("align --a emu:fast-small --b cpu" + chips);
  EXPECT_EQ(same.status, 0) << same.output;
  EXPECT_THAT(same.output, HasSubstr("no divergence"));
  EXPECT_THAT(run_h2("align --a emu:faulty --b cpu").output, HasSubstr("emu:CHIP needs --chips FILE"));
  // In bf16, as bf16 training runs: the faulty chip still parts at the first product.
  const Result low = run_h2("align --a emu:faulty --b cpu --precision bf16" + chips);
  EXPECT_EQ(low.status, 1) << low.output;
  EXPECT_THAT(low.output, HasSubstr("first divergence: h.0.attn.c_attn (forward) (matmul_forward)"));
  const Result bad = run_h2("align --precision fp8" + chips);
  EXPECT_NE(bad.status, 0);
  EXPECT_THAT(bad.output, HasSubstr("--precision"));
}

TEST(Cli, DevicesListsBackendsAndChips) {
  const Result r = run_h2(std::string("devices --chips ") + H2_SOURCE_DIR + "/examples/emu_chips.yaml");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("slow-big"));
  EXPECT_THAT(r.output, HasSubstr("emu "));
}

TEST(CliPlan, PlanSimulateAndBadInput) {
  const std::string ex = std::string(H2_SOURCE_DIR) + "/examples/";
  const std::string plan = testing_util::temp_path("cli_plan.json");
  const Result p = run_h2("plan --cluster " + ex + "cluster_local.yaml --model " + ex + "model_small.yaml --train " +
                          ex + "train_small.yaml --compare --out " + plan);
  ASSERT_EQ(p.status, 0) << p.output;
  EXPECT_THAT(p.output, HasSubstr("heterogeneous speed-up ratio"));
  EXPECT_THAT(p.output, HasSubstr("uniform layer split"));
  const Result s = run_h2("simulate " + plan + " --trace " + testing_util::temp_path("cli_trace.json"));
  EXPECT_EQ(s.status, 0) << s.output;
  // The plan's own schedule (zb-h1 where its replay beats 1F1B's).
  const std::string schedule = nlohmann::json::parse(read_file(plan)).at("schedule").get<std::string>();
  EXPECT_THAT(s.output, HasSubstr("simulated " + schedule + ": step"));
  const std::string bad = temp_file("h2_cli_cluster.yaml",
                                    "chips:\n  - {name: A, peak_tflops: 1, memory_gib: 1, "
                                    "memory_bandwidth_gbps: 1}\ngroups:\n  - {chip: B, nodes: 1, "
                                    "chips_per_node: 1, nic_gbps: 1}\n");
  const Result e =
      run_h2("plan --cluster " + bad + " --model " + ex + "model_small.yaml --train " + ex + "train_small.yaml");
  EXPECT_EQ(e.status, 1);
  EXPECT_THAT(e.output, HasSubstr("field 'groups[0].chip': unknown chip type 'B'"));
  EXPECT_EQ(run_h2("simulate " + plan + " --schedule zigzag").status, 1);
  const Result chunks = run_h2("simulate " + plan + " --schedule interleaved --chunks 1000000");
  EXPECT_EQ(chunks.status, 1);
  EXPECT_THAT(chunks.output, HasSubstr("1000000 chunks per stage, but a stage has only"));
  EXPECT_THAT(run_h2("simulate /nonexistent/plan.json").output, HasSubstr("/nonexistent/plan.json: cannot open"));
}

// Without ZB-H1 (zero_bubble: false in the training file), the catalog example's best plan of whole blocks is
// interleaved (docs/planner.md); --no-interleave plans 1F1B, as h2 train --cluster does on emulated chips. Stage
// boundaries inside blocks (the default) give a faster 1F1B plan, whose table names the halves ("46m-54": block 46's
// MLP half through block 54).
TEST(CliPlan, NoInterleaveLeavesInterleavingOut) {
  const std::string ex = std::string(H2_SOURCE_DIR) + "/examples/";
  const std::string train =
      temp_file("h2_cli_train_100b.yaml", read_file(ex + "train_100b.yaml") + "zero_bubble: false\n");
  const std::string cluster = ex + "cluster_catalog1024.yaml --model " + ex + "model_100b.yaml --train " + train;
  const Result all = run_h2("plan --whole-blocks --cluster " + cluster);
  ASSERT_EQ(all.status, 0) << all.output;
  EXPECT_THAT(all.output, HasSubstr(", interleaved ("));
  EXPECT_THAT(all.output, Not(::testing::ContainsRegex("[0-9]m-")));
  const Result halves = run_h2("plan --cluster " + cluster);
  ASSERT_EQ(halves.status, 0) << halves.output;
  EXPECT_THAT(halves.output, ::testing::ContainsRegex("[0-9]m-[0-9]+ \\([0-9]+\\.5\\)"));
  const Result without = run_h2("plan --whole-blocks --no-interleave --cluster " + cluster);
  ASSERT_EQ(without.status, 0) << without.output;
  EXPECT_THAT(without.output, Not(HasSubstr("interleaved")));
  EXPECT_THAT(without.output, HasSubstr("per pipeline, 1f1b"));
}

// h2 plan --baseline TYPE plans that chip type alone with its own search, and the search line under the plan counts
// that search: the layouts its why line names (until 2026-12-06 it printed the mixed search's, 484 generated where
// the slow chips alone had 67, after running that search for nothing). An unknown type is named.
TEST(CliPlan, ABaselineIsCountedByItsOwnSearch) {
  const std::string ex = std::string(H2_SOURCE_DIR) + "/examples/";
  const std::string files =
      " --cluster " + ex + "cluster_local.yaml --model " + ex + "model_small.yaml --train " + ex + "train_local.yaml";
  const Result slow = run_h2("plan --baseline slow" + files);
  ASSERT_EQ(slow.status, 0) << slow.output;
  EXPECT_THAT(slow.output, HasSubstr("on cluster 'local-emu/slow'"));
  std::smatch why, search;
  ASSERT_TRUE(std::regex_search(slow.output, why, std::regex(R"(\((\d+) generated, (\d+) pruned for memory)")));
  ASSERT_TRUE(std::regex_search(slow.output, search, std::regex(R"(search: (\d+) layouts generated, (\d+) pruned)")));
  EXPECT_EQ(why[1], search[1]);
  EXPECT_EQ(why[2], search[2]);
  const Result tpu = run_h2("plan --baseline tpu" + files);
  EXPECT_EQ(tpu.status, 1);
  EXPECT_THAT(tpu.output, HasSubstr("--baseline 'tpu' is neither 'uniform' nor a chip type of"));
}

// What does this layout cost: h2 plan --layout writes the layout's plan; h2 simulate re-costs a plan with other
// figures; a plan that contradicts itself is refused naming the field.
TEST(CliPlan, LayoutAndRecostingSimulation) {
  const std::string ex = std::string(H2_SOURCE_DIR) + "/examples/";
  const std::string files =
      " --cluster " + ex + "cluster_local.yaml --model " + ex + "model_small.yaml --train " + ex + "train_local.yaml";
  const std::string plan = testing_util::temp_path("cli_layout_plan.json");
  const Result p = run_h2("plan --layout " + ex + "layout_local.yaml --out " + plan + files);
  ASSERT_EQ(p.status, 0) << p.output;
  EXPECT_THAT(p.output, HasSubstr("costed as given (--layout)"));
  EXPECT_THAT(p.output, HasSubstr("0-1 (2)+E      none "));
  const Result same = run_h2("simulate " + plan);
  const Result recosted = run_h2("simulate " + plan + files);
  ASSERT_EQ(recosted.status, 0) << recosted.output;
  EXPECT_THAT(recosted.output, HasSubstr("re-costed with"));
  // The same figures give the same step (the first line after the re-costing note).
  EXPECT_THAT(recosted.output, HasSubstr(same.output.substr(0, same.output.find('\n'))));
  // Re-costed with another model file (planner/plan.h, check_plan_model: the runtime's check too).
  const Result other = run_h2("simulate " + plan + " --cluster " + ex + "cluster_local.yaml --model " + ex +
                              "model_100b.yaml --train " + ex + "train_local.yaml");
  EXPECT_EQ(other.status, 1);
  EXPECT_THAT(other.output, HasSubstr("made for a model of 4 blocks x 256 (4 heads, vocabulary 50257, 256 tokens); "
                                      "the model file has 80 blocks x 10240"));
  // A plan whose micro-batches contradict its batch.
  nlohmann::json j = nlohmann::json::parse(read_file(plan));
  j["num_micro_batches"] = 3;
  const std::string bad = temp_file("cli_bad_plan.json", j.dump());
  const Result b = run_h2("simulate " + bad);
  EXPECT_EQ(b.status, 1);
  EXPECT_THAT(b.output, HasSubstr("field 'num_micro_batches': 3 micro-batches of 1 sequences on 1 pipelines make 3"));
  const Result chunks = run_h2("simulate " + plan + " --schedule interleaved --chunks 1000000");
  EXPECT_EQ(chunks.status, 1);
  EXPECT_THAT(chunks.output, HasSubstr("field 'chunks': 1000000 chunks per stage, but a stage has only 0 layers"));
  // The shipped layout whose stages meet inside block 1, and its plan re-costed.
  const std::string halves = testing_util::temp_path("cli_layout_halves.json");
  const Result h = run_h2("plan --layout " + ex + "layout_local_halves.yaml --out " + halves + files);
  ASSERT_EQ(h.status, 0) << h.output;
  EXPECT_THAT(h.output, HasSubstr("0-1a (1.5)+E"));
  EXPECT_THAT(h.output, HasSubstr("1m-3 (2.5)"));
  const Result h_recosted = run_h2("simulate " + halves + files);
  ASSERT_EQ(h_recosted.status, 0) << h_recosted.output;
  EXPECT_THAT(h_recosted.output, HasSubstr(run_h2("simulate " + halves).output.substr(0, 40)));
}

TEST(CliLaunch, SetsTheRendezvousVariables) {
  const Result r = run_h2(
      "launch -n 3 -- sh -c 'echo rank=$H2_RANK/$H2_WORLD_SIZE port=${H2_MASTER_PORT:+set} "
      "token=${#H2_JOB_TOKEN}'");
  EXPECT_EQ(r.status, 0) << r.output;
  for (int rank = 0; rank < 3; ++rank) EXPECT_THAT(r.output, HasSubstr(cat("rank=", rank, "/3 port=set token=32")));
}

TEST(CliLaunch, AFailedRankStopsTheOthersAndIsNamed) {
  const std::string dir = testing_util::temp_dir("launch");
  // Ranks 0 and 2 install a SIGTERM trap, say they are ready and wait; rank 1 fails once they are ready. The
  // traps record that the launcher told them to stop. Every loop is bounded.
  std::ofstream(dir + "/rank.sh") << "d=" << dir << "\n"
                                  << "trap 'touch $d/stopped_$H2_RANK; exit 143' TERM\n"
                                     "if [ $H2_RANK = 1 ]; then\n"
                                     "  for i in $(seq 200); do\n"
                                     "    [ -e $d/ready_0 ] && [ -e $d/ready_2 ] && exit 3\n"
                                     "    sleep 0.05\n"
                                     "  done\n"
                                     "  exit 3\n"
                                     "fi\n"
                                     "touch $d/ready_$H2_RANK\n"
                                     "for i in $(seq 300); do sleep 0.1; done\n";
  const Result r = run_h2("launch -n 3 --grace 5 -- sh " + dir + "/rank.sh");
  EXPECT_EQ(r.status, 3) << r.output;
  EXPECT_THAT(r.output, HasSubstr("h2 launch: rank 1 exited with status 3; stopping the other 2 rank(s)"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/stopped_0"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/stopped_2"));
}

// A user's Ctrl-C stops the job, not a failure: the launcher passes it on to every rank, which gets it whatever the
// launcher ignores (started from a script's background, a launcher ignoring SIGINT passed that on too, and its ranks
// ignored the Ctrl-C until the grace period ended in SIGKILL, reported as a failed rank), and exits with 130.
TEST(CliLaunch, ACtrlCIsPassedOnToEveryRankAndIsNoFailure) {
  const std::string dir = testing_util::temp_dir("launch_int");
  // Each rank traps SIGINT (a shell cannot trap a signal ignored when it started), says it is ready and waits.
  std::ofstream(dir + "/rank.sh") << "d=" << dir << "\n"
                                  << "trap 'touch $d/interrupted_$H2_RANK; exit 130' INT\n"
                                     "touch $d/ready_$H2_RANK\n"
                                     "for i in $(seq 300); do sleep 0.1; done\n";
  const pid_t launcher = ::fork();
  if (launcher == 0) {
    std::signal(SIGINT, SIG_IGN);  // as a non-interactive shell starts a job in the background
    const int fd = ::open((dir + "/launch.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    const std::string script = dir + "/rank.sh";
    ::execl(H2_BINARY, H2_BINARY, "launch", "-n", "2", "--grace", "20", "--", "sh", script.c_str(),
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  for (int i = 0; i < 400; ++i) {  // up to 20 s for both to start
    if (std::filesystem::exists(dir + "/ready_0") && std::filesystem::exists(dir + "/ready_1")) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::kill(launcher, SIGINT);
  int status = 0;
  ::waitpid(launcher, &status, 0);
  const std::string log = read_file(dir + "/launch.log");
  ASSERT_TRUE(WIFEXITED(status)) << log;
  EXPECT_EQ(WEXITSTATUS(status), 130) << log;
  EXPECT_THAT(log, HasSubstr("h2 launch: stopped by signal 2 (Interrupt), passed on to every rank"));
  EXPECT_THAT(log, Not(HasSubstr("h2 launch: rank")));
  EXPECT_TRUE(std::filesystem::exists(dir + "/interrupted_0")) << log;
  EXPECT_TRUE(std::filesystem::exists(dir + "/interrupted_1")) << log;
}

// The single-device workflow end to end on a tiny tokenizer and corpus: prepare, train, resume, sample.
class CliTraining : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing_util::temp_dir("cli_training");
    testing_util::write_tiny_tokenizer(dir_);
    std::string text;
    for (int i = 0; i < 400; ++i) text += "the whale hunted the sea and the sea hunted the whale. ";
    std::ofstream(dir_ + "/a.txt") << text;
    std::ofstream(dir_ + "/b.txt") << text.substr(0, text.size() / 2);
    tok_ = " --encoder " + dir_ + "/encoder.json --vocab " + dir_ + "/vocab.bpe";
    config_ = dir_ + "/train.yaml";
    std::ofstream config(config_);
    config
        << ("model: {n_layer: 1, n_head: 2, n_embd: 16, vocab_size: 260, seq_len: 32}\n"
            "data: {train: " +
            dir_ + "/tokens/train_*.bin, val: " + dir_ +
            "/tokens/val_*.bin}\n"
            "train: {batch_size: 2, seq_len: 32, steps: 4, eval_batches: 2, out_dir: " +
            dir_ + "/run}\n");
  }
  std::string dir_, tok_, config_;
};

TEST_F(CliTraining, PrepareTrainResumeSample) {
  const Result prep = run_h2("data prepare --out " + dir_ + "/tokens --val-fraction 0.2" + tok_ + " " + dir_ +
                             "/a.txt " + dir_ + "/b.txt");
  ASSERT_EQ(prep.status, 0) << prep.output;
  EXPECT_THAT(prep.output, HasSubstr("unigram entropy"));
  const Result tr = run_h2("train --config " + config_ + " --quiet");
  ASSERT_EQ(tr.status, 0) << tr.output;
  EXPECT_THAT(tr.output, HasSubstr("done: 4 steps"));
  EXPECT_THAT(tr.output, HasSubstr("val loss"));
  const Result more = run_h2("train --config " + config_ + " --resume --set train.steps=6");
  ASSERT_EQ(more.status, 0) << more.output;
  EXPECT_THAT(more.output, HasSubstr("resumed from"));
  EXPECT_THAT(more.output, HasSubstr("step     5/6"));
  const Result s1 = run_h2("sample --run " + dir_ + "/run --prompt \"the \" --tokens 8 --top-k 1" + tok_);
  const Result s2 = run_h2("sample --run " + dir_ + "/run --prompt \"the \" --tokens 8 --top-k 1" + tok_);
  ASSERT_EQ(s1.status, 0) << s1.output;
  EXPECT_THAT(s1.output, HasSubstr("the "));
  EXPECT_EQ(s1.output, s2.output);  // greedy decoding is deterministic
}

TEST_F(CliTraining, BadInputIsNamed) {
  ASSERT_EQ(run_h2("data prepare --out " + dir_ + "/tokens" + tok_ + " " + dir_ + "/a.txt").status, 0);
  EXPECT_THAT(run_h2("train --config /nonexistent/train.yaml").output,
              HasSubstr("/nonexistent/train.yaml: cannot open"));
  const Result heads = run_h2("train --config " + config_ + " --set model.n_head=3");
  EXPECT_EQ(heads.status, 1);
  EXPECT_THAT(heads.output, HasSubstr("n_head = 3 does not divide n_embd = 16"));
  const Result resume = run_h2("train --config " + config_ + " --resume --set train.out_dir=" + dir_ + "/empty");
  EXPECT_EQ(resume.status, 1);
  EXPECT_THAT(resume.output, HasSubstr("no checkpoint to resume from"));
  const Result data = run_h2("train --config " + config_ + " --set data.train=" + dir_ + "/none_*.bin");
  EXPECT_EQ(data.status, 1);
  EXPECT_THAT(data.output, HasSubstr("no file matches"));
  const Result tok = run_h2("data prepare --out " + dir_ + "/x --encoder " + dir_ + "/nope.json " + dir_ + "/a.txt");
  EXPECT_EQ(tok.status, 1);
  EXPECT_THAT(tok.output, HasSubstr("nope.json: cannot open"));
  // An output directory that is a file, and a model far past the host's memory: errors, not aborts.
  const std::string file = dir_ + "/a.txt";
  const Result out_file = run_h2("train --config " + config_ + " --set train.out_dir=" + file);
  EXPECT_EQ(out_file.status, 1);
  EXPECT_THAT(out_file.output, HasSubstr("train.out_dir '" + file + "' exists and is not a directory"));
  const Result prep_file = run_h2("data prepare --out " + file + tok_ + " " + file);
  EXPECT_EQ(prep_file.status, 1);
  EXPECT_THAT(prep_file.output, HasSubstr("data prepare --out '" + file + "' exists and is not a directory"));
  const Result huge = run_h2("train --config " + config_ + " --set model.n_layer=1073741824");
  EXPECT_EQ(huge.status, 1);
  EXPECT_THAT(huge.output, HasSubstr("1073741824 blocks of n_embd 16"));
}

// `h2 train --cluster` end to end on a two-chip emulated cluster (one fast chip with little memory, one slow
// with more) and a tiny GPT: plan, two processes, checkpoints; a rank killed mid-step stops the job naming it,
// the last checkpoint stays intact, and --resume reaches the same final loss as the uninterrupted run.
class ClusterTraining : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing_util::temp_dir("cli_cluster");
    testing_util::write_pattern_shards(dir_, 64);
    cluster_ = dir_ + "/cluster.yaml";
    std::ofstream(cluster_) << "name: two-chips\nchips:\n"
                               "  - {name: fast, peak_tflops: 0.2, efficiency: 0.5, memory_gib: 0.05, "
                               "memory_bandwidth_gbps: 8}\n"
                               "  - {name: slow, peak_tflops: 0.1, efficiency: 0.5, memory_gib: 1, "
                               "memory_bandwidth_gbps: 4}\n"
                               "groups:\n"
                               "  - {chip: fast, nodes: 1, chips_per_node: 1, intra_node_gbps: 5, nic_gbps: 5}\n"
                               "  - {chip: slow, nodes: 1, chips_per_node: 1, intra_node_gbps: 5, nic_gbps: 5}\n"
                               "links:\n  - {between: [fast, slow], bandwidth_gbps: 5, latency_us: 20}\n";
    model_ = dir_ + "/model.yaml";
    std::ofstream(model_) << "name: tiny\nlayers: 4\nhidden: 32\nheads: 2\nvocab: 64\nseq_len: 16\n";
    train_ = dir_ + "/setup.yaml";
    std::ofstream(train_) << "global_batch: 4\nzero1: false\nmicro_batches: [1, 2]\n";
    config_ = dir_ + "/train.yaml";
    std::ofstream(config_)
        << "model: {n_layer: 4, n_head: 2, n_embd: 32, vocab_size: 64, seq_len: 16}\n"
           "data: {train: " +
               dir_ + "/train_*.bin, val: " + dir_ +
               "/val_*.bin}\n"
               "optim: {lr: 3.0e-3, warmup_steps: 0}\n"
               "train: {batch_size: 4, seq_len: 16, steps: 6, checkpoint_every: 2, keep_checkpoints: 5, "
               "log_every: 1, eval_every: 3, eval_batches: 2, out_dir: " +
               dir_ + "/run}\n";
  }
  std::string command() const {
    return "train --config " + config_ + " --cluster " + cluster_ + " --model " + model_ + " --train " + train_;
  }
  static std::vector<std::string> metric_lines(const std::string& path) {
    std::ifstream in(path);
    std::vector<std::string> out;
    for (std::string line; std::getline(in, line);) out.push_back(line);
    return out;
  }
  std::string dir_, cluster_, model_, train_, config_;
};

// A plan whose ranks need more of this host's memory than it has is refused before any rank starts, after the plan
// (printed first, though stdout is a pipe here), with the figures and what to do instead; nothing is launched.
TEST_F(ClusterTraining, APlanNeedingMoreHostMemoryThanThereIsStartsNoRank) {
  const std::string plan = dir_ + "/plan.json", big = dir_ + "/big.json";
  ASSERT_EQ(
      run_h2("plan --cluster " + cluster_ + " --model " + model_ + " --train " + train_ + " --out " + plan).status, 0);
  nlohmann::json json = nlohmann::json::parse(read_file(plan));
  json["stages"][0]["memory_bytes"] = 1e18;  // an emulated device of an exabyte: no host has it
  std::ofstream(big) << json.dump();
  const Result r = run_h2(command() + " --plan " + big);
  EXPECT_EQ(r.status, 1) << r.output;
  const size_t printed = r.output.find("predicted: step"), error = r.output.find("h2: error: this plan starts 2 ranks");
  ASSERT_NE(error, std::string::npos) << r.output;
  EXPECT_LT(printed, error) << r.output;
  EXPECT_THAT(r.output, HasSubstr("Plan for fewer devices"));
  EXPECT_THAT(r.output, Not(HasSubstr("launching")));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/run/metrics.jsonl"));
}

// A chip type may run on this host's cores instead of an emulation (backend: cpu), as a GPU's would on the GPU
// (backend: cuda): one job, two backends, each rank on its own.
TEST_F(ClusterTraining, EachChipTypeRunsOnItsBackend) {
  std::string cluster = read_file(cluster_);
  cluster.replace(cluster.find("memory_bandwidth_gbps: 4}"), 25, "memory_bandwidth_gbps: 4, backend: cpu}");
  std::ofstream(cluster_) << cluster;
  const Result r = run_h2(command() + " --set train.steps=2 --set train.out_dir=" + dir_ + "/backends");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("step     2/2"));
  EXPECT_THAT(r.output, HasSubstr("(stage 0, fast on emu)"));
  EXPECT_THAT(r.output, HasSubstr("(stage 1, slow on cpu)"));
}

// The two ends of the pipeline sum the tied embedding's gradient in an all-reduce; with a vocabulary of 1,024 rows it
// is past the small-message size and goes through a shared window, whose setup waits on the rendezvous store. The
// last stage got there while its last gradient send to the first stage (32 KiB: a rendezvous, not an eager send)
// was still in flight, and the first stage, waiting for that send, never came: a deadlock, until the pipeline's
// sends were completed first.
TEST_F(ClusterTraining, ALargeTiedEmbeddingIsSummedAfterThePipelinesSends) {
  std::ofstream(model_) << "name: tiny\nlayers: 4\nhidden: 64\nheads: 2\nvocab: 1024\nseq_len: 128\n";
  const std::string layout = dir_ + "/layout.yaml", plan = dir_ + "/two_stages.json";
  std::ofstream(layout) << "dp: 1\nmicro_batch: 1\nschedule: 1f1b\nstages:\n  - {chip: fast, tp: 1, layers: 2}\n"
                           "  - {chip: slow, tp: 1, layers: 2}\n";
  const Result p = run_h2("plan --cluster " + cluster_ + " --model " + model_ + " --train " + train_ + " --layout " +
                          layout + " --out " + plan);
  ASSERT_EQ(p.status, 0) << p.output;
  const Result r = run_h2(command() + " --plan " + plan +
                          " --set train.steps=2 --set model.vocab_size=1024 --set model.n_embd=64 --set "
                          "model.seq_len=128 --set train.seq_len=128 --set train.out_dir=" +
                          dir_ + "/vocab");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("step     2/2"));
}

// Two stages that meet inside a block: the planner's plan (0-2 on the fast chip with the embedding, 3 and the head on
// the slow one) with block 2's MLP half moved to the second stage (0-2a and 2m-3) trains as one device does (the
// held-out loss of the single-device run, the reference), and each rank's memory, term by term, is what costs.h
// counts for its halves, to the byte. Each stage also recomputes only its first block in full (block 0; block 2's
// MLP half), keeping the others' activations.
TEST_F(ClusterTraining, StagesThatMeetInsideABlockAndRecomputeSomeBlocksTrainAsOneDeviceDoes) {
  const Result full = run_h2(command() + " --set train.steps=1 --set train.out_dir=" + dir_ + "/planned");
  ASSERT_EQ(full.status, 0) << full.output;
  nlohmann::json plan = nlohmann::json::parse(read_file(dir_ + "/planned/plan.json"));
  ASSERT_EQ(plan["stages"].size(), 2u);
  nlohmann::json& first = plan["stages"][0];
  nlohmann::json& second = plan["stages"][1];
  ASSERT_GE(first["layers"].get<int>(), 2) << plan.dump(2);
  first["ends_at_attention"] = true;
  second["first_layer"] = second["first_layer"].get<int>() - 1;
  second["layers"] = second["layers"].get<int>() + 1;
  second["starts_at_mlp"] = true;
  for (nlohmann::json* stage : {&first, &second}) {
    (*stage)["recompute"] = "full";
    (*stage)["recompute_blocks"] = 1;
  }
  const std::string halves = dir_ + "/halves.json";
  std::ofstream(halves) << plan.dump(2);
  const Result r = run_h2(command() + " --plan " + halves + " --set train.out_dir=" + dir_ + "/halves");
  ASSERT_EQ(r.status, 0) << r.output;
  const Result single = run_h2("train --config " + config_ + " --quiet --set train.out_dir=" + dir_ + "/single");
  ASSERT_EQ(single.status, 0) << single.output;
  const auto val = [](const std::string& path) {
    return nlohmann::json::parse(metric_lines(path).back()).at("val_loss").get<double>();
  };
  const double want = val(dir_ + "/single/metrics.jsonl");
  EXPECT_NEAR(val(dir_ + "/halves/metrics.jsonl"), want, 1e-4 * want);
  const auto summary = nlohmann::json::parse(read_file(dir_ + "/halves/summary.json"));
  ASSERT_EQ(summary.at("memory").size(), 2u);
  for (const auto& m : summary.at("memory")) {
    double predicted = 0;
    for (const auto& [term, pair] : m.at("terms").items()) {
      EXPECT_EQ(pair.at("measured").get<double>(), pair.at("predicted").get<double>()) << term << ": " << m.dump();
      predicted += pair.at("predicted").get<double>();
    }
    EXPECT_EQ(m.at("peak_bytes").get<double>(), predicted) << m.dump();
  }
}

TEST_F(ClusterTraining, TrainsOnTwoProcessesWritesTracesAndResumesAfterAKilledRank) {
  const Result full = run_h2(command() + " --set train.out_dir=" + dir_ + "/full");
  ASSERT_EQ(full.status, 0) << full.output;
  EXPECT_THAT(full.output, HasSubstr("launching 2 ranks"));
  EXPECT_THAT(full.output, HasSubstr("step     6/6"));
  EXPECT_THAT(full.output, HasSubstr("measured / simulated"));
  for (const char* f :
       {"plan.json", "metrics.jsonl", "trace_measured.json", "trace_predicted.json", "summary.json",
        "checkpoints/step_000006/model.stage0.safetensors", "checkpoints/step_000006/model.stage1.safetensors"}) {
    EXPECT_TRUE(std::filesystem::exists(dir_ + "/full/" + f)) << f;
  }
  const auto full_metrics = metric_lines(dir_ + "/full/metrics.jsonl");
  ASSERT_EQ(full_metrics.size(), 8u);  // 6 steps, held-out loss after steps 3 and 6
  // The held-out loss is the single-device run's (the reference: the same model, data and steps on one device).
  EXPECT_THAT(full.output, HasSubstr("step     6 | val loss"));
  const Result single = run_h2("train --config " + config_ + " --quiet --set train.out_dir=" + dir_ + "/single");
  ASSERT_EQ(single.status, 0) << single.output;
  const auto val = [](const std::string& line) { return nlohmann::json::parse(line).at("val_loss").get<double>(); };
  const double want = val(metric_lines(dir_ + "/single/metrics.jsonl").back());
  EXPECT_NEAR(val(full_metrics.back()), want, 1e-4 * want);
  // Every rank's measured memory peak beside the plan's figure: printed, and in summary.json, equal to the byte.
  EXPECT_THAT(full.output, HasSubstr("memory per device, measured peak beside the plan's prediction"));
  const auto summary = nlohmann::json::parse(read_file(dir_ + "/full/summary.json"));
  ASSERT_EQ(summary.at("memory").size(), 2u);
  for (const auto& m : summary.at("memory")) {
    EXPECT_EQ(m.at("peak_bytes").get<double>(), m.at("planned_bytes").get<double>()) << m.dump();
    EXPECT_EQ(m.at("emulation_drift").get<double>(), 1.0) << m.dump();  // a cluster file not profiled lists no work
    ASSERT_EQ(m.at("terms").size(), 9u);                                // kStageMemoryTerms
    for (const auto& [term, v] : m.at("terms").items()) {
      EXPECT_EQ(v.at("measured").get<double>(), v.at("predicted").get<double>()) << term;
    }
  }
  EXPECT_EQ(nlohmann::json::parse(full_metrics.front()).at("mem_peak_bytes").size(), 2u);
  // Every rank's process, measured, beside the host memory counted for it before the launch (check_host_memory):
  // 256 MiB for the process, its emulated device and its checkpoints' buffers. In the release build, below the count
  // (a process that took more would let plans this host cannot hold through the check) and not far above it either (a
  // count more than twice the need would refuse plans this host can hold): these ranks took 168-170 MiB of their 257
  // MiB, 2026-12-07. Not under AddressSanitizer, whose allocator makes a rank's process another size (98 MiB there).
  for (const auto& m : summary.at("memory")) {
    const double peak = m.at("host_peak_bytes").get<double>(), counted = m.at("host_counted_bytes").get<double>();
    // Beside them the checkpoints' buffers (by hand in ClusterJobHostMemory.CheckpointsTake...): under 1 MiB here.
    EXPECT_GT(counted, 256.0 * (1 << 20) + m.at("planned_bytes").get<double>()) << m.dump();
    EXPECT_LT(counted, 257.0 * (1 << 20) + m.at("planned_bytes").get<double>()) << m.dump();
    EXPECT_GT(peak, m.at("peak_bytes").get<double>()) << m.dump();  // the process holds its emulated device
#ifndef __SANITIZE_ADDRESS__
    EXPECT_LE(peak, counted) << m.dump();
    EXPECT_GT(peak, 0.4 * counted) << m.dump();
#endif
  }
  EXPECT_THAT(full.output, HasSubstr("host memory, each rank's measured peak resident beside h2's count for it: "
                                     "2 rank(s) together "));
  // Both ranks' actions are in the measured trace.
  std::ifstream trace(dir_ + "/full/trace_measured.json");
  const std::string text((std::istreambuf_iterator<char>(trace)), std::istreambuf_iterator<char>());
  EXPECT_THAT(text, HasSubstr("\"0F0\""));
  EXPECT_THAT(text, HasSubstr("\"1B0\""));
  // The cluster file's datasheet figures are not what emulated chips follow: said, with the fixes.
  EXPECT_THAT(full.output, HasSubstr("holds datasheet figures, which the emulated chips on this host do not follow"));
  // h2 calibrate fits the figures the run was planned on (its cluster.yaml) to its trace and writes a cluster
  // file the planner reads; each fitted class is then predicted as measured (the fit's own accuracy is in
  // sim/calibrate_test.cc, against planted figures).
  const Result cal = run_h2("calibrate " + dir_ + "/full --out " + dir_ + "/calibrated.yaml");
  ASSERT_EQ(cal.status, 0) << cal.output;
  // Fitted, or "not fitted" when this run's microsecond kernels measured below what any scale of the figure reaches.
  EXPECT_THAT(cal.output, HasSubstr("slow compute (forward + backward): "));
  EXPECT_THAT(cal.output, HasSubstr("step (simulated)"));
  const Cluster calibrated = load_cluster(ConfigNode::load_file(dir_ + "/calibrated.yaml"));
  EXPECT_EQ(calibrated.figures, Figures::kCalibrated);
  const Result replanned = run_h2("simulate " + dir_ + "/full/plan.json --cluster " + dir_ + "/calibrated.yaml");
  EXPECT_EQ(replanned.status, 0) << replanned.output;
  const Result missing = run_h2("calibrate " + dir_ + "/nowhere");
  EXPECT_NE(missing.status, 0);
  EXPECT_THAT(missing.output, HasSubstr(dir_ + "/nowhere/plan.json does not exist"));

  // Rank 1 dies in step 5: the job stops naming it; step 4's checkpoint is the latest and intact.
  const Result killed = run_h2(command(), "H2_FAULT_KILL=1:5");
  EXPECT_NE(killed.status, 0);
  EXPECT_THAT(killed.output, HasSubstr("rank 1 was killed by signal 9"));
  std::ifstream latest(dir_ + "/run/checkpoints/latest");
  std::string name;
  latest >> name;
  EXPECT_EQ(name, "step_000004");

  const Result resumed = run_h2(command() + " --resume");
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_THAT(resumed.output, HasSubstr("resumed from"));
  const auto resumed_metrics = metric_lines(dir_ + "/run/metrics.jsonl");
  ASSERT_EQ(resumed_metrics.size(), 8u);
  EXPECT_EQ(resumed_metrics.back(), full_metrics.back());  // the held-out loss after step 6, bit for bit
  const std::string& last_step = resumed_metrics[resumed_metrics.size() - 2];
  const std::string& full_step = full_metrics[full_metrics.size() - 2];
  EXPECT_EQ(last_step.substr(0, last_step.find("\"step_s\"")), full_step.substr(0, full_step.find("\"step_s\"")));
}

// Each rank reads only its own stage's tensors of a checkpoint; which checkpoint they resume from, they decide
// together: each verifies its share of every candidate's tensors, and rank 0 hears every share's finding. Two tensors
// damaged in the newest checkpoint's last stage — a file the first stage's rank does not read; adjacent in the
// verification's order, so one in each rank's share — send every rank back to the checkpoint before, the warning
// counting both shares' findings, and the run ends where the uninterrupted one did.
TEST_F(ClusterTraining, ADamagedStageOfTheNewestCheckpointSendsEveryRankToTheOneBefore) {
  const Result full = run_h2(command());  // 6 steps, a checkpoint every 2
  ASSERT_EQ(full.status, 0) << full.output;
  const auto full_metrics = metric_lines(dir_ + "/run/metrics.jsonl");
  const std::string damaged = dir_ + "/run/checkpoints/step_000006/model.stage1.safetensors";
  std::vector<std::string> names;  // its tensors in the verification's order
  {
    const SafetensorsFile file(damaged);
    for (const SafetensorsEntry& e : file.entries()) names.push_back(e.name);
  }
  ASSERT_GE(names.size(), 2u);
  for (size_t i : {names.size() - 2, names.size() - 1}) testing_util::flip_tensor_bit(damaged, names[i]);
  const Result resumed = run_h2(command() + " --resume");
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_THAT(resumed.output, HasSubstr("warning: not resuming from " + dir_ + "/run/checkpoints/step_000006: "));
  EXPECT_THAT(resumed.output, HasSubstr("model.stage1.safetensors: tensor '"));
  EXPECT_THAT(resumed.output, HasSubstr("'s share; 1 other rank(s) found damage in theirs)"));
  EXPECT_THAT(resumed.output, HasSubstr("resumed from " + dir_ + "/run/checkpoints/step_000004"));
  EXPECT_EQ(metric_lines(dir_ + "/run/metrics.jsonl").back(), full_metrics.back());  // the held-out loss, bit for bit
}

// Under mpirun (or srun) every process is one rank of a given plan: the ranks find each other through the
// variables the launcher sets (here set by hand: OMPI_COMM_WORLD_RANK/SIZE, as Open MPI's mpirun does), train,
// and rank 0 writes the merged trace and summary. The reference: the same plan run by the local driver.
TEST_F(ClusterTraining, RanksStartedByMpirunRunAGivenPlan) {
  const Result local = run_h2(command() + " --set train.out_dir=" + dir_ + "/local");
  ASSERT_EQ(local.status, 0) << local.output;
  const std::string plan = dir_ + "/local/plan.json", out = dir_ + "/mpi";
  const int port = testing_util::free_port();
  const auto rank = [&](int r) {
    return cat("OMPI_COMM_WORLD_RANK=", r, " OMPI_COMM_WORLD_SIZE=2 H2_MASTER_PORT=", port, " H2_JOB_TOKEN=cli-test ",
               H2_BINARY, " ", command(), " --plan ", plan, " --quiet --set train.out_dir=", out, " > ", dir_,
               "/mpi_rank", r, ".log 2>&1");
  };
  const std::string script = cat("(", rank(1), ") & ", rank(0), "; s=$?; wait $!; exit $((s | $?))");
  const int status = std::system(script.c_str());
  EXPECT_EQ(status, 0) << read_file(dir_ + "/mpi_rank0.log") << read_file(dir_ + "/mpi_rank1.log");
  EXPECT_THAT(read_file(dir_ + "/mpi_rank0.log"), HasSubstr("measured / simulated"));
  for (const char* f : {"plan.json", "trace_measured.json", "summary.json", "checkpoints/step_000006/state.json"}) {
    EXPECT_TRUE(std::filesystem::exists(out + "/" + f)) << f;
  }
  // Both runs end on the same loss (the same plan, data and seed).
  const auto last = [](const std::string& path) {
    const auto lines = metric_lines(path);
    return nlohmann::json::parse(lines[lines.size() - 2])["loss"].get<double>();
  };
  // (Within rounding: these ranks' OpenMP thread counts are the environment's, the driver's ranks get 1 each.)
  const double want = last(dir_ + "/local/metrics.jsonl");
  EXPECT_NEAR(last(out + "/metrics.jsonl"), want, 1e-5 * want);
  // Without --plan the ranks could disagree: refused, naming the fix.
  const Result no_plan = run_h2(command(), "OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=2");
  EXPECT_NE(no_plan.status, 0);
  EXPECT_THAT(no_plan.output, HasSubstr("under mpirun needs --plan"));
}

// h2 profile measures each chip type (on the first of one process per device that has it, one type at a time) and
// the link, and writes a cluster file the planner reads: the measured FLOP rate as the peak at efficiency 1. (The
// rates themselves are not checked: this model's kernels are too small to time; docs/pipeline.md has the example's.)
TEST_F(ClusterTraining, ProfileWritesAMeasuredClusterTheTrainerPlansWith) {
  const std::string out = dir_ + "/profiled.yaml";
  const Result r = run_h2("profile --cluster " + cluster_ + " --model " + model_ + " --out " + out);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("one chip type at a time, on the first of 2 processes (one per device)"));
  // Its first lines say which chips are emulated and at what speed; the devices it measures on do not each warn
  // (they once printed eight warnings, half of them "speed 1x the host, memory capped at 16.00 GiB").
  EXPECT_TRUE(std::regex_search(r.output, std::regex("emulated on this host's CPU, their timings following this "
                                                     "profile, not real hardware: fast [0-9.]+x, slow [0-9.]+x "
                                                     "the host")))
      << r.output;
  EXPECT_THAT(r.output, ::testing::Not(HasSubstr("EMULATED")));
  // Each turn says what it measures and, done, how long it took: each chip type twice, in order.
  const size_t learn_fast = r.output.find("rank 0 measured 'fast' (pass 1 of 2, learning its kernels' work) in "),
               learn_slow = r.output.find("rank 1 measured 'slow' (pass 1 of 2, learning its kernels' work) in "),
               timed_fast = r.output.find("rank 0 measured 'fast' (pass 2 of 2, timed as training paces its kernels)"),
               timed_slow = r.output.find("rank 1 measured 'slow' (pass 2 of 2, timed as training paces its kernels)");
  EXPECT_LT(learn_fast, learn_slow) << r.output;
  EXPECT_LT(learn_slow, timed_fast) << r.output;
  EXPECT_LT(timed_fast, timed_slow) << r.output;
  EXPECT_NE(timed_slow, std::string::npos) << r.output;
  const Cluster measured = load_cluster(ConfigNode::load_file(out));
  EXPECT_EQ(measured.name, "two-chips-profiled");
  const ChipType& fast = measured.chips[static_cast<size_t>(measured.chip_index("fast"))];
  const ChipType& slow = measured.chips[static_cast<size_t>(measured.chip_index("slow"))];
  EXPECT_EQ(fast.efficiency, 1.0);
  EXPECT_GT(slow.peak_tflops, 0.0);
  EXPECT_GT(fast.peak_tflops, 0.0);
  EXPECT_GT(fast.memory_bandwidth_gbps, 0.0);
  EXPECT_GT(measured.links.front().bandwidth_gbps, 0.0);
  EXPECT_THAT(r.output, HasSubstr("a message while every rank computes"));
  EXPECT_GT(measured.links.front().latency_us, 0.0);
  // The GEMMs' elements' costs are fitted to the model's five GEMMs (c_attn, attn.c_proj, c_fc, mlp.c_proj, the
  // head's) at TP 1 and 2, at the micro-batch's rows and 4 times them: 20 per chip type, each kept with its time
  // over the fit's.
  const int T = load_model(ConfigNode::load_file(model_)).seq_len;
  EXPECT_THAT(r.output, HasSubstr(cat("per element of input, weight, output (fitted to the GEMMs at ", T, " and ",
                                      4 * T, " rows within")));
  EXPECT_THAT(r.output, HasSubstr("; 20 GEMMs timed in all)"));
  EXPECT_EQ(fast.matmul_corrections.size(), 20u);
  // A block and the head timed whole at TP 1 (one device a node) and one sequence, kept as their forward's and
  // backward's time over what the kernel figures compose, and printed.
  ASSERT_EQ(fast.part_corrections.size(), 1u);
  EXPECT_EQ(fast.part_corrections[0].tp, 1);
  EXPECT_EQ(fast.part_corrections[0].rows, T);
  EXPECT_THAT(r.output,
              HasSubstr(cat("fast block, head measured / composed (forward/backward): TP 1 at ", T, " rows ")));
  for (double ns : fast.matmul_element_ns) EXPECT_GE(ns, 0.0);
  EXPECT_GT(fast.elementwise_gbps, 0.0);
  EXPECT_FALSE(std::filesystem::exists(out + ".ranks.json"));
  EXPECT_FALSE(std::filesystem::exists(out + ".model.yaml"));
  // h2 plan reads it.
  const Result plan = run_h2("plan --cluster " + out + " --model " + model_ + " --train " + train_);
  EXPECT_EQ(plan.status, 0) << plan.output;
  // In bf16 every kernel runs in the dtypes bf16 training gives it (a bf16 attention fed an f32 gradient, say).
  // With --max-rows 4 the GEMMs at twice the micro-batch's rows are timed too (4 times were already), not fitted
  // but kept as corrections: 10 more.
  const Result bf16 =
      run_h2("profile --precision bf16 --max-rows 4 --cluster " + cluster_ + " --model " + model_ + " --out " + out);
  ASSERT_EQ(bf16.status, 0) << bf16.output;
  EXPECT_THAT(bf16.output, HasSubstr("; 30 GEMMs timed in all)"));
  const Cluster bf16_measured = load_cluster(ConfigNode::load_file(out));
  const ChipType& bf16_fast = bf16_measured.chips.front();
  EXPECT_GT(bf16_fast.peak_tflops, 0.0);
  ASSERT_EQ(bf16_fast.matmul_corrections.size(), 30u);
  EXPECT_EQ(std::count_if(bf16_fast.matmul_corrections.begin(), bf16_fast.matmul_corrections.end(),
                          [&](const ChipType::GemmCorrection& g) { return g.rows == 2 * T && g.ratio > 0; }),
            10);
  // and the parts at 2 and 4 times the micro-batch's rows.
  ASSERT_EQ(bf16_fast.part_corrections.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(bf16_fast.part_corrections[static_cast<size_t>(i)].rows, (1 << i) * T);
    const ChipType::PartCorrection& p = bf16_fast.part_corrections[static_cast<size_t>(i)];
    for (double ratio : {p.block_forward, p.block_backward, p.head_forward, p.head_backward}) EXPECT_GT(ratio, 0.0);
  }
  // Two devices of each type: the second of each waits while the first measures, and only the first's figures
  // count (a waiting rank's would be zeros).
  std::string four = read_file(cluster_);
  for (size_t at; (at = four.find("chips_per_node: 1")) != std::string::npos;)
    four.replace(at, 17, "chips_per_node: 2");
  write_file_atomic(dir_ + "/four.yaml", four);
  const Result pairs = run_h2("profile --cluster " + dir_ + "/four.yaml --model " + model_ + " --out " + out);
  ASSERT_EQ(pairs.status, 0) << pairs.output;
  EXPECT_THAT(pairs.output, HasSubstr("on the first of 4 processes"));
  EXPECT_THAT(pairs.output, HasSubstr("rank 2 measures chip type 'slow' (pass 1 of 2"));
  EXPECT_THAT(pairs.output, Not(HasSubstr("rank 1 measures")));
  EXPECT_THAT(pairs.output, Not(HasSubstr("rank 3 measures")));
  for (const ChipType& chip : load_cluster(ConfigNode::load_file(out)).chips) {
    EXPECT_GT(chip.peak_tflops, 0.0) << chip.name;
    EXPECT_GT(chip.memory_bandwidth_gbps, 0.0) << chip.name;
    EXPECT_FALSE(chip.kernel_work.empty()) << chip.name;       // each type's kernels' work, for the runs to pace to
    EXPECT_EQ(chip.part_corrections.size(), 2u) << chip.name;  // TP 1 and 2
  }
  // A run on the profiled figures paces its chips to that work: each rank reports how the host ran the listed
  // kernels against the profile — a ratio of two timings, never exactly 1 once a listed kernel has run. One
  // sequence a step, so that every replica's kernels take the one row profiled: the ones listed.
  std::string one_row = read_file(train_);
  one_row.replace(one_row.find("global_batch: 4"), 15, "global_batch: 1");
  one_row.replace(one_row.find("micro_batches: [1, 2]"), 21, "micro_batches: [1]");
  write_file_atomic(dir_ + "/one_row.yaml", one_row);
  const Result run = run_h2("train --config " + config_ + " --cluster " + out + " --model " + model_ + " --train " +
                            dir_ + "/one_row.yaml --set train.steps=2 --set train.out_dir=" + dir_ + "/profiled_run");
  ASSERT_EQ(run.status, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("host drift"));
  const auto summary = nlohmann::json::parse(read_file(dir_ + "/profiled_run/summary.json"));
  ASSERT_FALSE(summary.at("memory").empty());
  for (const auto& m : summary.at("memory")) {
    const double drift = m.at("emulation_drift").get<double>();
    EXPECT_TRUE(drift > 0.01 && drift < 100 && drift != 1.0) << m.dump();
  }
}

// --elastic: a rank of a 4-device job (2 fast, 2 slow: each stage two replicas) is killed in step 5; the driver
// takes its device out, re-plans on the 3 left (the planner uses all three), resumes step 4's checkpoint under the
// new plan (the ranks verify it; the driver only names it) and finishes. The reference: the same 3-device plan resumed
// from a copy of that checkpoint, without a failure; the last losses agree within 1e-4.
TEST_F(ClusterTraining, ElasticJobsFinishOnTheDevicesLeft) {
  std::string four = read_file(cluster_);
  for (size_t at; (at = four.find("chips_per_node: 1")) != std::string::npos;)
    four.replace(at, 17, "chips_per_node: 2");
  const std::string wide = dir_ + "/four.yaml";
  std::ofstream(wide) << four;
  std::string base = command();
  base.replace(base.find(cluster_), cluster_.size(), wide);
  base += " --set train.keep_checkpoints=0";
  ASSERT_EQ(run_h2(base + " --set train.steps=1 --set train.out_dir=" + dir_ + "/first").status, 0);
  nlohmann::json plan = nlohmann::json::parse(read_file(dir_ + "/first/plan.json"));
  plan["dp"] = 2;
  plan["micro_batch"] = 1;
  plan["num_micro_batches"] = 2;
  nlohmann::json whole = plan["stages"][0];
  whole.erase("ends_at_attention");  // the planner's stage may end inside a block; these hold whole blocks
  plan["stages"] = {whole, whole};
  plan["stages"][0].update({{"chip", "fast"}, {"tp", 1}, {"dp", 2}, {"first_layer", 0}, {"layers", 2}});
  plan["stages"][1].update({{"chip", "slow"}, {"tp", 1}, {"dp", 2}, {"first_layer", 2}, {"layers", 2}});
  plan["stages"][0]["embedding"] = true;
  plan["stages"][0]["head"] = false;
  plan["stages"][1]["embedding"] = false;
  plan["stages"][1]["head"] = true;
  const std::string four_plan = dir_ + "/four_plan.json";
  std::ofstream(four_plan) << plan.dump(2);
  const Result r = run_h2(base + " --plan " + four_plan + " --elastic", "H2_FAULT_KILL=1:5");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("launching 4 ranks"));
  EXPECT_THAT(r.output, HasSubstr("rank 1 was killed by signal 9"));
  EXPECT_THAT(r.output, HasSubstr("devices left"));
  EXPECT_THAT(r.output, HasSubstr("checkpoints/step_000004 (once the ranks verify it)"));
  const nlohmann::json after = nlohmann::json::parse(read_file(dir_ + "/run/plan.json"));
  int ranks = 0;
  for (const auto& s : after["stages"]) ranks += s["tp"].get<int>() * s["dp"].get<int>();
  EXPECT_EQ(ranks, 3);
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/run/plan.before_failure_1.json"));
  // The reference: step 4's checkpoint, resumed under the 3-device plan.
  const std::string ref = dir_ + "/reference";
  std::filesystem::create_directories(ref + "/checkpoints");
  std::filesystem::copy(dir_ + "/run/checkpoints/step_000004", ref + "/checkpoints/step_000004",
                        std::filesystem::copy_options::recursive);
  std::ofstream(ref + "/checkpoints/latest") << "step_000004\n";
  const Result again = run_h2(base + " --plan " + dir_ + "/run/plan.json --resume --set train.out_dir=" + ref);
  ASSERT_EQ(again.status, 0) << again.output;
  const auto last = [](const std::string& path) {
    const auto lines = metric_lines(path);
    return nlohmann::json::parse(lines[lines.size() - 2])["loss"].get<double>();
  };
  const double want = last(ref + "/metrics.jsonl");
  EXPECT_NEAR(last(dir_ + "/run/metrics.jsonl"), want, 1e-4 * want);
}

// A user's Ctrl-C on an --elastic job stops it (exit 130): it is no failed rank to take out and re-plan around, as it
// was — the driver re-planned on the devices left and went on.
TEST_F(ClusterTraining, ACtrlCStopsAnElasticJobInsteadOfReplanning) {
  const std::string log = dir_ + "/driver.log";
  const pid_t driver = ::fork();
  if (driver == 0) {
    ::setpgid(0, 0);  // its own group, for the test to end it with its ranks should it go on
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    const std::string line = "exec " + std::string(H2_BINARY) + " " + command() +
                             " --elastic --set train.steps=100000 --set train.checkpoint_every=100000";
    ::execl("/bin/sh", "sh", "-c", line.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  for (int i = 0; i < 1200 && metric_lines(dir_ + "/run/metrics.jsonl").size() < 2; ++i) {  // up to a minute
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::kill(driver, SIGINT);
  int status = 0;
  pid_t ended = 0;
  for (int i = 0; i < 1200 && ended == 0; ++i) {  // a minute; re-planned, it would train on
    ended = ::waitpid(driver, &status, WNOHANG);
    if (ended == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (ended == 0) {
    ::kill(-driver, SIGKILL);
    ::waitpid(driver, &status, 0);
  }
  const std::string output = read_file(log);
  ASSERT_NE(ended, 0) << "the job went on a minute after its Ctrl-C:\n" << output;
  ASSERT_TRUE(WIFEXITED(status)) << output;
  EXPECT_EQ(WEXITSTATUS(status), 130) << output;
  EXPECT_THAT(output, HasSubstr("h2 launch: stopped by signal 2 (Interrupt), passed on to every rank"));
  EXPECT_THAT(output, Not(HasSubstr("elastic:")));
}

// A training shard truncated in place during a cluster run (H2_FAULT_TRUNCATE: rank 0 does it before step 4) stops
// every rank at that step with an error naming the shard, after a checkpoint of the 3 steps done (it used to end in
// SIGBUS through the mapping, with no checkpoint).
TEST_F(ClusterTraining, AShardTruncatedUnderTheRanksStopsThemAfterACheckpoint) {
  const Result r = run_h2(command() + " --set train.checkpoint_every=0", "H2_FAULT_TRUNCATE=4");
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.output, HasSubstr("the shard changed while in use"));
  EXPECT_THAT(r.output, HasSubstr("train_000.bin"));
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/run/checkpoints/step_000003/state.json")) << r.output;
}

// A hand-written plan with tensor parallelism on one stage and data parallelism on the other (so activations
// are resharded between them) trains; its checkpoint resumes under the planner's own plan and ends where a run
// under that plan alone ends (the reference), since checkpoints and the data order do not depend on the plan.
// One stage of both chips, the fast one taking 3 of a micro-batch's 4 rows and the slow one 1: each rank runs on its
// own chip type, the loss is weighted by rows, and the run ends on the loss of the planner's own plan (the same
// data and seed); the memory report names each rank's chip.
TEST_F(ClusterTraining, AStageOfMixedChipTypesTakesUnevenRows) {
  const Result full = run_h2(command() + " --set train.out_dir=" + dir_ + "/full");
  ASSERT_EQ(full.status, 0) << full.output;
  nlohmann::json plan = nlohmann::json::parse(read_file(dir_ + "/full/plan.json"));
  plan["dp"] = 1;
  plan["micro_batch"] = 4;
  plan["num_micro_batches"] = 1;
  nlohmann::json stage = plan["stages"][0];
  stage.erase("ends_at_attention");  // the planner's stage may end inside a block; this one holds them all
  stage.update({{"chip", "fast"}, {"tp", 1}, {"dp", 2}, {"first_layer", 0}, {"layers", 4}, {"head", true}});
  stage["groups"] = nlohmann::json::parse(
      R"([{"chip": "fast", "replicas": 1, "rows": 3, "recompute": "none", "forward_s": 0.001, "backward_s": 0.002,
           "memory_bytes": 1e6, "capacity_bytes": 5e7},
          {"chip": "slow", "replicas": 1, "rows": 1, "recompute": "none", "forward_s": 0.001, "backward_s": 0.002,
           "memory_bytes": 1e6, "capacity_bytes": 1e9}])");
  plan["stages"] = nlohmann::json::array({stage});
  const std::string mixed_plan = dir_ + "/mixed_plan.json";
  std::ofstream(mixed_plan) << plan.dump(2);
  const Result mixed = run_h2(command() + " --plan " + mixed_plan + " --set train.out_dir=" + dir_ + "/mixed");
  ASSERT_EQ(mixed.status, 0) << mixed.output;
  EXPECT_THAT(mixed.output, HasSubstr("launching 2 ranks"));
  EXPECT_THAT(mixed.output, HasSubstr("rank  0 (stage 0, fast on emu)"));
  EXPECT_THAT(mixed.output, HasSubstr("rank  1 (stage 0, slow on emu)"));
  const auto loss = [](const std::vector<std::string>& lines) {  // the last training step's
    return nlohmann::json::parse(lines[lines.size() - 2])["loss"].get<double>();
  };
  const double want = loss(metric_lines(dir_ + "/full/metrics.jsonl"));
  EXPECT_NEAR(loss(metric_lines(dir_ + "/mixed/metrics.jsonl")), want, 1e-4 * want);
  // The fast chip's rank holds the activations of 3 rows, the slow one's of 1, as the memory formula says.
  const nlohmann::json memory = nlohmann::json::parse(read_file(dir_ + "/mixed/summary.json"))["memory"];
  ASSERT_EQ(memory.size(), 2u);
  const auto activations = [&](int r, const char* which) {
    return memory[static_cast<size_t>(r)]["terms"]["activations"][which].get<double>();
  };
  EXPECT_GT(activations(1, "measured"), 0);
  EXPECT_NEAR(activations(0, "measured"), 3 * activations(1, "measured"), 1e-9 * activations(0, "measured"));
  for (int r : {0, 1}) EXPECT_EQ(activations(r, "measured"), activations(r, "predicted")) << "rank " << r;
  // Each group recomputes as the plan says for it: the fast replica fully, the slow one not at all — every memory
  // term as the formula gives it for that group, the same last loss.
  plan["stages"][0]["groups"][0]["recompute"] = "full";
  std::ofstream(mixed_plan) << plan.dump(2);
  const Result recomputing =
      run_h2(command() + " --plan " + mixed_plan + " --set train.out_dir=" + dir_ + "/recomputing");
  ASSERT_EQ(recomputing.status, 0) << recomputing.output;
  EXPECT_NEAR(loss(metric_lines(dir_ + "/recomputing/metrics.jsonl")), want, 1e-4 * want);
  const nlohmann::json terms = nlohmann::json::parse(read_file(dir_ + "/recomputing/summary.json"))["memory"];
  for (int r : {0, 1}) {
    for (const auto& [name, term] : terms[static_cast<size_t>(r)]["terms"].items()) {
      EXPECT_EQ(term["measured"], term["predicted"]) << "rank " << r << " " << name;
    }
  }
  EXPECT_GT(terms[0]["terms"]["recompute"]["measured"].get<double>(), 0);
  EXPECT_EQ(terms[1]["terms"]["recompute"]["measured"].get<double>(), 0);
  // Shares that do not add up to the micro-batch are refused before any rank starts, naming the field.
  plan["stages"][0]["groups"][0]["rows"] = 2;
  std::ofstream(mixed_plan) << plan.dump(2);
  const Result bad = run_h2(command() + " --plan " + mixed_plan);
  EXPECT_NE(bad.status, 0);
  EXPECT_THAT(bad.output, HasSubstr("field 'stages[0].groups': their 2 replicas take 3 sequences; the stage has dp 2 "
                                    "and a micro-batch 4"));
  EXPECT_THAT(bad.output, Not(HasSubstr("launching")));
}

// Interleaved 1F1B end to end: two stages of two chunks each (virtual stages on fast, slow, fast, slow), costed by
// `h2 plan --layout`, train on two processes. Killed in step 5, the run resumes from step 4's checkpoint (a file
// per virtual stage) and ends on the loss of the planner's own 1F1B plan (the same data and seed); every rank's
// peak and memory terms are the plan's to the byte (a model per chunk, each with its own micro-batches in flight);
// the measured trace names the virtual stages.
TEST_F(ClusterTraining, AnInterleavedPlanTrainsAndResumes) {
  const Result full = run_h2(command() + " --set train.out_dir=" + dir_ + "/full");
  ASSERT_EQ(full.status, 0) << full.output;
  const std::string layout = dir_ + "/interleaved.yaml", plan = dir_ + "/interleaved.json";
  std::ofstream(layout) << "dp: 1\nmicro_batch: 1\nschedule: interleaved\nchunks: 2\nstages:\n"
                           "  - {chip: fast, tp: 1, layers: 2}\n  - {chip: slow, tp: 1, layers: 2}\n";
  const std::string setup = dir_ + "/f32.yaml";  // costed as this run trains: f32, H2's runtime's memory
  std::ofstream(setup) << read_file(train_) << "precision: f32\nh2_runtime: true\n";
  const Result p = run_h2("plan --cluster " + cluster_ + " --model " + model_ + " --train " + setup + " --layout " +
                          layout + " --out " + plan);
  ASSERT_EQ(p.status, 0) << p.output;
  const std::string run = command() + " --plan " + plan + " --set train.out_dir=" + dir_ + "/inter";
  const Result killed = run_h2(run, "H2_FAULT_KILL=1:5");
  EXPECT_NE(killed.status, 0);
  EXPECT_THAT(killed.output, HasSubstr("step     4/6"));
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/inter/checkpoints/step_000004/model.stage3.safetensors"));
  const Result resumed = run_h2(run + " --resume");
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_THAT(resumed.output, HasSubstr("resumed from"));
  const auto loss = [](const std::vector<std::string>& lines) {  // the last training step's
    return nlohmann::json::parse(lines[lines.size() - 2])["loss"].get<double>();
  };
  const double want = loss(metric_lines(dir_ + "/full/metrics.jsonl"));
  EXPECT_NEAR(loss(metric_lines(dir_ + "/inter/metrics.jsonl")), want, 1e-4 * want);
  const auto summary = nlohmann::json::parse(read_file(dir_ + "/inter/summary.json"));
  ASSERT_EQ(summary.at("memory").size(), 2u);
  for (const auto& m : summary.at("memory")) {
    EXPECT_EQ(m.at("peak_bytes").get<double>(), m.at("planned_bytes").get<double>()) << m.dump();
    for (const auto& [term, v] : m.at("terms").items()) {
      EXPECT_EQ(v.at("measured").get<double>(), v.at("predicted").get<double>()) << term;
    }
  }
  const std::string trace = read_file(dir_ + "/inter/trace_measured.json");
  EXPECT_THAT(trace, HasSubstr("\"2F0\""));
  EXPECT_THAT(trace, HasSubstr("\"3B0\""));
}

TEST_F(ClusterTraining, ATensorParallelPlanResumesUnderAnotherPlan) {
  const Result full = run_h2(command() + " --set train.out_dir=" + dir_ + "/full");
  ASSERT_EQ(full.status, 0) << full.output;
  nlohmann::json plan = nlohmann::json::parse(read_file(dir_ + "/full/plan.json"));
  ASSERT_EQ(plan["stages"].size(), 2u) << plan.dump(2);
  plan["num_micro_batches"] = 2;
  plan["micro_batch"] = 2;
  plan["stages"][0].update({{"chip", "fast"}, {"tp", 2}, {"dp", 1}, {"first_layer", 0}, {"layers", 1}});
  plan["stages"][1].update({{"chip", "slow"}, {"tp", 1}, {"dp", 2}, {"first_layer", 1}, {"layers", 3}});
  const std::string tp_plan = dir_ + "/tp_plan.json";
  std::ofstream(tp_plan) << plan.dump(2);
  // It runs on two chips of each type (the fixture's cluster has one: the plan is refused there).
  std::string two_each = read_file(cluster_);
  for (size_t at; (at = two_each.find("chips_per_node: 1")) != std::string::npos;)
    two_each.replace(at, 17, "chips_per_node: 2");
  const std::string wide = dir_ + "/two_each.yaml";
  std::ofstream(wide) << two_each;
  const Result refused = run_h2(command() + " --plan " + tp_plan);
  EXPECT_NE(refused.status, 0);
  EXPECT_THAT(refused.output,
              HasSubstr("tp_plan.json: the plan runs 2 ranks on fast devices; cluster two-chips has 1"));
  std::string on_wide = command();
  on_wide.replace(on_wide.find(cluster_), cluster_.size(), wide);
  // Stopped in step 5 (the learning-rate schedule is the 6-step run's): step 4's checkpoint is the latest.
  const Result tp = run_h2(on_wide + " --plan " + tp_plan, "H2_FAULT_KILL=3:5");
  EXPECT_NE(tp.status, 0);
  EXPECT_THAT(tp.output, HasSubstr("launching 4 ranks"));
  EXPECT_THAT(tp.output, HasSubstr("step     4/6"));
  const Result resumed = run_h2(command() + " --resume");
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_THAT(resumed.output, HasSubstr("resumed from"));
  const auto loss = [](const std::vector<std::string>& lines) {  // the last training step's
    return nlohmann::json::parse(lines[lines.size() - 2])["loss"].get<double>();
  };
  const double want = loss(metric_lines(dir_ + "/full/metrics.jsonl"));
  const double got = loss(metric_lines(dir_ + "/run/metrics.jsonl"));
  EXPECT_NEAR(got, want, 1e-4 * want);
  // `h2 sample` reads the checkpoint the tensor-parallel ranks wrote and continues a prompt as it does from the
  // same step of the other plan's run (a byte tokenizer keeps ids under the model's 64).
  testing_util::write_tiny_tokenizer(dir_);
  const auto sample = [&](const std::string& run) {
    return run_h2("sample --checkpoint " + dir_ + "/" + run + "/checkpoints/step_000004 --prompt 0 --tokens 6 " +
                  "--top-k 1 --encoder " + dir_ + "/encoder.json --vocab " + dir_ + "/vocab.bpe");
  };
  const Result from_tp = sample("run"), from_full = sample("full");
  ASSERT_EQ(from_tp.status, 0) << from_tp.output;
  EXPECT_EQ(from_tp.output, from_full.output);

  // A plan the runtime cannot run is refused before any rank starts, naming the stage.
  plan["stages"][0]["tp"] = 3;
  std::ofstream(tp_plan) << plan.dump(2);
  std::string on_many = command();  // enough devices, so that it is the TP degree that is refused
  on_many.replace(on_many.find(cluster_), cluster_.size(), wide);
  std::string many = two_each;
  for (size_t at; (at = many.find("nodes: 1,")) != std::string::npos;) many.replace(at, 9, "nodes: 2,");
  std::ofstream(wide) << many;
  const Result bad = run_h2(on_many + " --plan " + tp_plan);
  EXPECT_NE(bad.status, 0);
  EXPECT_THAT(bad.output, HasSubstr("stage 0 (fast): tp 3 does not divide the model's 2 heads"));
  EXPECT_THAT(bad.output, Not(HasSubstr("launching")));
}

}  // namespace
}  // namespace h2
