"""python -m tools.run_tests 同时跑几份：跟着本进程能用的核走（os.sched_getaffinity），被空闲内存压低；-j 可以改。"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools.suite import parts

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def machine(monkeypatch, tmp_path):
    """假装的机器：n 个核、free MB 空闲内存，没有量过的记录。"""
    monkeypatch.setattr(parts, "RECORD", tmp_path / "parts.json")

    def make(cores: int, free: int | None):
        monkeypatch.setattr(parts, "usable_cores", lambda: cores)
        monkeypatch.setattr(parts, "available_mb", lambda: free)
    return make


NAMES = ["仓库级", "ch6_engine_sampler", "文档", "ch3_model_loading", "ch5_attention", "ch4_kv_pool", "ch2_ops",
         "ch1_req_batch", "step0_skeleton"]


@pytest.mark.parametrize("cores", [1, 2, 8, 16])
def test_jobs_follow_the_cores_when_memory_is_plenty(machine, cores):
    machine(cores, 10**6)
    jobs, line = parts.choose_jobs(NAMES)
    assert jobs == min(cores, len(NAMES)), line
    assert f"能用 {cores} 个核" in line and "-j" in line
    assert parts.threads_per_job(jobs) == max(1, cores // jobs)


def test_memory_lowers_the_count_and_threads_take_the_spare_cores(machine):
    machine(16, 4 * parts.GUESS_MB)  # 只放得下 MEMORY_SHARE × 4 份的估计
    jobs, line = parts.choose_jobs(NAMES)
    assert jobs * parts.GUESS_MB <= 4 * parts.GUESS_MB * parts.MEMORY_SHARE < (jobs + 1) * parts.GUESS_MB, line
    assert parts.threads_per_job(jobs) == 16 // jobs and "空闲内存" in line


def test_measured_peaks_replace_the_guess(machine):
    """量过的峰值内存代替估计：大的几份先算。"""
    machine(8, 10_000)
    parts.save_record({"仓库级": parts.Part(peak_mb=5000), "ch6_engine_sampler": parts.Part(peak_mb=3000)})
    jobs, line = parts.choose_jobs(["仓库级", "ch6_engine_sampler", "ch2_ops"])
    assert jobs == 2 and "上次量到的" in line, line  # 5000 + 3000 ≤ 8000 < 5000 + 3000 + 1500


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="绑核要 os.sched_setaffinity（Linux）")
def test_a_process_bound_to_one_core_runs_one_part():
    """taskset 限到一个核的进程（容器的 cpuset 同理）：一份一份跑，不按整台机器的核数起。"""
    code = ("import os; os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]}); "
            "from tools.suite.parts import choose_jobs; print(choose_jobs(['a', 'b', 'c'])[0])")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "1"


def test_wait_measured_reports_the_peak_memory_and_cpu_of_the_process_tree():
    """峰值内存来自 os.wait4：子进程里最大的一个（这里孙进程占了 200 MB）也算进来。"""
    if not hasattr(os, "wait4"):
        pytest.skip("os.wait4 只在 POSIX 上有")
    grandchild = "b = bytearray(200 * 2**20); b[::4096] = b'x' * len(b[::4096])"
    code = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {grandchild!r}], check=True)"
    proc = subprocess.Popen([sys.executable, "-c", code])
    used = parts.wait_measured(proc)
    assert proc.returncode == 0 and used.peak_mb >= 200 and used.cpu_s > 0, used


def test_bytecode_is_written_even_when_the_environment_forbids_it(tmp_path):
    """设了 PYTHONDONTWRITEBYTECODE 时，各份的子进程照样把字节码写进源码旁边的 __pycache__，第二个进程直接用它，
    不再编译；别的环境变量原样不动。"""
    from tools.suite.procs import write_bytecode

    assert write_bytecode({"PYTHONDONTWRITEBYTECODE": "1", "A": "b"}) == {"A": "b"}
    (tmp_path / "mod.py").write_text("X = 1\n", encoding="utf-8")
    env = write_bytecode(dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
    env.pop("PYTHONPYCACHEPREFIX", None)
    stamps = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", "import mod; print(mod.__cached__)"], cwd=tmp_path, env=env,
                             capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        pyc = Path(out.stdout.strip())
        assert pyc.is_file() and pyc.parent == tmp_path / "__pycache__"
        stamps.append(pyc.stat().st_mtime_ns)
    assert stamps[0] == stamps[1]  # 第二个进程读了第一个写的，没有重写
