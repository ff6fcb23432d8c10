"""Which rows the CP model is calibrated on (lcab.model.calibration): the
newest canonical runs by default, from any working directory, said in its
output; a clean one-line stop when there are none."""

import os
import pathlib
import subprocess
import sys

import pytest

from lcab import canonical, results
from lcab.comm import COMM_OPS, bus_factor
from lcab.flops import attention_flops
from lcab.masks import make_mask
from lcab.model import calibration

ROOT = pathlib.Path(__file__).resolve().parent.parent
KERNEL = "jax.pallas_flex"  # the model's default --kernel


def write_run(root, date, device, sweep, *, commit, speed=400.0, backend=KERNEL,
              directions=("fwd", "bwd"), comm=True, cp=True, seqlens=(4096, 16384, 65536),
              links_gbps=(("jax", 200.0),)):
    """A canonical run's folder of made-up rows: single-GPU kernel rows of
    `backend` (`speed` TFLOP/s forward, half that backward) at `seqlens`,
    and for the cp sweep comm rows over 4 ranks (per framework, its bus
    bandwidth in `links_gbps`) and one ring row at cp 2."""
    folder = root / canonical.folder_name(date, device, sweep)
    gpu = f"NVIDIA {device.split('x')[0].upper()}"
    common = {"batch": 1, "heads_q": 64, "heads_kv": 8, "head_dim": 128, "dtype": "bfloat16",
              "status": "OK", "device": gpu, "git_commit": commit,
              "timestamp": f"{date}T12:00:00+00:00", "options": {}, "mask_params": {"seed": 0}}
    kernel = results.Writer(folder / "single" / "kernel_jax.jsonl")
    for seqlen in seqlens:
        for mask in ("full", "causal"):
            area = make_mask(mask, seqlen).area()
            for direction in directions:
                kernel.write(results.make_row(
                    framework="jax", backend=backend, suite="kernel", mask=mask, seqlen=seqlen,
                    seqlen_k=seqlen, direction=direction, cp_size=1,
                    workload_key=f"{mask}-{seqlen}", density=area / seqlen**2, mask_area=area,
                    tflops=speed if direction == "fwd" else speed / 2,
                    flops=attention_flops(area, batch=1, heads_q=64, head_dim=128,
                                          direction=direction), **common))
    if sweep != "cp":
        return folder
    for framework, gbps in links_gbps if comm else ():
        links = results.Writer(folder / "comm" / f"comm_{framework}.jsonl")
        for op in COMM_OPS:
            for nbytes in (1 << 20, 1 << 24, 1 << 28):
                ms = (25e-6 + nbytes * bus_factor(op, 4) / (gbps * 1e9)) * 1e3
                links.write(results.make_comm_row(
                    framework=framework, op=op, bytes=nbytes, ranks=4, status="OK",
                    median_ms=ms, busbw_gbps=nbytes * bus_factor(op, 4) / ms / 1e6, device=gpu,
                    git_commit=commit, timestamp=common["timestamp"]))
    if cp:
        area = make_mask("full", 32768).area()
        results.Writer(folder / "cp2" / "cp_jax.jsonl").write(results.make_row(
            framework="jax", backend="jax.cp_ring", suite="cp", strategy="ring", inner=KERNEL,
            mask="full", seqlen=32768, seqlen_k=32768, direction="fwd", cp_size=2,
            workload_key="full-32768", density=1.0, mask_area=area, tflops=speed * 0.9,
            flops=attention_flops(area, batch=1, heads_q=64, head_dim=128, direction="fwd"),
            notes="dispatch=balanced", **common))
    return folder


def curve(root, **kwargs):
    return calibration.kernel_curve(KERNEL, head_dim=128, dtype="bfloat16",
                                    directions=("fwd", "bwd"), root=root, **kwargs)


