"""Reading a profile for hidden communication (lcab.trace_overlap) and the
CLI's --profile_dir, which writes one trace per case in either framework."""

import gzip
import json
import subprocess
import sys

import pytest

from lcab import results
from lcab.trace_overlap import find_traces, load_events, main, overlap


def test_the_committed_h100_ring_profile():
    """README and docs/context_parallel.md: the GPU tracks of jax.cp_ring at
    cp 2, 64k (4 x H100, 2026-11-26), two training steps each."""
    profile = "results/gpu/2026-11-26-h100x4-cp2/call1/profile"
    full = overlap(load_events(f"{profile}/jax.cp_ring_full_65536_cp2.gpu_trace.json.gz"))
    documents = overlap(load_events(
        f"{profile}/jax.cp_ring_causal_document_65536_cp2.gpu_trace.json.gz"))
    assert [round(o.hidden_fraction * 100) for o in full] == [29, 52]
    assert all(3e3 < o.communication_us < 13e3 and 2.7e6 < o.compute_us < 2.8e6 for o in full)
    # GPU 0's 39 ms include about 7 ms of copies placing the inputs.
    assert [round(o.communication_us / 1e3) for o in documents] == [39, 55]
    assert all(o.hidden_fraction < 0.07 for o in documents)


def jax_like(tmp_path):
    """Two GPUs in XLA's naming: GPU 0's 4 ms of transfer, 3 of them under
    compute; GPU 1's transfer alone."""
    events = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
        {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/device:GPU:1"}},
        {"ph": "M", "name": "process_name", "pid": 3, "args": {"name": "/host:CPU"}},
        {"ph": "X", "pid": 1, "ts": 0, "dur": 2000, "name": "fusion_attention"},
        {"ph": "X", "pid": 1, "ts": 1500, "dur": 2000, "name": "fusion_attention_2"},
        {"ph": "X", "pid": 1, "ts": 500, "dur": 4000, "name": "ncclDevKernel_SendRecv"},
        {"ph": "X", "pid": 2, "ts": 0, "dur": 1000, "name": "collective-permute-start"},
        {"ph": "X", "pid": 2, "ts": 2000, "dur": 1000, "name": "triton_kernel"},
        {"ph": "X", "pid": 3, "ts": 0, "dur": 9000, "name": "PjitFunction(ring)"},
    ]
    path = tmp_path / "plugins" / "profile" / "t" / "perfetto_trace.json.gz"
    path.parent.mkdir(parents=True)
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    (path.parent / "vm.trace.json.gz").write_bytes(path.read_bytes())  # TensorBoard's copy
    return path


def test_hidden_communication_is_the_overlap_of_the_unions(tmp_path):
    found = {o.device: o for o in overlap(load_events(jax_like(tmp_path)))}
    assert set(found) == {"GPU 0", "GPU 1"}  # the host is not a device
    gpu0 = found["GPU 0"]
    assert gpu0.compute_us == 3500 and gpu0.communication_us == 4000
    assert gpu0.hidden_us == 3000 and gpu0.hidden_fraction == pytest.approx(0.75)
    assert found["GPU 1"].hidden_us == 0 and found["GPU 1"].communication_us == 1000


def test_copies_between_gpus_are_communication_and_local_ones_neither():
    """The 2026-11-28 group-cast profile: GPU 0 placed the inputs on the
    other GPUs (MemcpyP2P), which is not compute."""
    events = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
        {"ph": "X", "pid": 1, "ts": 0, "dur": 1000, "name": "MemcpyP2P"},
        {"ph": "X", "pid": 1, "ts": 500, "dur": 1000, "name": "lcab_flex_forward_kernel"},
        {"ph": "X", "pid": 1, "ts": 2000, "dur": 700, "name": "MemcpyD2D"},
        {"ph": "X", "pid": 1, "ts": 3000, "dur": 100, "name": "Memset 3"},
    ]
    (gpu0,) = overlap(events)
    assert gpu0.compute_us == 1000 and gpu0.communication_us == 1000
    assert gpu0.hidden_us == 500


def test_torch_kernels_count_by_category(tmp_path):
    events = [
        {"ph": "X", "cat": "kernel", "pid": 0, "ts": 0, "dur": 10, "name": "flex_attention",
         "args": {"device": 0}},
        {"ph": "X", "cat": "kernel", "pid": 0, "ts": 5, "dur": 10,
         "name": "ncclDevKernel_AllGather_RING_LL", "args": {"device": 0}},
        {"ph": "X", "cat": "cpu_op", "pid": 7, "ts": 0, "dur": 100, "name": "aten::mm"},
    ]
    path = tmp_path / "rank0.trace.json"
    path.write_text(json.dumps(events))
    (only,) = overlap(load_events(path))
    assert (only.device, only.compute_us, only.communication_us, only.hidden_us) == (
        "GPU 0", 10, 10, 5)


def test_the_cli_finds_each_trace_once_and_prints_a_table(tmp_path, capsys):
    trace = jax_like(tmp_path)
    assert find_traces(tmp_path) == [trace]
    assert main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| GPU 0 | 3.50 | 4.00 | 3.00 | 75% |" in out
    assert main([str(tmp_path / "nothing")]) == 2


@pytest.mark.parametrize("framework, backend", [("jax", "jax.xla"), ("torch", "torch.sdpa_math")])
def test_profile_dir_writes_a_trace_per_case_and_keeps_the_rows(tmp_path, framework, backend):
    command = [sys.executable, "-m", "lcab.experiments", f"--framework={framework}",
               f"--backends={backend}", "--masks=causal", "--seqlens=256", "--heads=2:1",
               "--head_dim=16", "--dtype=float32", "--warmup=0", "--iters=2",
               f"--out={tmp_path}", f"--profile_dir={tmp_path / 'prof'}", "--noprogress",
               "--nosummary", "--git_commit=test"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = results.read_rows([tmp_path / f"kernel_{framework}.jsonl"])
    assert {r["direction"] for r in rows} == {"fwd", "bwd"}
    assert all(r["max_err"] is not None and r["max_err"] < 1e-4 for r in rows)
    (trace,) = find_traces(tmp_path / "prof" / f"{backend}_causal_256")
    assert load_events(trace)  # a CPU trace: host events, no device kernels


def test_the_breakdown_sums_each_kernel_per_gpu(tmp_path):
    from lcab.trace_overlap import breakdown_table, kernel_times

    events = load_events(jax_like(tmp_path))
    events.append({"ph": "X", "pid": 1, "ts": 9000, "dur": 500,
                   "name": "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"})
    times = kernel_times(events)
    assert times["GPU 0"]["ncclDevKernel_SendRecv"] == (4500.0, 2)  # one name, args cut
    assert times["GPU 1"] == {"collective-permute-start": (1000.0, 1),
                              "triton_kernel": (1000.0, 1)}
    text = breakdown_table(events, top=2)
    lines = text.splitlines()
    assert lines[0] == "| kernel | calls | GPU 0 ms | GPU 1 ms |"
    assert lines[2] == "| ncclDevKernel_SendRecv | 2 | 4.50 | 0.00 |"
    assert lines[3] == "| fusion_attention | 1 | 2.00 | 0.00 |"
    assert lines[4] == "| 3 others | | 2.00 | 2.00 |"
