// `attn run`: one evaluation-mode forward pass of an attention layer on .npy inputs, with its
// parameters from a safetensors file (e.g. saved from PyTorch), writing the output as .npy.
#pragma once

namespace CLI {
class App;
}

namespace attn::cli {

// Adds the `run` subcommand to `app`; it runs from app.parse().
void add_run_command(CLI::App& app);

}  // namespace attn::cli
