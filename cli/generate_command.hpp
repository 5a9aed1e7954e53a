// `attn generate`: a toy decoder with random weights run token by token over a KV cache per layer,
// timing prefill and decoding for each cache dtype.
#pragma once

namespace CLI {
class App;
}

namespace attn::cli {

// Adds the `generate` subcommand to `app`; it runs from app.parse().
void add_generate_command(CLI::App& app);

}  // namespace attn::cli
