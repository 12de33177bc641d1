"""python course.py demo DIR：在读者自己的 minisgl 上跑本书的里程碑脚本（第 6 章给定的 examples/stage1_milestone.py）。

    python -m tools.own_demo DIR [脚本的参数 ...]

先 import DIR 里的 minisgl，再运行脚本：脚本会把本书的检查点插到 sys.path 最前面，但包已经在 sys.modules 里，
它的子模块都从 DIR/minisgl 里找，所以跑的是读者的引擎。读者的代码抛了异常：打印 traceback（它是读者要调的），
最后一行说出错的函数属于哪一章的哪个任务。
"""

from __future__ import annotations

import ast
import runpy
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "ch6_engine_sampler" / "examples" / "stage1_milestone.py"
NEEDS = ["minisgl/__init__.py", "minisgl/core.py", "minisgl/engine/__init__.py", "minisgl/scheduler/__init__.py"]


def not_an_engine(dest: Path) -> str | None:
    """DIR 跑不了里程碑时的一行原因；跑得了时 None。"""
    if not dest.is_dir():
        return f"{dest} 不存在（或者不是目录）"
    missing = [rel for rel in NEEDS if not (dest / rel).is_file()]
    if missing:
        return (f"{dest.name} 里没有 {'、'.join(missing)}：里程碑要第 6 章的目录"
                f"（python course.py start ch6 --from 你的第 5 章）")
    return None


def _qualname(path: Path, line: int) -> str | None:
    """path 第 line 行所在的函数（和桩同一个粒度：嵌套函数算外层的）。"""
    from tools.stubs import functions

    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    hits = [(q, n) for q, n in functions(tree) if n.lineno <= line <= (n.end_lineno or n.lineno)]
    return max(hits, key=lambda h: h[1].lineno)[0] if hits else None


def _owners() -> dict:
    """"文件:限定名" -> 最后一次把它做成桩的那一章的任务（后面的章没改它，它就还是那个任务写的）。"""
    from tools.manifest import load_manifest
    from tools.stubs import find_stubs

    owners = {}
    for ck in load_manifest():
        owners.update({s.key: s.task for s in find_stubs(ck) if s.task is not None})
    return owners


def whose_task(dest: Path, tb) -> str | None:
    """从最里层往外找 DIR 里的帧，第一个属于某个任务的函数；一个 DIR 里的帧都没有时 None。"""
    dest = dest.resolve()
    inside = []
    for frame, line in traceback.walk_tb(tb):
        path = Path(frame.f_code.co_filename).resolve()
        if dest in path.parents:
            inside.append((path.relative_to(dest).as_posix(), line))
    keys = [f"{rel}:{q}" for rel, line in reversed(inside) if (q := _qualname(dest / rel, line))]
    if not keys:
        return None
    owners = _owners()
    for key in keys:
        if key in owners:
            t = owners[key]
            via = "" if key == keys[0] else f"（异常抛在 {keys[0]}，从这里调用）"
            how = (f"只测这个任务：python course.py check {dest.name} --as ch6 --task {t.number}" if t.chapter == 6
                   else f"python course.py check {dest.name} --as ch6 的回归一份会测它")
            return f"出错的是你的 {key}{via}，属于{t.label}（{t.title}）。{how}"
    return f"出错的是 {keys[0]}：它不属于任何任务的桩（是你自己加的函数吗？）"


def main(argv: list[str]) -> int:
    dest = Path(argv[0]).resolve()
    sys.path.insert(0, str(dest))
    sys.argv = [str(SCRIPT), *argv[1:]]
    try:
        import minisgl  # noqa: F401  先占住包名：之后 from minisgl.x import … 都从 DIR 里找

        runpy.run_path(str(SCRIPT), run_name="__main__")
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as e:
        tb = e.__traceback__
        while tb is not None and Path(tb.tb_frame.f_code.co_filename).resolve() != SCRIPT:
            tb = tb.tb_next  # 从脚本开始打印：runpy 和这里的帧与读者无关
        traceback.print_exception(type(e), e, tb or e.__traceback__)
        line = whose_task(dest, e.__traceback__)
        print(line or "出错的地方不在你的目录里：看上面 traceback 的最后几行", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
