"""``bench/gpu_check.sh`` (issue 37): the prepared GPU check runs end to end on the CPU at small sizes in an
environment like the GPU machine's (no pydantic, textual, aiosqlite, vLLM or pytest: tests/bench/gpu_machine.py),
its MLA check tells a wrong rope apart, and its report fails what did not pass.

The end-to-end run (~20 s on 2 cores) is in ``make test`` so that a change breaking the check shows without a
GPU; the wrong-rope and time-limit runs, which test the check itself, are ``slow``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).parent))

from bench import gpu_check_mla, gpu_check_report  # noqa: E402
from bench.gpu_check_extract import passed  # noqa: E402
from bench.gpu_check_models import KIMI_EXPERTS, KIMI_LAYERS, flops_per_token, param_count, wide_config  # noqa: E402


@pytest.fixture(scope="module")
def gpu_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from gpu_machine import make_venv

    return make_venv(tmp_path_factory.mktemp("gpuenv") / "venv")


def test_the_emulated_gpu_machine_lacks_what_the_real_one_lacks(gpu_python: Path) -> None:
    code = ("import importlib.util as u; print(*[m for m in ('pydantic', 'textual', 'aiosqlite', 'vllm', 'pytest', "
            "'torch', 'transformers', 'safetensors', 'accelerate', 'pyarrow') if u.find_spec(m)])")
    out = subprocess.run([str(gpu_python), "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["torch", "transformers", "safetensors", "accelerate", "pyarrow"]


@pytest.mark.slow  # 18-33 s on 2 cores: `make slow` (which .ci/run runs) keeps CI-less breakage in sight
def test_gpu_check_runs_end_to_end_on_cpu_small(gpu_python: Path, tmp_path: Path) -> None:
    """The check's CPU command line passes in the emulated environment and writes real numbers."""
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": str(gpu_python), "OMP_NUM_THREADS": "2"}
    env.pop("PYTHONPATH", None)
    p = subprocess.run([str(ROOT / "bench" / "gpu_check.sh"), str(out), "--device", "cpu", "--small",
                        "--work", str(tmp_path / "work")], capture_output=True, text=True, env=env, timeout=280)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    md = (out / "results.md").read_text()
    assert md.startswith("# GPU check results\n\n**PASS**")
    res = json.loads((out / "results.json").read_text())
    assert res["ok"] and res["failures"] == [] and res["meta"]["pydantic"] == "2.14.4"  # the bundled wheel
    assert [s["step"] for s in res["steps"]] == ["mla", "extract"] and all(s["rc"] == 0 for s in res["steps"])
    rows = res["mla"]["rows"]
    assert {r["case"] for r in rows} == {"tiny, default rope", "tiny, Kimi yarn rope", "Kimi width, yarn rope (small)"}
    assert {r["dtype"] for r in rows} == {"float32", "bfloat16"} and len(rows) == 22
    for r in rows:
        assert 0 < max(r["pos0_max_abs_diff"], r["later_max_abs_diff"]) <= r["tol"], r
        assert r["max_abs_ref"] > 0.1
    f32 = [r for r in rows if r["dtype"] == "float32" and r["layer"] != "final (normed)"]
    assert max(r["later_max_abs_diff"] for r in f32) < 1e-5  # float32 agrees far inside its tolerance
    e = res["extract"]
    assert e["hidden_size"] == 256 and e["samples"] == 6 and e["tokens"] > 6 * 32
    bf16, fp8 = e["runs"]
    assert (bf16["states"], fp8["states"]) == ("bf16", "fp8")
    for r in (bf16, fp8):
        assert r["samples"] == 6 and r["extract_tokens_per_s"] > 0 and 0 < r["forward_share"] <= 1
        assert abs(r["written_vs_projected"] - 1) < 0.01
    # bytes per token: 3 aux layers + the last state, H 256; bf16 2 bytes + ids/mask 9, fp8 1 byte + a 4-byte scale
    assert abs(bf16["bytes_per_token"] - (4 * 256 * 2 + 9)) < 8 and abs(fp8["bytes_per_token"] - (4 * 256 + 13)) < 8
    assert e["bare_forward_tokens_per_s"] > 0 and e["forward_gflop_per_token"] > 0
    assert "| bf16 |" in md and "| fp8 |" in md and "| Kimi width, yarn rope (small) | bfloat16 | 1 |" in md
    assert (out / "logs" / "mla.log").is_file() and (out / "logs" / "extract.log").is_file()
    partial = {k: v for k, v in e.items() if not k.startswith(("bare_", "gpu_"))}  # cut before the bare loop
    assert "Bare forward: n/a tokens/s" in gpu_check_report.render(res["steps"], {"extract": partial}, {})


