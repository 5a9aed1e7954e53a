// `attn bench`: times attn's attention kernels (fused and plain paths, with and without masks)
// against the machine's FMA peak and oneDNN sgemm measured in the same run, as one table.
#pragma once

namespace CLI {
class App;
}

namespace attn::cli {

// Adds the `bench` subcommand to `app`; it runs from app.parse().
void add_bench_command(CLI::App& app);

}  // namespace attn::cli
