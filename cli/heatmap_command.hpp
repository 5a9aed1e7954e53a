// `attn heatmap`: draws attention weights stored in a .npy file as a grid of heatmaps, like the
// book's show_heatmaps.
#pragma once

namespace CLI {
class App;
}

namespace attn::cli {

// Adds the `heatmap` subcommand to `app`; it runs from app.parse().
void add_heatmap_command(CLI::App& app);

}  // namespace attn::cli