@pytest.mark.slow
def test_gpu_check_steps_past_their_time_limit_fail_the_check(gpu_python: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": str(gpu_python), "GPU_CHECK_MLA_TIMEOUT": "1", "GPU_CHECK_EXTRACT_TIMEOUT": "1"}
    p = subprocess.run([str(ROOT / "bench" / "gpu_check.sh"), str(out), "--device", "cpu", "--small"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 1, p.stdout[-2000:] + p.stderr[-2000:]
    res = json.loads((out / "results.json").read_text())
    assert [(s["step"], s["rc"]) for s in res["steps"]] == [("mla", 124), ("extract", 124)]
    assert res["failures"][0] == "mla: exit status 124 (timed out)"
    assert "**FAIL**: mla: exit status 124 (timed out)" in (out / "results.md").read_text()


def test_gpu_check_refuses_a_bad_command_line(tmp_path: Path) -> None:
    sh = str(ROOT / "bench" / "gpu_check.sh")
    assert subprocess.run([sh], capture_output=True).returncode == 2
    p = subprocess.run([sh, str(tmp_path / "o"), "--device", "tpu"], capture_output=True, text=True)
    assert p.returncode == 2 and "cuda or cpu" in p.stderr


@pytest.mark.slow
def test_the_mla_check_fails_a_wrong_rope(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the reference's rope made neox while the model's is interleaved, the check fails at positions
    >= 1 and not at position 0 (which attends to itself only): it sees what it is there to see."""
    import numpy as np

    from bench.gpu_check_models import build_random_model

    name, cfg = gpu_check_mla.cases(small=True)[0]
    model = build_random_model(tmp_path / "m", cfg, dtype="float32")
    seqs = [np.arange(n, dtype=np.int64) * 7 % 1000 for n in (1, 9, 24)]
    good = gpu_check_mla.compare(model, name, seqs, ["float32"], "cpu")
    assert all(r["ok"] for r in good) and len(good) == 4  # layers 0..2 + final
    real = gpu_check_mla.load_weights

    def neox(model: Path, device: str) -> tuple[dict[str, Any], dict[str, Any]]:
        c, w = real(model, device)
        return {**c, "rope_interleave": False}, w

    monkeypatch.setattr(gpu_check_mla, "load_weights", neox)
    bad = gpu_check_mla.compare(model, name, seqs, ["float32"], "cpu")
    assert not any(r["ok"] for r in bad)
    assert all(r["pos0_max_abs_diff"] < 1e-5 and r["later_max_abs_diff"] > 1e-3 for r in bad[:3])


def test_report_fails_a_timed_out_step_and_missing_results() -> None:
    steps = gpu_check_report.read_steps("mla\t0\t31\nextract\t124\t270\ngarbage line\n")
    assert steps == [{"step": "mla", "rc": 0, "seconds": 31.0}, {"step": "extract", "rc": 124, "seconds": 270.0}]
    mla = {"ok": True, "rows": [{"case": "c", "dtype": "float32", "layer": "0", "pos0_max_abs_diff": 1e-7,
                                 "later_max_abs_diff": 2e-7, "max_abs_ref": 0.5, "tol": 1e-4, "ok": True}]}
    bad = gpu_check_report.verdict(steps, {"mla": mla})
    assert bad == ["extract: exit status 124 (timed out)", "extract: no results written"]
    md = gpu_check_report.render(steps, {"mla": mla}, {"gpu": "H100"})
    assert "**FAIL**: extract: exit status 124 (timed out)" in md and "- gpu: H100" in md
    assert "| c | float32 | 0 | 1.00e-07 | 2.00e-07 | 0.500 | 1.00e-04 | yes |" in md
    assert "## Extraction benchmark\n\n(no results)" in md
    assert gpu_check_report.verdict([{"step": "mla", "rc": 0, "seconds": 1.0}, {"step": "extract", "rc": 0, "seconds": 1.0}],
                                    {"mla": mla, "extract": {"ok": False, "failures": ["fp8: x"]}}) == \
        ["extract: results not ok (fp8: x)"]


def test_extract_pass_rules() -> None:
    run = {"states": "bf16", "state": "done", "samples": 4, "written_vs_projected": 1.0, "bytes_written": 100}
    fp8 = {**run, "states": "fp8", "bytes_written": 51}
    assert passed({"samples": 4, "runs": [run, fp8]}) == []
    assert passed({"samples": 4, "runs": [run, {**fp8, "written_vs_projected": 1.2}]}) == \
        ["fp8: wrote 1.2x the projected bytes"]
    assert passed({"samples": 5, "runs": [run, {**fp8, "bytes_written": 100}]}) == [
        "bf16: state done, 4/5 samples", "fp8: state done, 4/5 samples",
        "fp8 states are not smaller than the model dtype's"]


def test_kimi_width_counts() -> None:
    """The model arithmetic matches Kimi-K2.5's published size (docs/kimi-k2.5.md: 1.027T text parameters)."""
    kimi = wide_config(KIMI_LAYERS, 1, experts=KIMI_EXPERTS)
    assert kimi.hidden_size == 7168 and kimi.num_experts_per_tok == 8 and kimi.q_lora_rank == 1536
    assert abs(param_count(kimi) / 1e12 - 1.027) < 0.002
    bench = wide_config(4, 1)
    assert abs(param_count(bench) / 1e9 - 5.40) < 0.01
    # per token: 4 layers at ~0.50 G multiply-adds each, causal attention over 2,800 tokens, no LM head
    assert abs(flops_per_token(bench, 2800) / 1e9 - 4.44) < 0.01
    assert abs(flops_per_token(bench, 2800, 1.0) - flops_per_token(bench, 2800) - 2 * 7168 * 163840) < 1
