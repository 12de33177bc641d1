"""编译、缓存、加载 csrc 下的 C++：和官方 kernel/utils.py 的 load_jit 一样，每个核都从这里编。

第一次用时用 torch.utils.cpp_extension 编（-O3 -march=native，半分钟左右），缓存按"CPU 指令集 + 编译选项 + 版本 +
源码内容"分开：-march=native 的库换到指令集不同的机器上会非法指令崩溃；检查点和读者的工作区源码相同就共用一份，
改了源码就是新的一份。编译在子进程里做：PyPI 的 ninja 在 venv 没激活时不在 PATH 上，把它的目录交给子进程的 PATH，
本进程的环境变量一个不动。
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Sequence

import torch

CSRC = Path(__file__).resolve().parent / "csrc"
SOURCES = ("small_linear.cpp", "decode_ops.cpp", "module.cpp")  # 编成一个扩展，module.cpp 绑定


_ARCH = "-mcpu=native" if platform.machine().lower() in ("arm64", "aarch64") else "-march=native"
# OpenMP：核的 at::parallel_for 用 torch 的线程池。Linux 的 gcc 默认开；Apple 的 clang 没有 -fopenmp，
# MINISGL_KERNEL_OPENMP=0 走同一条路（编出来的核单线程，num_threads() 如实说 1）。选项进了缓存键，两种各存一份
OPENMP = os.environ.get("MINISGL_KERNEL_OPENMP", "1" if sys.platform.startswith("linux") else "0") != "0"
FLAGS = ["-O3", _ARCH, *(["-fopenmp"] if OPENMP else [])]


def cache_key(sources: Sequence[Path]) -> str:
    info = Path("/proc/cpuinfo")  # 没有它（macOS）就只按 platform 分
    cpu = next((s for s in info.read_text().splitlines() if s.startswith("flags")), "") if info.exists() else ""
    h = hashlib.sha1(f"{platform.machine()} {platform.processor()} {cpu} {FLAGS} {torch.__version__} "
                     f"{sys.version_info[:2]}".encode())
    for path in [*sources, *sorted((CSRC / "include").glob("*.h"))]:
        h.update(path.name.encode() + path.read_bytes())
    return h.hexdigest()[:10]


def compiler_problem() -> str | None:
    """torch 编扩展用的 C++ 编译器（$CXX，默认 c++）跑不起来时说一句为什么；能用时是 None。
    先问一句再编：不然原因埋在 torch 的长报错里，读者只看到一串命令"""
    cxx = shlex.split(os.environ.get("CXX") or "c++") or ["c++"]
    if shutil.which(cxx[0]) is None:
        return f"找不到 C++ 编译器 {cxx[0]}"
    try:
        ok = subprocess.run([*cxx, "--version"], capture_output=True, timeout=60, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return None if ok else f"C++ 编译器 {' '.join(cxx)} 运行不了：{' '.join(cxx)} --version 失败"


def load_jit(name: str, sources: Sequence[str]) -> ModuleType:
    """编译（缓存里没有时）并加载 csrc 下的 sources，得到一个 Python 扩展；编不了就抛 RuntimeError，第一行是原因。"""
    from torch.utils.cpp_extension import get_default_build_root

    paths = [CSRC / s for s in sources]
    name = f"{name}_{cache_key(paths)}"
    build_dir = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()) / name
    library = build_dir / f"{name}.so"
    if not library.is_file():  # 缓存里有就直接加载：没有编译器的机器也能用别处编好的库
        if why := compiler_problem():
            raise RuntimeError(why)
        env = dict(os.environ)
        if importlib.util.find_spec("ninja") is not None:  # 没装就靠系统的 ninja
            import ninja

            env["PATH"] = ninja.BIN_DIR + os.pathsep + env.get("PATH", "")
        build_dir.mkdir(parents=True, exist_ok=True)
        res = subprocess.run([sys.executable, __file__, name, str(build_dir), *map(str, paths)], env=env,
                             capture_output=True, text=True, check=False)
        if res.returncode != 0 or not library.is_file():
            raise RuntimeError((res.stderr.strip().splitlines() or [f"编译 {name} 失败，没有输出"])[-1])
    spec = importlib.util.spec_from_file_location(name, library)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def extension() -> ModuleType | None:
    """C++ 核（编译或从缓存加载）；用不了时打印一行原因并返回 None（之后各层都用前几章的 PyTorch 写法）。"""
    if os.environ.get("MINISGL_KERNEL", "on") == "off":
        print("minisgl.kernel：MINISGL_KERNEL=off，全用 PyTorch 的算子（F.linear、F.rms_norm……）", file=sys.stderr)
        return None
    files, t0 = "、".join(SOURCES), time.perf_counter()
    try:
        ext = load_jit("minisgl_kernel", SOURCES)
    except Exception as e:  # 编译器、ninja、编译错误：原因各不相同，都退回 PyTorch
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"minisgl.kernel：编译 {files} 失败（{reason[:200]}），"
              "改用 PyTorch 的算子（F.linear、F.rms_norm……，结果相同、decode 慢）；"
              f"要它就装上 C++ 编译器（如 apt-get install g++ / xcode-select --install）和 pip install ninja",
              file=sys.stderr)
        return None
    if time.perf_counter() - t0 > 2:
        print(f"minisgl.kernel：编译了 {files}（{time.perf_counter() - t0:.0f} 秒，之后的进程直接用缓存）",
              file=sys.stderr)
    return ext


def num_threads() -> int | None:
    """C++ 核的并行区真用几个线程：带 OpenMP 编的跟着 torch 的线程数，不带的只有 1 个；核用不了时是 None。"""
    ext = extension()
    return None if ext is None else ext.num_threads()


def cpu_op(name: str, like: torch.Tensor) -> Callable[..., Any] | None:
    """C++ 版的 name，给数据和 like 一样是 CPU 上 fp32 的层用；别的设备（包括还在 meta 上）、别的 dtype、
    扩展用不了时返回 None，层就用前几章的写法。每层只在知道数据放在哪儿时（构造、加载权重）调一次。"""
    if not like.is_cpu or like.dtype != torch.float32:
        return None
    ext = extension()
    return None if ext is None else getattr(ext, name)


if __name__ == "__main__":  # load_jit 的子进程：编出 build_dir/name.so；失败时 stderr 的最后一行是原因
    from torch.utils.cpp_extension import load

    try:
        load(name=sys.argv[1], sources=sys.argv[3:], extra_cflags=FLAGS, extra_ldflags=FLAGS[2:],
             extra_include_paths=[str(CSRC / "include")], build_directory=sys.argv[2], verbose=False)
    except Exception as e:  # 编译日志很长：只转述第一行
        sys.exit(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)
