"""python course.py demo DIR：在读者自己的 minisgl 上跑阶段一的里程碑脚本（第 6 章给定的
examples/stage1_milestone.py）。

    python -m tools.workbench.own_demo DIR [脚本的参数 ...]

脚本用 DIR 自己的那份（DIR/examples/stage1_milestone.py：python course.py start ch6 原样复制的给定文件）；
DIR 里没有时退回本书第 6 章检查点里的那份。先 import DIR 里的 minisgl，再运行脚本：本书的那份会把本书的检查点
插到 sys.path 最前面，但包已经在 sys.modules 里，它的子模块都从 DIR/minisgl 里找，所以跑的还是读者的引擎。
读者的代码抛了异常：打印 traceback（它是读者要调的），
最后一行说出错的文件、行和它属于哪一章的哪个任务——运行时在函数里出错、import 时在模块顶层出错（含语法错误）都一样。
"""

from __future__ import annotations

import ast
import runpy
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
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
    from tools.workbench.stubs import functions

    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    hits = [(q, n) for q, n in functions(tree) if n.lineno <= line <= (n.end_lineno or n.lineno)]
    return max(hits, key=lambda h: h[1].lineno)[0] if hits else None


def _owners() -> dict:
    """"文件:限定名" -> 最后一次把它做成桩的那一章的任务（后面的章没改它，它就还是那个任务写的）。"""
    from tools.manifest import load_manifest
    from tools.workbench.stubs import find_stubs

    owners = {}
    for ck in load_manifest():
        owners.update({s.key: s.task for s in find_stubs(ck) if s.task is not None})
    return owners


def _file_task(rel: str):
    """模块顶层的一行属于谁：最后一次改了这个文件的那一章里，模式管着整个文件的那个任务（比如 engine.py:*）。"""
    from tools.manifest import is_given, load_manifest, load_tasks, match

    for ck in reversed(load_manifest()):
        if rel in ck.changes and not is_given(ck.chapter, rel):
            hits = match(load_tasks().get(ck.chapter, []), f"{rel}:", "symbols")
            return hits[0] if len(hits) == 1 else None
    return None


def _how(dest: Path, t) -> str:
    if t.chapter == 6:
        return f"只测这个任务：python course.py check {dest.name} --as ch6 --task {t.number}"
    return f"python course.py check {dest.name} --as ch6 的回归一份会测它"


def whose_task(dest: Path, error: BaseException) -> str | None:
    """从最里层往外找 DIR 里的帧：第一个属于某个任务的函数，或者不在函数里的那一行（import 时执行的模块顶层、
    语法错误）——说出文件、行和任务；一个 DIR 里的帧都没有时 None。"""
    dest = dest.resolve()
    spots = []  # (相对路径, 行号, 限定名；不在函数里是 None, 是不是 import 时执行的模块顶层)，从外到里
    for frame, line in traceback.walk_tb(error.__traceback__):
        path = Path(frame.f_code.co_filename).resolve()
        if dest in path.parents:
            rel, top = path.relative_to(dest).as_posix(), frame.f_code.co_name == "<module>"
            spots.append((rel, line, None if top else _qualname(dest / rel, line), top))
    bad = Path(error.filename).resolve() if isinstance(error, SyntaxError) and error.filename else None
    syntax = bad is not None and dest in bad.parents
    if syntax:  # 语法错误：文件根本没跑起来，没有它的帧
        spots.append((bad.relative_to(dest).as_posix(), error.lineno or 0, None, True))
    if not spots:
        return None
    spots.reverse()
    owners = _owners()
    first = spots[0]
    raised = f"{first[0]}:{first[2]}" if first[2] else f"{first[0]} 第 {first[1]} 行"
    for rel, line, q, top in spots:
        via = "" if (rel, line) == first[:2] else f"（异常抛在 {raised}，从这里调用）"
        if q is None:
            t = _file_task(rel)
            what = ("有语法错误" if syntax else "import 它的时候就出错了") if top else "这一行不在任何函数里"
            owner = f"，属于{t.label}（{t.title}）。{_how(dest, t)}" if t else "：它不属于任何任务"
            return f"出错的是你的 {rel} 第 {line} 行：{what}{via}{owner}"
        if f"{rel}:{q}" in owners:
            t = owners[f"{rel}:{q}"]
            return f"出错的是你的 {rel}:{q}（第 {line} 行）{via}，属于{t.label}（{t.title}）。{_how(dest, t)}"
    return f"出错的是 {raised}：它不属于任何任务的桩（是你自己加的函数吗？）"


def milestone_script(dest: Path) -> Path | None:
    """DIR 自己的里程碑脚本（start ch6 复制的给定文件），没有就用本书的；两份都不在时 None。"""
    own = dest / "examples" / "stage1_milestone.py"
    return own if own.is_file() else SCRIPT if SCRIPT.is_file() else None


def main(argv: list[str]) -> int:
    dest = Path(argv[0]).resolve()
    script = milestone_script(dest)
    if script is None:  # 里程碑脚本是给定的文件：读者的目录里、书的检查点里都没有
        print(f"错误：里程碑脚本不见了：{dest.name}/examples/stage1_milestone.py 和本书的 {SCRIPT} 都没有"
              "（它是第 6 章给定的文件：python course.py start ch6 会复制一份；书里的那份用 "
              "git checkout -- ch6_engine_sampler 找回来）", file=sys.stderr, flush=True)
        return 1
    print(f"里程碑脚本：{script}", flush=True)
    sys.path.insert(0, str(dest))
    sys.argv = [str(script), *argv[1:]]
    try:
        import minisgl  # noqa: F401  先占住包名：之后 from minisgl.x import … 都从 DIR 里找

        runpy.run_path(str(script), run_name="__main__")
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as e:
        tb = e.__traceback__
        while tb is not None and Path(tb.tb_frame.f_code.co_filename).resolve() != script.resolve():
            tb = tb.tb_next  # 从脚本开始打印：runpy 和这里的帧与读者无关
        traceback.print_exception(type(e), e, tb or e.__traceback__)
        line = whose_task(dest, e)
        print(line or "出错的地方不在你的目录里：看上面 traceback 的最后几行", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
