"""编译、缓存、加载 csrc 下的 C++：和官方 kernel/utils.py 的 load_jit 一样，每个核都从这里编。

第一次用时用 torch.utils.cpp_extension 编（-O3 -march=native，半分钟左右），缓存按"CPU 指令集 + 编译选项 + 版本 +
源码内容"分开：-march=native 的库换到指令集不同的机器上会非法指令崩溃；检查点和读者的工作区源码相同就共用一份，
改了源码就是新的一份。编译在子进程里做：PyPI 的 ninja 在 venv 没激活时不在 PATH 上，把它的目录交给子进程的 PATH，
本进程的环境变量一个不动。子进程编完还要试一遍新库的报错路径（probe）：有的工具链编出的库一抛异常就让进程崩溃，
崩在子进程里，本进程记下原因、改用 PyTorch 的算子。试过的结果（.trusted / .refused）和库放在一起，每份库只试一次。
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

if TYPE_CHECKING:
    from .plan import Plan

CSRC = Path(__file__).resolve().parent / "csrc"
SOURCES = ("small_linear.cpp", "decode_ops.cpp", "floors.cpp", "module.cpp")  # 编成一个扩展，module.cpp 绑定


_ARCH = "-mcpu=native" if platform.machine().lower() in ("arm64", "aarch64") else "-march=native"
# OpenMP：带 -fopenmp 时核的并行循环是 at::parallel_for（torch 的 OpenMP 线程池），Linux 的 gcc 默认开；Apple 的 clang
# 没有 -fopenmp，MINISGL_KERNEL_OPENMP=0 走同一条路：csrc/include/parallel.h 直接调 torch 载入的 OpenMP 运行库，
# 还是那一批线程、一样跟着 torch 的线程数。
# 选项进了缓存键，两种各存一份
OPENMP = os.environ.get("MINISGL_KERNEL_OPENMP", "1" if sys.platform.startswith("linux") else "0") != "0"
FLAGS = ["-O3", _ARCH, *(["-fopenmp"] if OPENMP else [])]


def cxx() -> list[str]:
    """torch 编扩展用的 C++ 编译器：$CXX，默认 c++。"""
    return shlex.split(os.environ.get("CXX") or "c++") or ["c++"]


def cache_key(sources: Sequence[Path]) -> str:
    """编译器也进键：g++ 和 clang++ 编的库各存一份，一个被拒绝（probe）时换另一个不会读到它的结论。
    只用名字、不问版本：没有编译器的机器也能算出键，用别处编好的库"""
    info = Path("/proc/cpuinfo")  # 没有它（macOS）就只按 platform 分
    cpu = next((s for s in info.read_text().splitlines() if s.startswith("flags")), "") if info.exists() else ""
    h = hashlib.sha1(f"{platform.machine()} {platform.processor()} {cpu} {FLAGS} {cxx()} {torch.__version__} "
                     f"{sys.version_info[:2]}".encode())
    for path in [*sources, *sorted((CSRC / "include").glob("*.h"))]:
        h.update(path.name.encode() + path.read_bytes())
    return h.hexdigest()[:10]


def compiler_problem() -> str | None:
    """torch 编扩展用的 C++ 编译器（$CXX，默认 c++）跑不起来时说一句为什么；能用时是 None。
    先问一句再编：不然原因埋在 torch 的长报错里，读者只看到一串命令"""
    cmd = cxx()
    if shutil.which(cmd[0]) is None:
        return f"找不到 C++ 编译器 {cmd[0]}"
    try:
        ok = subprocess.run([*cmd, "--version"], capture_output=True, timeout=60, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return None if ok else f"C++ 编译器 {' '.join(cmd)} 运行不了：{' '.join(cmd)} --version 失败"


# probe 时子进程这样死掉，说明是库的报错路径出了事：段错误、总线错、非法指令、浮点异常、abort（std::terminate），
# 和 probe 自己的超时（SIGALRM）
CRASHES = {getattr(signal, n).value for n in ("SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT", "SIGALRM")
           if hasattr(signal, n)}


class Refused(RuntimeError):
    """库编出来了，但它的报错路径没过 probe（崩溃或报错不对）：这套工具链不能用。"""


def run_build(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """跑编译 + probe 的子进程（tests/ch6/test_kernel.py 换掉它，模拟 probe 时崩溃的子进程）。"""
    return subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)


def load_jit(name: str, sources: Sequence[str]) -> ModuleType:
    """编译（缓存里没有时）并加载 csrc 下的 sources，得到一个 Python 扩展；编不了就抛 RuntimeError，第一行是原因；
    编出的库没过 probe 就抛 Refused。只加载过了 probe 的库（旁边有 .trusted）。"""
    from torch.utils.cpp_extension import get_default_build_root

    paths = [CSRC / s for s in sources]
    name = f"{name}_{cache_key(paths)}"
    build_dir = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()) / name
    library = build_dir / f"{name}.so"
    trusted, refused = library.with_suffix(".trusted"), library.with_suffix(".refused")
    if refused.is_file():  # 这份库试过、不能用：不再编、不再试
        raise Refused(refused.read_text(encoding="utf-8").strip())
    if not trusted.is_file():  # 缓存里有试过的库就直接加载：没有编译器的机器也能用别处编好的库
        if not library.is_file() and (why := compiler_problem()):
            raise RuntimeError(why)
        env = dict(os.environ)
        if importlib.util.find_spec("ninja") is not None:  # 没装就靠系统的 ninja
            import ninja

            env["PATH"] = ninja.BIN_DIR + os.pathsep + env.get("PATH", "")
        build_dir.mkdir(parents=True, exist_ok=True)
        res = run_build([sys.executable, __file__, name, str(build_dir), *map(str, paths)], env)
        if -res.returncode in CRASHES and library.is_file():  # 编出来了，试报错路径时崩了（被 Ctrl-C 打断的不算）
            sig = signal.Signals(-res.returncode)
            how = "卡住（probe 超时）" if sig == signal.SIGALRM else "让进程崩溃"
            refused.write_text(f"这套工具链编出的核报错时会{how}（signal {sig.value}，{sig.name}）", encoding="utf-8")
        if refused.is_file():
            raise Refused(refused.read_text(encoding="utf-8").strip())
        if res.returncode != 0 or not trusted.is_file():
            why = (f"编译 {name} 的子进程被 signal {-res.returncode} 结束" if res.returncode < 0
                   else f"编译 {name} 失败，没有输出")
            raise RuntimeError((res.stderr.strip().splitlines() or [why])[-1])
    spec = importlib.util.spec_from_file_location(name, library)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_refusal: list[str] = []  # extension() 拒绝这套工具链时的原因
_plan: list[Plan] = []  # extension() 载入时定下的 1~8 行的读法（plan.install）


@functools.cache
def extension() -> ModuleType | None:
    """C++ 核（编译或从缓存加载）；用不了时打印一行原因并返回 None（之后各层都用前几章的 PyTorch 写法）。"""
    if os.environ.get("MINISGL_KERNEL", "on") == "off":
        print("minisgl.kernel：MINISGL_KERNEL=off，全用 PyTorch 的算子（F.linear、F.rms_norm……）", file=sys.stderr)
        return None
    files, t0 = "、".join(SOURCES), time.perf_counter()
    try:
        ext = load_jit("minisgl_kernel", SOURCES)
    except Refused as e:
        _refusal[:] = [str(e)]
        print(f"minisgl.kernel：{files} 编出来了，但{e}，不用它，改用 PyTorch 的算子（F.linear、F.rms_norm……，"
              f"结果相同、decode 慢）；换一个编译器（如 CXX=clang++）会重新编、重新试", file=sys.stderr)
        return None
    except Exception as e:  # 编译器、ninja、编译错误：原因各不相同，都退回 PyTorch
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"minisgl.kernel：编译 {files} 失败（{reason[:200]}），"
              "改用 PyTorch 的算子（F.linear、F.rms_norm……，结果相同、decode 慢）；"
              f"要它就装上 C++ 编译器（如 apt-get install g++ / xcode-select --install）和 pip install ninja",
              file=sys.stderr)
        return None
    _refusal.clear()
    if time.perf_counter() - t0 > 2:
        print(f"minisgl.kernel：编译了 {files}（{time.perf_counter() - t0:.0f} 秒，之后的进程直接用缓存）",
              file=sys.stderr)
    from .plan import install  # 不在文件头 import：这个文件还要当编译子进程的脚本跑（见文件末尾）

    _plan[:] = [install(ext)]  # 读法在这里定一次（第一次在本机量，之后读缓存）；MINISGL_KERNEL_VARIANT 不对时报一行
    return ext


def chosen_plan() -> Plan | None:
    """这个进程里 small_linear 1~8 行各用哪种读法、怎么定的（Plan.line() 是给人看的一行）；核用不了时是 None。"""
    extension()
    return _plan[0] if _plan else None


def refusal() -> str | None:
    """extension() 编出了库、却因为它的报错路径没过 probe 而不用它时，是那个原因；别的情况是 None。"""
    extension()
    return _refusal[0] if _refusal else None


def num_threads() -> int | None:
    """C++ 核的并行区真用几个线程：带不带 OpenMP 编都跟着 torch 的线程数（parallel.h）；核用不了时是 None。"""
    ext = extension()
    return None if ext is None else ext.num_threads()


def cpu_op(name: str, like: torch.Tensor) -> Callable[..., Any] | None:
    """C++ 版的 name，给数据和 like 一样是 CPU 上 fp32 的层用；别的设备（包括还在 meta 上）、别的 dtype、
    扩展用不了时返回 None，层就用前几章的写法。每层只在知道数据放在哪儿时（构造、加载权重）调一次。"""
    if not like.is_cpu or like.dtype != torch.float32:
        return None
    ext = extension()
    return None if ext is None else getattr(ext, name)


def probe(ext: ModuleType) -> str | None:
    """新编的库出错时是不是好好抛出一行 RuntimeError：在并行区外（small_linear 的形状）和工作线程里
    （decode_attention 的槽位，2 个线程时第二段在工作线程上查出）各试一次。在编它的子进程里跑：崩了只崩子进程。
    对时是 None，不对时说哪里不对"""
    torch.set_num_threads(2)
    slots = torch.zeros(2, 256, dtype=torch.long)
    slots[1, -1] = 8  # 池子只有 8 个槽位
    cases = [(lambda: ext.small_linear(torch.randn(2, 16), torch.randn(5, 15)),
              "small_linear: shapes [2, 16] and [5, 15] do not match"),
             (lambda: ext.decode_attention(torch.randn(2, 1, 64), torch.zeros(8, 1, 64), torch.zeros(8, 1, 64), slots,
                                           torch.ones(2, 256, dtype=torch.bool), 1.0),
              "decode_attention: slot 8 is out of range [0, 8)")]
    for call, want in cases:
        try:
            call()
        except RuntimeError as e:
            if str(e).splitlines()[0] != want:
                return f"这套工具链编出的核报错不对（该是 {want!r}，得到 {str(e).splitlines()[0]!r}）"
        else:
            return f"这套工具链编出的核该报错时没有报错（{want}）"
    return None


if __name__ == "__main__":  # load_jit 的子进程：编出 build_dir/name.so，试它的报错路径；失败时 stderr 的最后一行是原因
    from torch.utils.cpp_extension import load

    try:
        built = load(name=sys.argv[1], sources=sys.argv[3:], extra_cflags=FLAGS, extra_ldflags=FLAGS[2:],
                     extra_include_paths=[str(CSRC / "include")], build_directory=sys.argv[2], verbose=False)
    except Exception as e:  # 编译日志很长：只转述第一行
        sys.exit(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)
    lib = Path(sys.argv[2]) / f"{sys.argv[1]}.so"
    if hasattr(signal, "alarm"):
        signal.alarm(120)  # 报错时卡住（等一个永远不来的线程）也算不能用：最多等两分钟
    if wrong := probe(built):
        lib.with_suffix(".refused").write_text(wrong, encoding="utf-8")
        sys.exit(wrong)
    lib.with_suffix(".trusted").write_text("probe ok\n", encoding="utf-8")
