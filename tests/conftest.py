"""测试入口。一个 pytest 进程只测一个检查点（它们都带一个叫 minisgl 的包）：

    pytest tests                              # 仓库级测试：清单与逐字节继承、小模型工具、测试框架自检
    pytest tests --checkpoint ch3             # 一个检查点：和 HF 逐 token 对齐 + 第 1~3 章的测试（累积）
    pytest tests --checkpoint my_ch3 --as ch3 # 读者自己的目录，按第 3 章的要求测
    pytest tests --checkpoint my_ch3 --as ch3 --task 2   # 只跑第 3 章任务 2 的测试（tests/tasks.toml 归的那一份）
    pytest tests --checkpoint ch6 --real      # 另加真权重一档（models/Qwen3-0.6B 或 models/SmolLM2-135M）

全部检查点一起：python -m tools.run_tests
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

from tools.manifest import Checkpoint, find_checkpoint  # noqa: E402

_SELECTED: Checkpoint | None = None
EMULATE = "MINISGL_EMULATE_CUDA"  # 设成 1：整个测试进程看得到模拟的 cuda:0（python course.py test ch6 --emulate-cuda）


def pytest_addoption(parser):
    parser.addoption("--checkpoint", help="检查点名字（step0_skeleton、ch3 …）或一个目录")
    parser.addoption("--as", dest="as_chapter", help="给读者自己的目录：按哪一章（step0、ch1…ch6）的要求测试")
    parser.addoption("--real", action="store_true", default=os.environ.get("MINISGL_REAL") == "1",
                     help="另跑真权重一档（models/Qwen3-0.6B，没有就 models/SmolLM2-135M；MINISGL_MODEL 可指定）")
    parser.addoption("--task", type=int, help="只跑所测这一章的任务 K 的测试（按 tests/tasks.toml 归类，"
                     "不按测试名里的 taskK；和 course.py check --task K 同一份）")


def pytest_configure(config):
    global _SELECTED
    if os.environ.get(EMULATE) == "1":  # 整个进程（连同子进程）看得到模拟的 cuda:0，像 GPU 机器上那样
        from tests.harness.cuda_emu.whole import start  # 开着才 import：它要 import torch

        problem = start()
        if problem is not None:
            raise pytest.UsageError(f"MINISGL_EMULATE_CUDA=1，但模拟的 CUDA 用不了：{problem}")
    spec = config.getoption("--checkpoint")
    if spec:
        _SELECTED = find_checkpoint(spec, config.getoption("as_chapter"))
        sys.path.insert(0, str(_SELECTED.path))  # import minisgl 得到的是这个检查点的包


def pytest_collection_modifyitems(config, items):
    """--task K：只留本章任务 K 的测试（归类见 tests/tasks.toml；-k taskK 只按名字挑，会漏掉名字里不带它的测试）。"""
    task = config.getoption("task")
    if task is None:
        return
    if _SELECTED is None:
        raise pytest.UsageError("--task 要和 --checkpoint 一起用：任务号是按哪一章数的")
    from tests.harness.progress import select_items

    select_items(config, items, "own", str(task), _SELECTED.chapter)


def pytest_report_header(config):
    if _SELECTED is None:
        return "仓库级测试（用 --checkpoint 选一个检查点）"
    real = "开" if config.getoption("--real") else "关（--real 打开）"
    emu = "；整个进程在模拟的 CUDA 上（MINISGL_EMULATE_CUDA=1）" if os.environ.get(EMULATE) == "1" else ""
    return f"检查点 {_SELECTED.name}（第 {_SELECTED.chapter} 章）：{_SELECTED.path}；真权重一档：{real}{emu}"


def _chapter_of(path: Path) -> int | None:
    m = re.fullmatch(r"ch(\d+)", path.name)
    return int(m.group(1)) if m else None


def pytest_ignore_collect(collection_path, config):
    p = Path(collection_path)
    if p.parent == ROOT / "tests" and p.is_dir():
        if p.name == "repo":
            return _SELECTED is not None
        if p.name == "checkpoint":
            return _SELECTED is None
        if p.name == "real":
            return _SELECTED is None or not config.getoption("--real")
        ch = _chapter_of(p)
        if ch is not None:  # 累积：第 N 章的检查点也要通过前面各章仍然适用的测试
            return _SELECTED is None or ch > _SELECTED.chapter
    if p.parent == ROOT / "tests" / "real" and (m := re.match(r"test_ch(\d+)_", p.name)):
        return _SELECTED is None or int(m.group(1)) > _SELECTED.chapter  # 第 N 章起才适用的真权重测试
    return None


@pytest.fixture(scope="session")
def checkpoint() -> Checkpoint:
    assert _SELECTED is not None
    return _SELECTED


@pytest.fixture(scope="session")
def tiny_models() -> dict[str, Path]:
    from tools.models.make_tiny_models import make_all

    return make_all()


@pytest.fixture(scope="module", autouse=True)
def _no_leftover_globals():
    """一个测试失败在半路（比如用着 Engine 时的断言）可能留下全局的 Context、TP 身份或进程组：每个测试文件测完清掉，
    免得同一个 pytest 进程里之后的文件跟着失败（-n 8 时失败会传给同一个 worker 上毫不相干的测试）。按文件而不是
    按测试清：有的文件整个共用一个 Engine。
    该清的有没有清，由测这件事的测试自己查；这里只用已经 import 过的模块，清不动（桩）就算了。"""
    yield
    if _SELECTED is None:
        return
    for module, reset in (("minisgl.core", "reset_global_ctx"), ("minisgl.distributed", "reset_tp_info")):
        try:
            getattr(sys.modules[module], reset)()
        except Exception:  # noqa: BLE001 —— 没 import、没有这个函数、还是桩：都不是这里该报的
            pass
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture
def gpu(request):
    """GPU 一档：在模拟的 CUDA 上（每台机器都有），以及有真 GPU 时在真 CUDA 上，各跑一遍（tests/harness/cuda_emu）。
    测试里 gpu.device 是 "cuda"，gpu.syncs 记下读回主存的每一次。"""
    from tests.harness.cuda_emu import gpu_target

    with gpu_target(request.param) as target:
        yield target


def pytest_generate_tests(metafunc):
    """按所选检查点支持的模型家族和页大小展开参数；用到 gpu 的测试按 GPU 的种类展开。"""
    if "gpu" in metafunc.fixturenames:
        from tests.harness.cuda_emu import gpu_kinds

        metafunc.parametrize("gpu", gpu_kinds(), indirect=True)
    if _SELECTED is None:
        return
    if "family" in metafunc.fixturenames:
        metafunc.parametrize("family", _SELECTED.families)
    if "page_size" in metafunc.fixturenames:
        metafunc.parametrize("page_size", _SELECTED.page_sizes)
