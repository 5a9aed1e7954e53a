// `attn demo`: the attention examples of "Dive into Deep Learning", printed as PyTorch prints them,
// with a heatmap of each layer's attention weights.
#pragma once

namespace CLI {
class App;
}

namespace attn::cli {

// Adds the `demo` subcommand to `app`; it runs from app.parse().
void add_demo_command(CLI::App& app);

}  // namespace attn::cli
