// Processes forked after attn ran on several OpenMP threads: GNU OpenMP keeps a pool of threads
// per thread that starts parallel regions, and a fork copies only the forking thread, so the
// child's next region of more than one thread waited forever for the pool's threads.
#pragma once

namespace attn::core_detail {

// Records that a parallel region of `threads` threads starts on the calling thread. A process
// forked later from this thread runs OpenMP regions started on that thread (attn's, and any
// other) on one thread instead of hanging: a pthread_atfork child handler sets its count to 1.
void note_parallel_region(int threads);

}  // namespace attn::core_detail
