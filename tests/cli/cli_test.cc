// The `h2` executable end to end: exit status and messages on good and bad input.
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "test_util.h"

namespace h2 {
namespace {

using ::testing::HasSubstr;

struct Result {
  int status;
  std::string output;  // stdout and stderr together
};

Result run_h2(const std::string& args) {
  const std::string command = std::string(H2_BINARY) + " " + args + " 2>&1";
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
  const std::string path = ::testing::TempDir() + name;
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
}

TEST(Cli, DevicesListsBackendsAndChips) {
  const Result r = run_h2(std::string("devices --chips ") + H2_SOURCE_DIR + "/examples/emu_chips.yaml");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("slow-big"));
  EXPECT_THAT(r.output, HasSubstr("emu "));
}

}  // namespace
}  // namespace h2
