// `h2 launch -n N -- CMD ...`: N local ranks of one job.
#include "cli/commands.h"
#include "comm/launch.h"

namespace h2::cli {

void register_launch(CLI::App& app, Command& selected) {
  CLI::App* l = app.add_subcommand("launch", "Start N local ranks of a command with the rendezvous variables set");
  auto options = std::make_shared<LaunchOptions>();
  auto command = std::make_shared<std::vector<std::string>>();
  l->add_option("-n,--ranks", options->ranks, "number of ranks")->required()->check(kPositive);
  l->add_option("--master-addr", options->master_addr, "address rank 0's rendezvous store binds")
      ->capture_default_str();
  l->add_option("--master-port", options->master_port, "its port (0: a free one)")->capture_default_str();
  l->add_option("--grace", options->grace_seconds, "seconds the other ranks get to exit after a failure")
      ->capture_default_str();
  l->add_option("command", *command, "the command each rank runs (after --)")->required();
  l->callback([options, command, &selected] {
    selected = [options, command] { return launch(*command, *options).exit_code; };
  });
}

}  // namespace h2::cli
