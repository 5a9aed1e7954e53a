// Processes forked after attn ran on several OpenMP threads: GNU OpenMP keeps a pool of threads
// per thread that starts parallel regions, and a fork copies only the forking thread, so the
// child's next region of more than one thread waited forever for the pool's threads.
#pragma once

namespace attn::core_detail {

// Records that a parallel region of `threads` threads starts on the calling thread. Before a fork
// a pthread_atfork handler releases the forking thread's OpenMP pool (omp_pause_resource_all), so
// the child starts its own threads; where that fails (a fork inside a parallel region), a child
// forked from a thread that ran such regions runs them on one thread instead of hanging.
void note_parallel_region(int threads);

}  // namespace attn::core_detail
