// `h2 check ops` — the cross-backend conformance matrix — and `h2 devices`.
#include <algorithm>
#include <cstdio>
#include <optional>
#include <sstream>

#include "cli/commands.h"
#include "core/config.h"
#include "core/error.h"
#include "device/registry.h"
#include "model/align.h"
#include "ops/conformance.h"

namespace h2::cli {
namespace {

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// The emu profile named by --chips/--chip, or none (the registry's default).
std::optional<EmuProfile> chosen_profile(const std::string& chips_file, const std::string& chip) {
  if (chips_file.empty()) {
    if (!chip.empty()) throw Error(ErrorCode::kInvalidArgument, "--chip needs --chips FILE to say where it is defined");
    return std::nullopt;
  }
  const auto profiles = load_emu_profiles(ConfigNode::load_file(chips_file));
  return chip.empty() ? profiles.front() : find_emu_profile(profiles, chip, chips_file);
}

}  // namespace

void register_check(CLI::App& app, Command& selected) {
  CLI::App* check = app.add_subcommand("check", "Self-checks of this build");
  check->require_subcommand(1);
  CLI::App* ops = check->add_subcommand(
      "ops", "Run every op of each backend against the ref backend and print the op x backend matrix");
  struct Options {
    std::string backends = "cpu,emu";
    uint64_t seed = 1234;
    std::string chips_file;
    std::string chip;
  };
  auto options = std::make_shared<Options>();
  ops->add_option("--backend", options->backends, "comma-separated backends to check")->capture_default_str();
  ops->add_option("--seed", options->seed, "seed of the random inputs")->capture_default_str();
  ops->add_option("--chips", options->chips_file, "chip-profile YAML for the emu backend (see examples/)");
  ops->add_option("--chip", options->chip, "which chip of --chips to emulate (default: the first)");
  ops->callback([options, &selected] {
    selected = [options] {
      const std::vector<ConformanceColumn> columns =
          check_backends(split_list(options->backends), chosen_profile(options->chips_file, options->chip),
                         ConformanceOptions{.seed = options->seed},
                         [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); });
      bool passed = true;
      for (const ConformanceColumn& c : columns) passed = passed && all_passed(c.results);
      std::fputs(format_conformance_matrix(columns).c_str(), stdout);
      std::printf("%s: values are the worst normalised error ||out - ref|| / ||ref|| over each op's cases\n",
                  passed ? "PASS" : "FAIL");
      return passed ? 0 : 1;
    };
  });
}

// A device named on the command line: cpu, ref, or emu:CHIP (CHIP from --chips).
std::unique_ptr<Device> device_named(const std::string& spec, const std::string& chips_file) {
  if (spec.starts_with("emu:")) {
    if (chips_file.empty()) throw Error(ErrorCode::kInvalidArgument, cat(spec, ": emu:CHIP needs --chips FILE"));
    return create_device(DeviceSpec{.backend = "emu", .emu = chosen_profile(chips_file, spec.substr(4))});
  }
  return create_device(DeviceSpec{.backend = spec});
}

void register_align(CLI::App& app, Command& selected) {
  CLI::App* align = app.add_subcommand(
      "align", "Run one batch through the same weights on two devices and name the first operator where they part");
  struct Options {
    std::string a = "cpu", b = "ref", chips_file, config = "examples/train_moby.yaml", precision = "f32";
    int batch = 2, seq = 0;
    uint64_t seed = 1;
  };
  auto o = std::make_shared<Options>();
  align->add_option("--a", o->a, "the device to check: cpu, ref or emu:CHIP")->capture_default_str();
  align->add_option("--b", o->b, "the device it is checked against")->capture_default_str();
  align->add_option("--chips", o->chips_file, "chip-profile YAML for emu:CHIP (examples/emu_chips.yaml)");
  align->add_option("--config", o->config, "a training config: its model is used")->capture_default_str();
  align->add_option("--batch", o->batch, "sequences")->check(CLI::Range(1, 64))->capture_default_str();
  align->add_option("--seq", o->seq, "tokens per sequence (default: the model's seq_len, at most 32)")
      ->check(CLI::Range(0, 4096))
      ->capture_default_str();
  align->add_option("--seed", o->seed, "seed of the weights and tokens")->capture_default_str();
  align->add_option("--precision", o->precision, "the precision both run in, as training would (bf16 or f32)")
      ->check(CLI::IsMember({"bf16", "f32"}))
      ->capture_default_str();
  align->callback([o, &selected] {
    selected = [o] {
      auto a = device_named(o->a, o->chips_file), b = device_named(o->b, o->chips_file);
      const GptConfig config = GptConfig::from_config(ConfigNode::load_file(o->config).at("model"));
      const int seq = o->seq > 0 ? o->seq : std::min(32, config.seq_len);
      if (seq > config.seq_len) {
        throw Error(ErrorCode::kInvalidArgument, cat("--seq ", seq, " exceeds the model's seq_len ", config.seq_len));
      }
      const AlignReport report = align_devices(config, *a, *b, o->batch, seq, o->seed, *parse_precision(o->precision));
      std::fputs(format_alignment(report, o->a, o->b).c_str(), stdout);
      return report.first_divergence < 0 ? 0 : 1;
    };
  });
}

void register_devices(CLI::App& app, Command& selected) {
  CLI::App* devices = app.add_subcommand("devices", "List the built backends and, with --chips, the chip profiles");
  auto chips_file = std::make_shared<std::string>();
  devices->add_option("--chips", *chips_file, "chip-profile YAML to list");
  devices->callback([chips_file, &selected] {
    selected = [chips_file] {
      std::printf("backends:\n");
      for (const BackendInfo& b : backends()) std::printf("  %-4s %s\n", b.name, b.description);
      for (const std::string& line : hardware_lines()) std::printf("  %s\n", line.c_str());
      if (!chips_file->empty()) {
        std::printf("chips in %s:\n  %-16s %8s %12s %14s\n", chips_file->c_str(), "name", "speed", "memory",
                    "copy GB/s");
        for (const EmuProfile& p : load_emu_profiles(ConfigNode::load_file(*chips_file))) {
          std::printf("  %-16s %8.3f %12s %14.1f\n", p.chip.c_str(), p.speed,
                      format_bytes(p.mem_capacity_bytes).c_str(), p.mem_bandwidth_gbps);
        }
      }
      return 0;
    };
  });
}

}  // namespace h2::cli
