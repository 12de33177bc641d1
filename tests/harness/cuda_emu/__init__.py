"""模拟的 CUDA：没有 GPU 的机器上，引擎照样建在 cuda:0 上跑，数值在 CPU 上真算。

它查的是 GPU 上才会出的错：张量放错设备（主存里填的 batch 交给 cuda 上的引擎）、不该有的读回主存（同步）。
查不了的：CUDA kernel 本身、NCCL、显存大小、速度、TF32（见"怎么跑测试"一页）。

    with emulated_cuda() as syncs:     # torch.cuda.is_available() 为 True，一块卡
        engine = Engine(EngineConfig(..., device="cuda"))
        n = len(syncs); engine.forward_batch(...); syncs.since(n)   # 这一步读回主存的每一次

各处的接缝（都在 _seams() 里，退出时原样还回）：torch.cuda 的 is_available、device_count、current_device、set_device、
mem_get_info、synchronize、Event、_lazy_init（safetensors 的 safe_open(device='cuda:0') 会调它）、CUDAGraph 和 graph
（录下设备上的算子、重放时重算，见 graph.py），以及
torch.tensor / torch.as_tensor 带 device='cuda' 的情形（它们不经过 dispatch mode）。
整个测试进程（连同子进程）都在模拟里：whole.py（MINISGL_EMULATE_CUDA=1）；那时 gpu 夹具不再套一层。
CPU-only 的 torch 还要一个 CUDA 设备守卫（guard.cpp，第一次用时编译、缓存），否则 Python 里索引 cuda 张量就报
"PyTorch is not linked with support for cuda devices"。
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch
import torch.utils._device

from .rules import RULES, CrossDeviceError
from .graph import CUDAGraph, graph
from .tensor import SYNCS, CudaMode, EmulatedCudaTensor, HostSyncs, SyncCounter, _sync

__all__ = ["RULES", "CrossDeviceError", "EmulatedCudaTensor", "GpuTarget", "HostSyncs", "emulated_cuda", "gpu_kinds",
           "gpu_target", "guard_problem"]

HERE = Path(__file__).resolve().parent
CACHE = HERE.parents[2] / ".cache" / "cuda_emu"
_guard_error: str | None = None
_guard_loaded = False
_depth = 0  # emulated_cuda() 套了几层（0 或 1）


def gpu_kinds() -> list[str]:
    """GPU 一档的参数：有真 GPU 时是 "cuda"（同一批测试在真货上跑，模拟的规则就在第一次有 GPU 的运行里对上了
    真的 CUDA）；没有时是 "emulated"。带 CUDA 的 torch 不能加载模拟的守卫（会顶掉真的），所以两档不在一台机器上并存。
    整个进程在模拟里时 is_available() 也是 True：看 torch 带不带 CUDA，才分得清真假。"""
    return ["cuda"] if torch.backends.cuda.is_built() and torch.cuda.is_available() else ["emulated"]


def _build_guard() -> Path:
    """编 guard.cpp 成一个共享库（只依赖 libc10），按源码、torch 版本、编译器缓存；编一次不到一秒。"""
    import torch.utils.cpp_extension as ce

    src = HERE / "guard.cpp"
    cxx = shlex.split(os.environ.get("CXX") or "c++")
    key = hashlib.sha1(src.read_bytes() + f"{torch.__version__} {cxx}".encode()).hexdigest()[:10]
    lib = CACHE / f"guard-{key}.so"
    if lib.exists():
        return lib
    if shutil.which(cxx[0]) is None:
        raise RuntimeError(f"找不到 C++ 编译器 {cxx[0]}")
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = lib.with_suffix(f".{os.getpid()}.tmp")
    abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
    cmd = [*cxx, "-shared", "-fPIC", "-O1", "-std=c++17", abi,
           *[f"-I{p}" for p in ce.include_paths()], str(src), "-o", str(tmp),
           *[f"-L{p}" for p in ce.library_paths()], "-lc10"]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        tail = (res.stderr.strip().splitlines() or ["?"])[-1]
        raise RuntimeError(f"编译 {src.name} 失败：{tail}")
    tmp.replace(lib)  # 编完整了才换上：并行的测试进程不会读到半个库
    return lib


def guard_problem() -> str | None:
    """模拟用不了的原因（一句话），能用时 None。真有 CUDA 的 torch 不加载守卫（会顶掉真的），也不需要模拟。"""
    global _guard_error, _guard_loaded
    if _guard_loaded or _guard_error is not None:
        return _guard_error
    if torch.backends.cuda.is_built():
        _guard_error = "这个 torch 带 CUDA：不加载模拟的设备守卫（在真 GPU 上跑同一批测试）"
        return _guard_error
    try:
        ctypes.CDLL(str(_build_guard()), mode=ctypes.RTLD_GLOBAL)  # 加载时静态注册 CUDA 的 DeviceGuardImpl
        _guard_loaded = True
    except (OSError, RuntimeError) as e:
        _guard_error = f"模拟的 CUDA 要一个 C++ 设备守卫，编不了：{e}"
    return _guard_error


class _Event:
    """torch.cuda.Event 的替身：模拟里一切都已经算完，record / synchronize 什么也不等。"""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def record(self, stream=None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


def _free_memory(device=None) -> tuple[int, int]:
    """mem_get_info 的替身：一块"显卡"的空闲和总量就是主存的。"""
    page = os.sysconf("SC_PAGE_SIZE")
    return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page


def _synchronize(device=None) -> None:
    _sync("synchronize", "torch.cuda.synchronize")


def _on_cuda_factory(real):
    """torch.tensor / torch.as_tensor 带 device='cuda' 时：先在 CPU 上建，再 .to('cuda')
    （经过 dispatch，包成 cuda 张量）。"""
    def factory(data, *args, device=None, **kwargs):
        if device is not None and torch.device(device).type == "cuda":
            kwargs.pop("pin_memory", None)
            return real(data, *args, **kwargs).to(device)
        return real(data, *args, device=device, **kwargs)
    return factory


def _seams() -> list[tuple[object, str, object]]:
    return [(torch.cuda, "is_available", lambda: True), (torch.cuda, "device_count", lambda: 1),
            (torch.cuda, "current_device", lambda: 0), (torch.cuda, "set_device", lambda device: None),
            (torch.cuda, "mem_get_info", _free_memory), (torch.cuda, "synchronize", _synchronize),
            (torch.cuda, "Event", _Event), (torch.cuda, "_lazy_init", lambda: None),
            (torch.cuda, "CUDAGraph", CUDAGraph), (torch.cuda, "graph", graph),
            (torch, "tensor", _on_cuda_factory(torch.tensor)), (torch, "as_tensor", _on_cuda_factory(torch.as_tensor))]


@contextlib.contextmanager
def emulated_cuda() -> Iterator[HostSyncs]:
    """在这段里 torch 看得到一块 GPU（cuda:0），张量建在上面、算在 CPU 上；给出读回主存的记录。"""
    global _depth
    if _depth:  # 已经在模拟里（整个进程的模拟，whole.py）：不再套一层，只从头记同步
        SYNCS.events.clear()
        yield SYNCS
        return
    problem = guard_problem()
    if problem is not None:
        raise RuntimeError(problem)
    # torch 第一次用 with torch.device(...) 时把工厂函数记进缓存；先记下真的，别让替身 torch.tensor 顶进去
    # （否则这个进程里 meta 上下文不再管 torch.tensor，HF 加载出未初始化的 inv_freq）
    torch.utils._device._device_constructors()
    seams = _seams()
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in seams]
    for obj, name, value in seams:
        setattr(obj, name, value)
    SYNCS.events.clear()
    _depth += 1
    try:
        with CudaMode():
            yield SYNCS
    finally:
        _depth -= 1
        for obj, name, value in saved:
            setattr(obj, name, value)


@dataclass
class GpuTarget:
    """一档 GPU：kind 是 "emulated" 或 "cuda"；device 总是 "cuda"（引擎、张量都放这里）；syncs 记下读回主存的每一次。"""

    kind: str
    syncs: HostSyncs
    device: str = "cuda"


@contextlib.contextmanager
def gpu_target(kind: str) -> Iterator[GpuTarget]:
    """测试夹具 gpu 的实现：模拟的 CUDA，或真 CUDA 上只记同步。模拟用不了时 pytest.skip 一行原因（比如没有编译器）。"""
    import pytest

    if kind == "emulated":
        problem = guard_problem()
        if problem is not None:
            pytest.skip(problem)
        with emulated_cuda() as syncs:
            yield GpuTarget(kind, syncs)
        return
    SYNCS.events.clear()
    real_sync = torch.cuda.synchronize

    def synchronize(device=None) -> None:  # 不是 aten 算子，dispatch mode 看不到：在这里记
        SYNCS.record("synchronize", "torch.cuda.synchronize")
        real_sync(device)

    torch.cuda.synchronize = synchronize
    try:
        with SyncCounter():
            yield GpuTarget(kind, SYNCS)
    finally:
        torch.cuda.synchronize = real_sync