def test_the_newest_cp_run_calibrates_the_curve_and_the_links(tmp_path):
    root = tmp_path / "results"
    write_run(root, "2026-11-28", "h100x4", "cp", commit="old1234", speed=300.0)
    newest = write_run(root, "2026-11-29", "h100x4", "cp", commit="new5678", speed=450.0)
    found, source = curve(root)
    assert source.paths == (newest,)
    assert found.tflops(1e15, 1.0, "fwd") == pytest.approx(450.0)
    assert found.tflops(1e15, 1.0, "bwd") == pytest.approx(225.0)
    text = source.describe()
    for told in ("2026-11-29-h100x4-cp", "canonical cp run, 2026-11-29, h100x4", "commit new5678",
                 "jax.pallas_flex with its default options on NVIDIA H100", "12 rows",
                 "fwd 6, bwd 6", "measured 2026-11-29"):
        assert told in text, text
    assert "old1234" not in text
    network, links = calibration.links(framework="jax", gpus_per_node=8, root=root)
    assert links.paths == (newest,) and "fitted to 3 rows at 4 ranks" in links.describe()
    assert network.intra["ppermute"].beta_bytes_per_s == pytest.approx(200e9, rel=1e-6)


def test_the_cards_blog_and_cp_runs_join_in_the_curve(tmp_path):
    """The blog run's short lengths and the cp run's single-GPU long ones
    make one curve: small calls read the blog's speed, large the cp run's."""
    root = tmp_path / "results"
    cp_run = write_run(root, "2026-11-29", "h100x4", "cp", commit="cp00001", speed=300.0,
                       seqlens=(16384, 65536))
    blog = write_run(root, "2026-11-28", "h100", "blog", commit="blog001", speed=500.0,
                     seqlens=(1024, 2048))
    found, source = curve(root)
    assert source.paths == (blog, cp_run) and found.lengths == (1024, 2048, 16384, 65536)
    assert found.tflops(1e9, 1.0, "fwd") == pytest.approx(500.0)
    assert found.tflops(1e18, 1.0, "fwd") == pytest.approx(300.0)
    assert "commits blog001, cp00001" in source.describe()
    # A newer blog run without the kernel gives nothing and is not named; one
    # without a direction asked for gives the directions it has.
    write_run(root, "2026-11-30", "h100", "blog", commit="blog002", backend="jax.other")
    found, source = curve(root)
    assert source.paths == (cp_run,) and found.lengths == (16384, 65536)
    write_run(root, "2026-12-01", "h100", "blog", commit="blog003", directions=("fwd",),
              seqlens=(1024,))
    found, source = curve(root)
    assert source.paths == (root / "2026-12-01-h100-blog", cp_run)
    assert found.counts() == {"fwd": 6, "bwd": 4}


def test_the_curve_comes_from_the_cp_runs_card(tmp_path):
    """A newer blog run on another card than the cp run (which gives the
    links and the validation) is passed over: one model, one card; naming
    the card takes it."""
    root = tmp_path / "results"
    cp_run = write_run(root, "2026-11-28", "h100x4", "cp", commit="cp00001", speed=300.0)
    blog = write_run(root, "2026-11-29", "h200", "blog", commit="blog001", speed=500.0)
    assert calibration.cp_card(root) == "NVIDIA H100"
    found, source = curve(root)
    assert source.paths == (cp_run,) and found.device == "NVIDIA H100"
    assert found.tflops(1e15, 1.0, "fwd") == pytest.approx(300.0)
    found, source = curve(root, device="NVIDIA H200")
    assert source.paths == (blog,) and found.tflops(1e15, 1.0, "fwd") == pytest.approx(500.0)
    assert calibration.cp_card(tmp_path / "empty") is None


def test_rows_that_lack_the_kernel_name_what_they_lack(tmp_path):
    write_run(tmp_path, "2026-11-29", "h100x4", "cp", commit="c", directions=("fwd",))
    with pytest.raises(calibration.CalibrationError, match="has no bwd rows of jax.pallas_flex"):
        curve(tmp_path)
    with pytest.raises(calibration.CalibrationError, match="no results at"):
        curve(tmp_path, paths=[tmp_path / "nowhere"])


def test_without_a_canonical_run_the_model_says_so(tmp_path, monkeypatch):
    with pytest.raises(calibration.NoCanonicalRun, match="no canonical blog or cp run under"):
        curve(tmp_path)
    with pytest.raises(calibration.NoCanonicalRun, match="no canonical cp run"):
        calibration.links(framework="jax", gpus_per_node=8, root=tmp_path)
    # The default root is lcab.canonical.RESULTS, read at the call.
    write_run(tmp_path, "2026-11-29", "h100x4", "cp", commit="c")
    monkeypatch.setattr(canonical, "RESULTS", tmp_path)
    assert curve(None)[1].paths == (tmp_path / "2026-11-29-h100x4-cp",)


