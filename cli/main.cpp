// The attn command-line tool: sets up the subcommands and turns every error into a one-line
// message on stderr and exit code 1.
#include <CLI/CLI.hpp>

#include <exception>
#include <iostream>
#include <string>

#include "attn/core/error.hpp"
#include "bench_command.hpp"
#include "demo_command.hpp"
#include "generate_command.hpp"
#include "heatmap_command.hpp"
#include "run_command.hpp"
#include "seq2seq_commands.hpp"
#include "train_command.hpp"

namespace {

// CLI11's own errors (unknown option, missing value, ...) read like attn's, and point to the help
// of the subcommand that was being parsed.
std::string usage_failure(const CLI::App* app, const CLI::Error& error) {
  // Down to the innermost one, e.g. `attn train nadaraya-watson`.
  std::string command = "attn";
  for (auto selected = app->get_subcommands(); !selected.empty();
       selected = selected.front()->get_subcommands()) {
    command += " " + selected.front()->get_name();
  }
  return "attn: error: " + std::string(error.what()) + "\nRun '" + command +
         " --help' for more information.\n";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "attn: the attention mechanisms of \"Dive into Deep Learning\" (masked softmax, additive, "
      "dot-product and multi-head attention) on the CPU.\nExit status: 0 on success, 1 on any "
      "error.",
      "attn"};
  app.set_version_flag("--version", "attn " ATTN_VERSION, "Print the version and exit");
  app.require_subcommand(0, 1);
  app.option_defaults()->always_capture_default();
  app.failure_message(usage_failure);
  attn::cli::add_demo_command(app);
  attn::cli::add_run_command(app);
  attn::cli::add_heatmap_command(app);
  attn::cli::add_train_command(app);
  attn::cli::add_translate_command(app);
  attn::cli::add_bench_command(app);
  attn::cli::add_generate_command(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    // --help and --version end parsing with code 0; every usage error is reported as 1.
    return app.exit(error) == 0 ? 0 : 1;
  } catch (const attn::Error& error) {
    std::cerr << "attn: error: " << error.what() << '\n';
    return 1;
  } catch (const std::exception& error) {
    // Out of memory or a failing standard-library call: still a message, never a crash.
    std::cerr << "attn: error: " << error.what() << '\n';
    return 1;
  }
  if (app.get_subcommands().empty()) std::cout << app.help();
  return 0;
}
