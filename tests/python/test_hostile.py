# The Python module under hostile use (docs/reliability.md): files that crashed or hung the
# interpreter (JSON nested without end, a FIFO), foreign exceptions, thread counts that made OpenMP
# kill the process, metadata that attn.load must not evaluate, writes that fail midway, and finite
# inputs near float's maximum.
import os
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import attn


def safetensors_bytes(header, data=b""):
    text = header.encode() if isinstance(header, str) else header
    return struct.pack("<Q", len(text)) + text + data


def run_python(code, timeout=60):
    """Runs `code` in a fresh interpreter (a crash or a hang there does not take pytest down)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, timeout=timeout,
    )


@pytest.mark.parametrize("where", ["metadata", "shape"])
def test_deep_json_in_a_header_is_a_file_error_not_a_crash(tmp_path, where):
    deep = "[" * 300_000 + "]" * 300_000
    header = (
        '{"__metadata__":' + deep + "}"
        if where == "metadata"
        else '{"w":{"dtype":"F32","shape":' + deep + ',"data_offsets":[0,0]}}'
    )
    path = tmp_path / "deep.safetensors"
    path.write_bytes(safetensors_bytes(header))
    with pytest.raises(attn.FileError, match="deep.safetensors: header nests arrays and objects"):
        attn.load_safetensors(path)
    with pytest.raises(attn.FileError, match="nests arrays and objects deeper than 64"):
        attn.load(path)


def test_numbers_beyond_double_are_file_errors_naming_the_file(tmp_path):
    path = tmp_path / "big.safetensors"
    path.write_bytes(safetensors_bytes('{"w":{"dtype":"F32","shape":[1e999],"data_offsets":[0,4]}}',
                                       b"\0" * 4))
    with pytest.raises(attn.FileError, match="big.safetensors: header is not valid JSON") as error:
        attn.load_safetensors(path)
    assert isinstance(error.value, OSError) and "json.exception" not in str(error.value)


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "layer.safetensors"
    os.mkfifo(fifo)
    result = run_python(
        f"""
        import attn
        for call in (attn.load, attn.load_safetensors):
            try:
                call({str(fifo)!r})
            except attn.FileError as error:
                print(error)
        """,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("expected a regular file, got a FIFO") == 2, result.stdout


@pytest.mark.parametrize("threads", [0, -1, 1025, 1_000_000])
def test_thread_counts_outside_one_to_1024_are_value_errors(threads):
    before = attn.get_num_threads()
    with pytest.raises(ValueError, match=r"n: expected a thread count in \[1, 1024\]"):
        attn.set_num_threads(threads)
    assert attn.get_num_threads() == before


def test_a_huge_omp_num_threads_is_capped():
    env_result = subprocess.run(
        [sys.executable, "-c", "import attn; print(attn.get_num_threads())"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "OMP_NUM_THREADS": "100000"},
    )
    assert env_result.returncode == 0, env_result.stderr
    assert int(env_result.stdout) == 1024


def saved_layer(tmp_path, metadata):
    layer = attn.MultiHeadAttention(2, 2, 2, 4, 2, 0.0)
    path = tmp_path / "layer.safetensors"
    attn.save_safetensors(path, layer.state_dict(), metadata)
    return path


@pytest.mark.parametrize(
    "value",
    ["(" * 100_000 + ")" * 100_000, "__import__('os').getcwd()", "[2]", "9" * 100],
)
def test_load_never_evaluates_metadata(tmp_path, value):
    path = saved_layer(tmp_path, {"layer": "MultiHeadAttention", "key_size": value})
    with pytest.raises(attn.FileError, match="metadata 'key_size': expected a number"):
        attn.load(path)


def test_metadata_that_builds_no_layer_is_a_file_error(tmp_path):
    path = saved_layer(tmp_path, {"layer": "MultiHeadAttention", "colour": "3"})
    with pytest.raises(attn.FileError, match="metadata does not build a MultiHeadAttention"):
        attn.load(path)


def test_a_write_that_fails_midway_keeps_the_old_file(tmp_path):
    path = tmp_path / "t.safetensors"
    attn.save_safetensors(path, {"w": np.ones(2, dtype=np.float32)})
    before = path.read_bytes()
    result = run_python(
        f"""
        import resource, signal
        import numpy as np
        import attn
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))
        try:
            attn.save_safetensors({str(path)!r}, {{"w": np.ones(1 << 18, dtype=np.float32)}})
        except attn.FileError as error:
            print(error)
        """
    )
    assert result.returncode == 0, result.stderr
    assert "cannot write the file (File too large)" in result.stdout
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.safetensors"]


@pytest.mark.parametrize(
    "make",
    [
        lambda: attn.MultiHeadAttention(2**62, 2, 2, 2, 1),
        lambda: attn.AdditiveAttention(2**31, 2**31, 2**31),
        lambda: attn.GeneralAttention(2**62, 2),
    ],
    ids=["multi-head", "additive", "general"],
)
def test_layer_sizes_past_any_address_space_are_shape_errors(make):
    """A weight's element count wrapped around int64 before and std::vector refused a negative
    size with its own message ("vector::_M_default_append")."""
    with pytest.raises(attn.ShapeError, match="shape: expected at most 2305843009213693951 elem"):
        make()


def test_values_near_float_max_give_finite_outputs():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 2, 5, 8)).astype(np.float32)
    k = rng.standard_normal((1, 2, 64, 8)).astype(np.float32)
    v = (rng.uniform(-1, 1, (1, 2, 64, 4)) * 3e38).astype(np.float32)
    out = attn.scaled_dot_product_attention(q, k, v)
    assert np.isfinite(out).all()
    scores = (q.astype(np.float64) @ k.astype(np.float64).transpose(0, 1, 3, 2)) / np.sqrt(8)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    expected = weights @ v.astype(np.float64)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())


FORK_AFTER_THREADS = r"""
import os, threading
import numpy as np
import attn

