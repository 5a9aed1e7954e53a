// `attn run`: one evaluation-mode attention call on .npy inputs — the functional API, or a layer
// with its parameters from a safetensors file (e.g. saved from PyTorch) — writing .npy output.
#pragma once

namespace CLI {
class App;
}

namespace attn::cli {

// Adds the `run` subcommand to `app`; it runs from app.parse().
void add_run_command(CLI::App& app);

}  // namespace attn::cli