def test_the_links_fit_only_the_modelled_frameworks_collectives(tmp_path):
    # The cp sweep times both frameworks' collectives; each fit takes its own.
    write_run(tmp_path, "2026-11-29", "h100x4", "cp", commit="c",
              links_gbps=(("jax", 200.0), ("torch", 100.0)))
    for framework, other, gbps in (("jax", "torch", 200e9), ("torch", "jax", 100e9)):
        network, links = calibration.links(framework=framework, gpus_per_node=8, root=tmp_path)
        for op in COMM_OPS:
            assert network.intra[op].beta_bytes_per_s == pytest.approx(gbps, rel=1e-6)
        assert {row["framework"] for row in links.rows} == {framework}
        assert links.describe().startswith(
            f"links inside a node: {framework}'s collectives only (9 {other} comm rows left "
            "out): ppermute 25.0 us")


def test_a_measurement_rerun_counts_once_per_device(tmp_path):
    """calibration.read keeps the newest row of each comm measurement (its
    collective, size, rank count and device; lcab.results.newest_rows)."""
    path = tmp_path / "comm_jax.jsonl"
    writer = results.Writer(path)
    for device, stamp, ms in (("NVIDIA H100", "2026-11-29T12:00:00+00:00", 1.0),
                              # later as text, earlier as an instant: the older row
                              ("NVIDIA H100", "2026-11-29T13:30:00+02:00", 2.0),
                              ("NVIDIA H200", "2026-11-29T11:00:00Z", 3.0)):
        writer.write(results.make_comm_row(
            framework="jax", op="ppermute", bytes=1 << 20, ranks=4, status="OK", median_ms=ms,
            busbw_gbps=1.0, device=device, git_commit="c", timestamp=stamp))
    kept = {row["device"]: row["median_ms"] for row in calibration.read([path])}
    assert kept == {"NVIDIA H100": 1.0, "NVIDIA H200": 3.0}


def test_a_cp_run_without_comm_rows_says_the_links_are_constants(tmp_path):
    write_run(tmp_path, "2026-11-29", "h100x4", "cp", commit="c", comm=False)
    _, links = calibration.links(framework="jax", gpus_per_node=8, root=tmp_path)
    assert links.describe().count("no jax comm rows: lcab.model.network.NVLINK_H100") == 3