q = np.random.default_rng(0).random((4, 8, 256, 64), dtype=np.float32)
attn.set_num_threads(1)  # no pool for the main thread yet
expected = attn.scaled_dot_product_attention(q, q, q)
attn.set_num_threads(2)

def child(label):
    pid = os.fork()
    if pid == 0:
        try:
            threads = attn.get_num_threads()
            out = attn.scaled_dot_product_attention(q, q, q)
            same = bool(np.allclose(out, expected, rtol=1e-5, atol=1e-6))
            try:
                attn.set_num_threads(2)
                refused = "accepted"
            except ValueError as error:
                refused = str(error)
            print(label, threads, same, refused, flush=True)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)

# attn ran on 2 threads in another thread only: the forking thread has no pool to lose.
worker = threading.Thread(target=lambda: attn.scaled_dot_product_attention(q, q, q))
worker.start()
worker.join()
child("other thread")
# attn ran on 2 threads in the forking thread: GNU OpenMP would hang in the child.
attn.scaled_dot_product_attention(q, q, q)
child("this thread")
# PyTorch's parallel work on the forking thread (it shares GNU OpenMP with attn): its pool hung
# attn's first parallel region in the child, a DataLoader worker's included.
import torch
torch.set_num_threads(2)
(torch.randn(2000, 2000) @ torch.randn(2000, 2000)).sum()
child("after torch")
"""


def test_a_process_forked_after_threads_runs_attn_on_its_threads_instead_of_hanging():
    # GNU OpenMP keeps one pool of threads per thread that starts parallel regions, and a fork
    # copies the forking thread alone: an attn call on several threads in a child forked after one
    # in the parent waited forever, and so did one after PyTorch's parallel work (a DataLoader
    # worker timed out). attn releases the forking thread's pool before the fork: every child
    # keeps its count and computes the same. Run with a timeout: a regression is a hang.
    result = run_python(FORK_AFTER_THREADS, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines == [
        "other thread 2 True accepted", "this thread 2 True accepted", "after torch 2 True accepted"
    ], lines


GRAPH_ALIVE_AT_EXIT = """
import torch
import attn.torch
layer = attn.torch.MultiHeadAttention(4, 4, 4, 4, 2)
x = torch.randn(2, 3, 4)
output = layer(x, x, x)  # its graph, and the graph's attn layer, live until the interpreter exits
print(output.shape)
"""


def test_an_autograd_graph_alive_at_exit_ends_the_script_without_leak_warnings():
    # nanobind reports objects alive at exit as leaks; a PyTorch script whose last attn.torch
    # output kept its graph ended with "nanobind: leaked 1 instances!". They are off by default
    # and ATTN_LEAK_WARNINGS turns them on (the control: the same script reports that layer).
    pytest.importorskip("torch", reason="PyTorch is not installed: the script needs it")
    environment = {k: v for k, v in os.environ.items() if k != "ATTN_LEAK_WARNINGS"}
    plain = subprocess.run([sys.executable, "-c", GRAPH_ALIVE_AT_EXIT], capture_output=True,
                           text=True, timeout=120, env=environment)
    assert plain.returncode == 0 and plain.stdout == "torch.Size([2, 3, 4])\n", plain.stderr
    assert "leaked" not in plain.stderr, plain.stderr
    warned = subprocess.run([sys.executable, "-c", GRAPH_ALIVE_AT_EXIT], capture_output=True,
                            text=True, timeout=120, env=environment | {"ATTN_LEAK_WARNINGS": "1"})
    assert "leaked 1 instances" in warned.stderr, warned.stderr


BINDINGS_AT_WORK = r"""
import numpy as np
import attn
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((2, 5, 8), dtype=np.float32) for _ in range(3))
for layer in (attn.AdditiveAttention(8, 8, 6, 0.1), attn.DotProductAttention(0.1),
              attn.MultiHeadAttention(8, 8, 8, 8, 2, 0.1, True), attn.GeneralAttention(8, 8),
              attn.GaussianKernelPooling()):
    out = layer(q, k, v, np.array([2, 5]))
    layer.backward(np.ones_like(out))
    layer.grads(), layer.attention_weights, layer.dropout_mask, layer.state_dict()
    try:
        layer(q[0], k, v)
    except ValueError:
        pass
x = rng.standard_normal((2, 4, 16, 8), dtype=np.float32)
attn.scaled_dot_product_attention(x, x, x, is_causal=True)
cache = attn.KVCache(2, 4, 8, 32)
cache.append(x, x)
attn.scaled_dot_product_attention(np.ascontiguousarray(x[:, :, -1:]), cache, None)
attn.masked_softmax(rng.standard_normal((2, 3, 4), dtype=np.float32), np.array([1, 4]))
"""


def test_the_bindings_leave_nothing_alive_at_exit():
    # With nanobind's leak warnings on, a script using every kind of object and call of the
    # bindings (layers forward and backward, errors, functions, a KV cache) reports no leak.
    environment = dict(os.environ, ATTN_LEAK_WARNINGS="1")
    result = subprocess.run([sys.executable, "-c", BINDINGS_AT_WORK], capture_output=True,
                            text=True, timeout=120, env=environment)
    assert result.returncode == 0, result.stderr
    assert "leaked" not in result.stderr, result.stderr
