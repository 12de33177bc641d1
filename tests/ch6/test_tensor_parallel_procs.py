"""张量并行真的跨进程跑：generate.py --tp N 起 N 个进程，经 torch.distributed（CPU 上是 gloo）一起算一个模型。

- 每个小模型家族跑一次：qwen3-tied 用 --tp 4（2 个 KV 头给 4 个 rank：rank 0、1 用头 0，rank 2、3 用头 1；
  KV 头比 rank 少时的复制就由它管），qwen2（q/k/v 带 bias，LM head 不绑定）和 llama3（绑定）用 --tp 2：
  token 和 HF 逐个相同（--tp 1 和 HF 相同由 test_parity_with_hf 管，合起来就是和 --tp 1 相同）；
  对不上时报告第一次分叉的那一步（top-5、max |Δ logit|）；
- 这些运行分两条道同时跑（tp_runs）；道内一个接一个、共用一个端口：shutdown 拆掉了进程组，端口能再用，
  出错退出的运行也一样；每次运行之后没有进程留下；
- 切不开的 --tp 在起进程之前就被拒绝（launch_tp 根本没被调用），错误说出是哪一项；
- worker 里的错误带着原文回到父进程，不会挂住；
- 随机采样时各 rank 的 token 一致（父进程逐个核对）。

每个 worker 一个线程（OMP_NUM_THREADS=1），两核的机器上也跑得动。CPU 上 rank 是 fork 出来的（不用重新 import），
启动器被杀的那个测试两种起法（fork、spawn）都试。
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from minisgl.distributed import DistributedInfo, try_get_tp_info
from minisgl.engine import Engine, EngineConfig
from tools.manifest import PROMPTS, TINY_NEW_TOKENS
from tests.harness.contract import build_argv
from tests.harness.errors import expect_error, expect_exit, run_cli
from tests.harness.reference import hf_greedy, load_tokenizer
from tests.harness.report import mismatch_report

CASES = [("qwen3-tied", 4), ("qwen2", 2), ("llama3", 2)]  # 每起一次进程都要几秒：一家一次
# 两条道同时跑（两核的机器上一条道一个核），道内一个接一个、共用一个端口：前一次运行没把端口还回来，后一次就失败
LANES = [["qwen3-tied-tp4", "worker_error"], ["qwen2-tp2", "llama3-tp2", "sampling"]]
KEYS = {"test_tp_sampling_same_on_every_rank": "sampling",
        "test_worker_error_reaches_parent": "worker_error"}  # 测试 -> 它看的那次运行


def rank_device_args(tp: int) -> list[str]:
    """GPU 比 rank 少（常见的是一块卡）时，各 rank 放在 CPU 上用 gloo 跑：--device cpu，和 tp.md 教的一样。"""
    return ["--device", "cpu"] if torch.cuda.is_available() and torch.cuda.device_count() < tp else []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def processes_with(marker: str) -> list[str]:
    """环境变量里带着 marker 的进程（spawn 出来的 worker 继承父进程的环境）：不用 psutil，直接读 /proc。"""
    return list(pids_with(marker).values())


def pids_with(marker: str) -> dict[int, str]:
    found = {}
    for env in Path("/proc").glob("[0-9]*/environ"):
        try:
            if marker.encode() in env.read_bytes():
                cmd = (env.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found[int(env.parent.name)] = cmd
        except OSError:  # 进程刚好退出，或者读不了
            pass
    return found


@dataclasses.dataclass
class Run:
    """一次 generate.py：结果、异常（比如超时）和它退出之后还留着的进程。"""
    args: list[str]
    env: dict[str, str]
    result: subprocess.CompletedProcess | None = None
    error: Exception | None = None
    left: list[str] = dataclasses.field(default_factory=list)

    def outcome(self) -> subprocess.CompletedProcess:
        if self.error is not None:
            raise self.error
        assert not self.left, f"generate.py {' '.join(self.args)} 退出之后还留着进程：{self.left}"
        return self.result


def run_generate(checkpoint, run: Run) -> None:
    """像读者那样在子进程里运行 generate.py；返回之后检查它起的进程都已经退出。"""
    marker = uuid.uuid4().hex
    entry = checkpoint.entry_path
    env = dict(os.environ, PYTHONPATH=str(entry.parent), OMP_NUM_THREADS="1", MINISGL_TP_TEST=marker, **run.env)
    try:
        run.result = subprocess.run([sys.executable, str(entry), *run.args], capture_output=True, text=True,
                                    timeout=300, env=env, cwd=entry.parent)
    except (subprocess.SubprocessError, OSError) as e:  # 超时等：记下来，在这次运行自己的测试里抛出
        run.error = e
    deadline = time.monotonic() + 10  # 进程表里的条目可能比退出晚一点消失
    while (left := processes_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    run.left = left


def planned_runs(tiny_models, tmp: Path) -> dict[str, Run]:
    runs = {}
    for name, tp in CASES:
        dump = tmp / f"{name}-tp{tp}.safetensors"
        args = build_argv(tiny_models[name], PROMPTS, TINY_NEW_TOKENS, dump_logits=dump)
        runs[f"{name}-tp{tp}"] = Run(args + ["--tp", str(tp), "--dist-timeout", "60", *rank_device_args(tp)], {})
    runs["sampling"] = Run(["--model", str(tiny_models["llama3"]), "--prompt", "Hello", "--prompt", "你好",
                            "--max-new-tokens", "8", "--json", "--tp", "2", "--temperature", "1.0", "--top-k", "50",
                            "--seed", "7", *rank_device_args(2)], {})
    (tmp / "worker_error").mkdir()
    runs["worker_error"] = Run(["--model", str(tiny_models["qwen3-tied"]), "--prompt", "Hello", "--tp", "2",
                                "--num-pages", "1", *rank_device_args(2)], {"TMPDIR": str(tmp / "worker_error")})
    return runs


def run_key(item) -> str | None:
    """这个测试要看哪一次运行（不是本文件里读 tp_runs 的测试：None）。"""
    if item.module.__name__ != __name__ or "tp_runs" not in getattr(item, "fixturenames", ()):
        return None
    if item.originalname == "test_tp_tokens_equal_hf":
        return item.callspec.id
    return KEYS[item.originalname]


@pytest.fixture(scope="module")
def tp_runs(request, checkpoint, tiny_models, tmp_path_factory) -> dict[str, Run]:
    """这次选中的测试要的那几次运行，两条道同时跑完再交给各个测试（两核的机器上两条道各用一个核）。"""
    wanted = {k for item in request.session.items if (k := run_key(item))}
    runs = planned_runs(tiny_models, tmp_path_factory.mktemp("tp"))

    def lane(keys: list[str]) -> None:
        port = free_port()
        for key in keys:
            if key in wanted:
                runs[key].args += ["--dist-addr", f"tcp://127.0.0.1:{port}"]
                run_generate(checkpoint, runs[key])

    with ThreadPoolExecutor(len(LANES)) as pool:
        list(pool.map(lane, LANES))
    return runs


@pytest.mark.parametrize("name,tp", CASES, ids=[f"{f}-tp{t}" for f, t in CASES])
def test_tp_tokens_equal_hf(tp_runs, tiny_models, name, tp):
    model, run = tiny_models[name], tp_runs[f"{name}-tp{tp}"]
    res = run.outcome()
    assert res.returncode == 0, res.stderr[-3000:]
    outs = json.loads(res.stdout.strip().splitlines()[-1])["outputs"]
    ours = load_file(run.args[run.args.index("--dump-logits") + 1])
    decode = load_tokenizer(str(model)).decode
    reports = []
    for i, p in enumerate(PROMPTS):
        ref, ref_logits = hf_greedy(str(model), p, TINY_NEW_TOKENS)
        rep = mismatch_report(p, outs[i], ref, ref_logits, ours[f"p{i}"], decode)
        if rep:
            reports.append(f"[{name} · tp={tp}] {rep}")
    assert not reports, "\n\n".join(reports)  # --tp 1 和 HF 相同由 test_parity_with_hf 负责


def test_tp_sampling_same_on_every_rank(tp_runs):
    """温度采样：每个 rank 同一个种子、同一份 logits，采出同样的 token；不一致时父进程报错退出
    （种子带上 rank 时这里会失败）。"""
    res = tp_runs["sampling"].outcome()
    assert res.returncode == 0, res.stderr[-3000:]
    outs = json.loads(res.stdout.strip().splitlines()[-1])["outputs"]
    assert [len(o) for o in outs] == [8, 8]


def test_tp_that_cannot_cut_is_refused_before_spawning(checkpoint, tiny_models, monkeypatch):
    """4 个头、intermediate_size 128 切不成 3 份：起进程之前就退出，错误说出是哪几项和 tp。在这个进程里运行
    generate.py（不用为一次 import 起一个进程），给定的 launch_tp 换成一调用就失败的函数：切不开时根本不该走到它。"""
    import minisgl.server
    from minisgl.server import launch

    def must_not_launch(*args, **kwargs):
        raise AssertionError("切不开的 --tp 3 还是调用了 launch_tp 去起进程：应该先 config.check_tp()")

    for where in (minisgl.server, launch):  # from minisgl.server import launch_tp 和 launch.launch_tp 两种写法
        monkeypatch.setattr(where, "launch_tp", must_not_launch)
    res = run_cli(checkpoint.entry_path, ["--model", str(tiny_models["qwen3-tied"]), "--prompt", "Hello", "--tp", "3"])
    expect_exit("ch6/cli_tp_cannot_cut", res, tp=3, culprit=["num_attention_heads=4", "intermediate_size=128"])


def test_worker_error_reaches_parent(tp_runs):
    """KV 池只有 1 页：每个 worker 在生成时出错。父进程带着 worker 的原话退出，不挂住，不留进程，
    也不在临时目录里留下 pytorch-errorfile-*.pickle。"""
    run = tp_runs["worker_error"]
    expect_exit("ch6/cli_tp_worker_error", run.outcome(), tp=2)
    errors = Path(run.env["TMPDIR"])
    assert not list(errors.glob("pytorch-errorfile-*")), list(errors.iterdir())


SLEEPER = """
import pathlib, sys, time
import torch
from minisgl.distributed import DistributedInfo
from minisgl.engine import EngineConfig
from minisgl.server import launch