def model_cli(*args, cwd, timeout=300):
    return subprocess.run([sys.executable, "-m", "lcab.model", *args], check=False,
                          capture_output=True,
                          text=True, timeout=timeout, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_the_cli_names_its_rows_and_runs_from_any_directory(tmp_path):
    root = tmp_path / "results"
    write_run(root, "2026-11-28", "h100x4", "cp", commit="old1234", speed=300.0)
    write_run(root, "2026-11-29", "h100x4", "cp", commit="new5678")
    done = model_cli("--cp=2,16", "--masks=full", "--directions=fwd,bwd", f"--results_root={root}",
                     "--validate", f"--out={tmp_path / 'out'}", cwd="/tmp")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    header = done.stdout.split("\n\n")[0]
    assert header.startswith("Model (not a measurement), calibrated on:")
    for told in ("- kernel curve: jax.pallas_flex with its default options on NVIDIA H100",
                 "12 rows (fwd 6, bwd 6) at 4k, 16k, 64k",
                 "- links inside a node: jax's collectives only: ppermute",
                 "- validation: 1 OK CP rows",
                 f"{root / '2026-11-29-h100x4-cp'} (canonical cp run, 2026-11-29, h100x4)",
                 "commit new5678", "- links between nodes: 20 us, 40 GB/s"):
        assert told in header, header
    assert "old1234" not in done.stdout
    # 8k tokens per GPU at cp 2 and 16: every call within the curve's 4k-64k rows.
    assert "warning:" not in done.stdout
    assert (tmp_path / "out" / "predictions.md").read_text().startswith(header)


def test_the_header_warns_where_the_figures_are_extrapolated(tmp_path):
    # One length only (as the cp sweep's single-GPU rows have): the model
    # still runs, and says its speeds do not follow the call size.
    one = tmp_path / "one"
    write_run(one, "2026-11-29", "h200x4", "cp", commit="c", seqlens=(32768,))
    done = model_cli("--cp=2,8", "--masks=full", f"--results_root={one}", cwd="/tmp")
    assert done.returncode == 0 and "| ring" in done.stdout, done.stderr[-3000:]
    header = done.stdout.split("\n\n")[0]
    assert "4 rows (fwd 2, bwd 2) at 32k;" in header
    assert "\nwarning: the kernel curve was measured at one length (32k)" in header
    assert "per-GPU TFLOP/s below is extrapolated from 32k calls" in header
    # 8k-token ring steps are smaller than any 32k row: outside the range too.
    assert "per-GPU kernel calls modelled (fwd " in header and "lie outside" in header
    # Several lengths, calls smaller than all of them: only the range warning.
    several = tmp_path / "several"
    write_run(several, "2026-11-29", "h200x4", "cp", commit="c")
    done = model_cli("--cp=2", "--masks=full", "--seqlen_per_gpu=1k", "--strategies=ring",
                     f"--results_root={several}", cwd="/tmp")
    assert done.returncode == 0, done.stderr[-3000:]
    header = done.stdout.split("\n\n")[0]
    assert "at 4k, 16k, 64k;" in header and "one length" not in header
    warning, = [line for line in header.splitlines() if line.startswith("warning:")]
    assert warning.startswith("warning: 4 of the 4 per-GPU kernel calls modelled (fwd 34.4 GFLOP) lie ")
    assert "(its rows, all densities: fwd 275 GFLOP to 141 TFLOP, at 4k, 16k, 64k)" in warning


def test_the_links_follow_the_kernels_framework(tmp_path):
    write_run(tmp_path, "2026-11-29", "h100x4", "cp", commit="c", backend="torch.flex",
              cp=False, links_gbps=(("jax", 200.0), ("torch", 100.0)))
    done = model_cli("--cp=2", "--masks=full", "--kernel=torch.flex",
                     f"--results_root={tmp_path}", cwd="/tmp")
    assert done.returncode == 0, done.stderr[-3000:]
    assert ("- links inside a node: torch's collectives only (9 jax comm rows left out): "
            "ppermute 25.0 us, 100 GB/s") in done.stdout


@pytest.mark.parametrize("args, unmet", [
    ((), "pass --kernel_results=PATHS and --comm_results=PATHS with"),
    (("--validate",), "--kernel_results=PATHS, --comm_results=PATHS and --validate_against"),
])
def test_without_canonical_runs_the_cli_stops_with_one_line(tmp_path, args, unmet):
    done = model_cli("--cp=2", "--masks=full", f"--results_root={tmp_path}", *args, cwd="/tmp")
    assert done.returncode != 0 and "Traceback" not in done.stderr
    line, = done.stderr.strip().splitlines()
    assert line.startswith(f"python -m lcab.model: no canonical blog or cp run under {tmp_path}")
    assert unmet in line and "--results_root=DIR" in line


def test_explicit_rows_replace_the_canonical_runs(tmp_path):
    blog = write_run(tmp_path / "elsewhere", "2026-11-20", "h200", "blog", commit="mine123")
    done = model_cli("--cp=2", "--masks=full", f"--results_root={tmp_path / 'none'}",
                     f"--kernel_results={blog}", cwd="/tmp")
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "no canonical cp run" in done.stderr and "pass --comm_results=PATHS" in done.stderr
    cp_run = write_run(tmp_path / "other", "2026-11-21", "h100x4", "cp", commit="cp45678")
    done = model_cli("--cp=2", "--masks=full", f"--results_root={tmp_path / 'none'}",
                     f"--kernel_results={blog}", f"--comm_results={cp_run}", cwd="/tmp")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "commit mine123; device NVIDIA H200" in done.stdout
    assert "commit cp45678" in done.stdout
    assert "note: the kernel curve ran on NVIDIA H200, the links on NVIDIA H100" in done.stdout


def test_the_default_rows_work_or_fail_cleanly_from_another_directory():
    # This checkout's own results/: with a canonical run the model runs on
    # it, without one it says so; either way from /tmp and without a traceback.
    done = model_cli("--cp=2", "--masks=full", "--strategies=ring", cwd="/tmp")
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    if canonical.newest("cp") is None:
        assert done.returncode != 0 and "no canonical" in done.stderr
    else:
        assert done.returncode == 0 and "calibrated on:" in done.stdout
