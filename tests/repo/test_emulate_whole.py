"""MINISGL_EMULATE_CUDA=1（python course.py test ch6 --emulate-cuda）做到了它说的：整个 pytest 进程和它起的 Python
子进程都看得到模拟的 cuda:0，EngineConfig(device="auto") 落在 cuda 上，同步照记，gpu 夹具不再套一层模拟。

在子进程里跑一个小 pytest（只加载 tests/conftest.py，不收集章节测试），几秒钟。
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PROBE = textwrap.dedent("""
    import subprocess, sys
    import torch
    from minisgl.distributed import DistributedInfo
    from minisgl.engine import EngineConfig
    from tests.harness import cuda_emu
    from tests.harness.cuda_emu import SYNCS

    def test_whole_process_sees_cuda():
        assert torch.cuda.is_available() and cuda_emu.gpu_kinds() == ["emulated"]
        config = EngineConfig(model_path="/nonexistent", tp_info=DistributedInfo(0, 1), dtype=torch.float32)
        assert config.rank_device == torch.device("cuda", 0)
        start = len(SYNCS)
        assert torch.ones(2, device="cuda").tolist() == [1.0, 1.0]
        assert SYNCS.since(start) == [("tolist", "Tensor.tolist")]

    def test_gpu_fixture_does_not_nest(gpu):
        assert gpu.kind == "emulated" and gpu.syncs is SYNCS and cuda_emu._depth == 1

    def test_children_see_cuda_even_with_their_own_pythonpath():
        code = "import torch; print(torch.cuda.is_available(), torch.zeros(1, device='cuda').device)"
        res = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": "/nonexistent", "PATH": ""},
                             capture_output=True, text=True, timeout=120)
        assert res.stdout.split() == ["True", "cuda:0"], res.stderr[-2000:]
""")


def test_the_switch_makes_cuda_visible_to_the_whole_run(tmp_path):
    from tests.harness.cuda_emu import guard_problem

    if guard_problem():
        pytest.skip(guard_problem())
    (tmp_path / "test_probe.py").write_text(PROBE, encoding="utf-8")
    env = dict(os.environ, MINISGL_EMULATE_CUDA="1", OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.conftest", str(tmp_path / "test_probe.py"),
                          "--checkpoint", "ch6_engine_sampler", "-p", "no:cacheprovider", "--rootdir",
                          str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "3 passed" in res.stdout, res.stdout[-3000:] + res.stderr[-2000:]
    assert "整个进程在模拟的 CUDA 上" in res.stdout  # 报告头说明这次是在模拟里跑的
