// `attn train`: the training examples, one subcommand each (`attn train nadaraya-watson`, ...).
#pragma once

namespace CLI {
class App;
}

namespace attn::cli {

// Adds `train` to `app` with every training example under it; they run from app.parse().
void add_train_command(CLI::App& app);

// Adds `nadaraya-watson` to the `train` subcommand: the book's kernel regression, trained and
// plotted.
void add_train_nadaraya_watson_command(CLI::App& train);

}  // namespace attn::cli
