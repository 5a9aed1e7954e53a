// `attn train seq2seq` (train the Bahdanau encoder–decoder on the bundled date task or a
// tab-separated corpus) and `attn translate` (greedy decoding with a saved model).
#pragma once

namespace CLI {
class App;
}

namespace attn::cli {

// Adds the `seq2seq` subcommand to the `train` subcommand; it runs from app.parse().
void add_train_seq2seq_command(CLI::App& train);
// Adds the `translate` subcommand to `app`.
void add_translate_command(CLI::App& app);

}  // namespace attn::cli