def run_rank(config, ready):
    torch.set_num_threads(2)
    torch.ones(512, 512) @ torch.ones(512, 512)  # 两个线程的并行区：fork 前没放掉父进程的 OpenMP 线程池，就卡在这里
    (pathlib.Path(ready) / f"rank{config.tp_info.rank}").touch()  # 各写各的文件：两个 rank 不抢同一个管道
    time.sleep(300)

if __name__ == "__main__":
    ready, method = sys.argv[1], sys.argv[2]
    torch.set_num_threads(2)
    torch.ones(1024, 1024) @ torch.ones(1024, 1024)  # 父进程先算过东西：OpenMP 的线程池已经建好
    if method == "spawn":
        launch.start_method = lambda: "spawn"
    config = EngineConfig(model_path=".", tp_info=DistributedInfo(0, 2), dtype=torch.float32, device="cpu")
    launch.launch_tp(config, run_rank, ready)
"""


def test_gpu_ranks_that_do_not_exist_are_refused_before_spawning(checkpoint, tiny_models, monkeypatch):
    """一块 GPU 的机器上 --tp 2、没说 --device cpu：给定的 launch_tp 在起进程之前拒绝，并说出 --device cpu。
    在这个进程里运行 generate.py，torch.cuda 换成"看得到 1 块卡"：拒绝发生在碰 CUDA 之前，没有 GPU 的机器上也测得到。"""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    res = run_cli(checkpoint.entry_path, ["--model", str(tiny_models["qwen3-tied"]), "--prompt", "Hello", "--tp", "2"])
    expect_exit("ch6/cli_tp_more_ranks_than_gpus", res)


def test_ranks_use_fork_on_cpu_and_spawn_with_cuda():
    """CPU 上 fork（rank 不用重新 import torch），有 CUDA 时 spawn（fork 出来的进程里 CUDA 不能用）。"""
    from minisgl.server.launch import start_method

    assert start_method() == ("spawn" if torch.cuda.is_available() else "fork")


def test_every_openmp_runtime_in_the_process_is_found():
    """torch 的 OpenMP 运行库不一定在全局符号表里（aarch64 的 wheel 就不在）：openmp_runtimes 按 /proc/self/maps
    找到进程里载入的每一份，每份都有 omp_pause_resource_all，fork 之前才放得掉。"""
    import ctypes

    from minisgl.server.launch import openmp_runtimes

    if "OpenMP" not in torch.__config__.parallel_info():
        pytest.skip("这份 torch 不用 OpenMP：没有线程池要放")
    torch.ones(64, 64) @ torch.ones(64, 64)
    found = openmp_runtimes()
    assert found, f"torch 用着 OpenMP，/proc/self/maps 里却没找到运行库：{torch.__config__.parallel_info()}"
    assert all(hasattr(ctypes.CDLL(p), "omp_pause_resource_all") for p in found), found


@pytest.mark.parametrize("method", ["start_method()", "spawn"])
def test_ranks_exit_when_the_launcher_is_killed(checkpoint, tmp_path, method):
    """启动器被 SIGKILL：两个 rank 也跟着退出，而不是一直跑到生成结束。两种起法都试：CPU 上默认的 fork，和 spawn。

    启动器先用两个线程算过矩阵乘、每个 rank 起来后也用两个线程算一次：fork 之前没放掉 OpenMP 的线程池时，rank 会
    卡在那一次上，120 秒内起不来。两个 rank 都起来了才杀启动器：每个 rank 建一个自己的标记文件（以前是往同一个
    stdout 各打一行，两行交错成 'rank 0 uprank 1 up' 时读错）。"""
    script, ready = tmp_path / "launcher.py", tmp_path / "ready"
    script.write_text(SLEEPER)
    ready.mkdir()
    marker = uuid.uuid4().hex
    env = dict(os.environ, PYTHONPATH=str(checkpoint.path), OMP_NUM_THREADS="1", MINISGL_TP_TEST=marker)
    proc = subprocess.Popen([sys.executable, str(script), str(ready), method], env=env, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 120
        while len(list(ready.iterdir())) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, f"启动器自己先退出了：{proc.stderr.read()[-2000:]}"
        assert sorted(p.name for p in ready.iterdir()) == ["rank0", "rank1"], "120 秒内两个 rank 没都起来"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 20
        while (left := processes_with(marker)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not left, f"启动器死了，rank 还在：{left}"
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in pids_with(marker):  # 检查失败时别把睡着的 rank 留给后面的测试
            os.kill(pid, signal.SIGKILL)


def tp_config(model, tp: int, rank: int = 0, **kw) -> EngineConfig:
    return EngineConfig(model_path=str(model), tp_info=DistributedInfo(rank, tp), dtype=torch.float32,
                        max_running_req=1, num_page_override=8, max_seq_len_override=8, **kw)


@pytest.mark.parametrize("heads,kv_heads,inter,tp,culprit", [
    (4, 2, 128, 2, None), (4, 2, 128, 4, None), (4, 1, 128, 4, None),  # 4 个 rank 复制 2 个或 1 个 KV 头
    (4, 2, 128, 3, "num_attention_heads=4"), (8, 3, 128, 2, "num_key_value_heads=3"),
    (8, 3, 128, 4, "num_key_value_heads=3"), (8, 8, 100, 8, "intermediate_size=100")])
def test_task1_check_tp_names_the_culprit(tiny_models, heads, kv_heads, inter, tp, culprit):
    config = tp_config(tiny_models["qwen3-tied"], tp)
    config.__dict__["model_config"] = dataclasses.replace(  # cached_property：换成要测的形状
        config.model_config, num_qo_heads=heads, num_kv_heads=kv_heads, intermediate_size=inter)
    if culprit is None:
        config.check_tp()
    else:
        with expect_error("ch6/check_tp", tp=tp, culprit=culprit):
            config.check_tp()


def test_task1_engine_refuses_bad_tp_before_any_global_state(tiny_models):
    with expect_error("ch6/check_tp", tp=3, culprit="num_attention_heads=4"):
        Engine(tp_config(tiny_models["qwen3-tied"], 3))
    assert try_get_tp_info() is None
    assert not torch.distributed.is_initialized()


def test_task1_lonely_rank_times_out_instead_of_hanging(tiny_models, tmp_path):
    """tp=2 只来了 rank 0：会合等 distributed_timeout 秒后报错；全局状态和进程组都清干净。"""
    config = tp_config(tiny_models["qwen3-tied"], 2, distributed_timeout=2,
                       distributed_addr=f"file://{tmp_path / 'rendezvous'}")
    with expect_error("ch6/lonely_rank", rank=0, timeout=2):
        Engine(config)
    assert try_get_tp_info() is None
    assert not torch.distributed.is_initialized()
