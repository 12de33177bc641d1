"""python course.py start chN [DIR] [--from 你的第 N-1 章 [--force]]：第 N 章的起点。

不带 --from：本书的第 N-1 章 + 本章的桩（tools/workbench/workspace.py 的 make_workspace）。
带 --from：先按第 N-1 章的要求检查你的目录（python -m tools.run_tests DIR --as chN-1 --own，只测那一章自己的任务），
没通过就说出任务和第一个没过的测试、停下；通过了再从它长出第 N 章的目录（grow_workspace）。起点记在
.cache/course/（tools/workbench/course_record.py），python course.py progress 读它。
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from tools.manifest import ROOT

COURSE = ROOT / "course.py"


def shown(path: Path) -> str:
    """打印给读者复制的路径：在当前目录下就写相对路径，否则写绝对路径（在哪里复制粘贴都找得到）。"""
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


USAGE = "错误：用法是 python course.py start chN [DIR] [--from 你的第 N-1 章 [--force]]（N 是 1~6；step0 也行）"


def _start_args(extra: list[str]) -> tuple[str, str | None, str | None, bool] | str:
    """chN [DIR] [--from DIR] [--force] -> (chN, DIR, --from, --force)；用错时是一行 错误：…。"""
    pos, src, force, i = [], None, False, 0
    while i < len(extra):
        a = extra[i]
        if a == "--force":
            force = True
        elif a == "--from" or a.startswith("--from="):
            if src is not None:
                return "错误：--from 只能给一个目录"
            if a == "--from" and (i + 1 == len(extra) or extra[i + 1].startswith("-")):
                return "错误：--from 后面要跟你上一章的目录，比如 --from my_ch3"
            src, i = (extra[i + 1], i + 1) if a == "--from" else (a.split("=", 1)[1], i)
        elif a.startswith("-"):
            return f"错误：start 不认识参数 {a}（只认 --from DIR 和 --force）"
        else:
            pos.append(a)
        i += 1
    if not pos or len(pos) > 2:
        return USAGE
    if force and src is None:
        return "错误：--force 只和 --from 一起用：它跳过对上一章目录的检查"
    return pos[0], pos[1] if len(pos) > 1 else None, src, force


def inside_the_book(dest: Path, default: str) -> str | None:
    """工作目录放进检查点、tests/、tools/、docs/ 里时的一行原因：那里的每个文件都算书的一部分
    （之后每次 start 都会把检查点里的它当成书复制，测试和文档构建也会去读它）。"""
    from tools.manifest import load_manifest

    parts = [ROOT / c.name for c in load_manifest()] + [ROOT / d for d in ("tests", "tools", "docs")]
    hit = next((p for p in parts if p in dest.parents), None)  # 它们本身已经存在，"已经存在"先拒绝了
    if hit is None:
        return None
    return (f"{shown(dest)} 在本书的 {hit.name}/ 里面：工作目录放在那里就成了书的一部分"
            f"（后面的 start 会把它当成书复制）；换一个书外面的目录，比如 {shown(ROOT / default)}")


def _not_previous(mine: Path, prev) -> str | None:
    """--from 的目录当不了第 N-1 章时的一行原因。"""
    from tools.workbench.course_record import read_start

    if not mine.is_dir():
        return f"--from 的目录 {shown(mine)} 不存在"
    need = [prev.entry] + (["minisgl/__init__.py"] if prev.chapter >= 1 else [])
    missing = [rel for rel in need if not (mine / rel).is_file()]
    if missing:
        return (f"{shown(mine)} 不是第 {prev.chapter} 章的目录：里面没有 {'、'.join(missing)}"
                f"（--from 要你用 python course.py start {prev.name.split('_')[0]} 开始、写完了的那个目录）")
    record = read_start(mine)
    if record and record["chapter"] != prev.chapter:
        return f"{mine.name} 是第 {record['chapter']} 章的目录，--from 要第 {prev.chapter} 章的"
    return None


def _check_previous(mine: Path, prev) -> bool:
    """按第 N-1 章的要求检查 --from 的目录（只测那一章自己的任务）：没通过就说出任务和第一个没过的测试。"""
    from tools.workbench.course_record import first_failure, read_check, task_summary
    from tools.workbench.task_table import progress_table

    tag = prev.name.split("_")[0]
    record = read_check(mine)
    if record and not record["stale"] and record["selection"] in ("all", "own") and not first_failure(
            record["results"], prev.chapter):  # check 刚测过这份代码、本章的任务全过：不再重跑
        when = time.strftime("%H:%M", time.localtime(record["when"]))
        tasks = len(task_summary(record["results"], prev.chapter))
        print(f"{mine.name} 在 {when} 的 check 里通过了第 {prev.chapter} 章的全部 {tasks} 个任务，"
              "之后代码没改过：不再重跑检查。", flush=True)
        return True
    print(f"先检查 {mine.name}：按第 {prev.chapter} 章的任务测（不跑前面各章的回归和真权重一档；"
          f"--force 跳过这一步）……", flush=True)
    t0 = time.time()
    res = subprocess.run([sys.executable, "-m", "tools.run_tests", str(mine), "--as", tag, "--own", "--no-docs"],
                         cwd=ROOT, capture_output=True, text=True)
    record = read_check(mine)
    fresh = record if record and record["when"] >= t0 and not record["stale"] else None
    rows = task_summary(fresh["results"], prev.chapter) if fresh else []
    if res.returncode == 0:
        tests = sum(ok for _, ok, _, _, _ in rows)
        counted = f"全部 {len(rows)} 个任务、{tests} 个测试" if rows else "全部任务"
        print(f"{mine.name} 通过了第 {prev.chapter} 章的{counted}（{time.time() - t0:.0f} 秒）。", flush=True)
        return True
    why = first_failure(fresh["results"], prev.chapter) if fresh else None
    print(progress_table(fresh["results"], prev.chapter)[0] if fresh else (res.stdout + res.stderr)[-3000:])
    print(f"错误：{mine.name} 还没通过第 {prev.chapter} 章：{why or '检查没有跑完（见上面的输出）'}。"
          f"修好再来（python {shown(COURSE)} check {shown(mine)} --as {tag} 看全部），"
          f"或者加 --force 跳过检查")
    return False


def _by_folder(files: list[str]) -> list[str]:
    """每个目录一行：'minisgl/layers/  base.py、norm.py'。"""
    folders: dict[str, list[str]] = {}
    for rel in sorted(files):
        head, _, name = rel.rpartition("/")
        folders.setdefault(head + "/" if head else "./", []).append(name)
    return [f"    {folder}  {'、'.join(names)}" for folder, names in folders.items()]


def _by_file(keys: list[str], mark: set[str]) -> list[str]:
    """每个文件一行："minisgl/layers/norm.py  RMSNorm.__init__、RMSNorm.forward*"（mark 里的加 *）。"""
    files: dict[str, list[str]] = {}
    for key in keys:
        rel, _, qual = key.partition(":")
        files.setdefault(rel, []).append(qual + ("*" if key in mark else ""))
    return [f"    {rel}  {'、'.join(quals)}" for rel, quals in files.items()]


def _report(g, name: str, chapter: int) -> None:
    """grow_workspace 做了什么：哪些文件原样来自你的目录、带上了你的哪些函数、哪些用了本书的。"""
    print(f"  原样来自 {name} 的 {len(g.from_dir)} 个文件（第 {chapter} 章不改它们）：")
    print("\n".join(_by_folder(g.from_dir)))
    mod = f"，其中 {len(g.rewritten)} 个和本书的写法不同：{'、'.join(g.rewritten)}" if g.rewritten else ""
    print(f"  第 {chapter} 章改的文件里，和上一章一样的函数带上了你的 {len(g.carried)} 个{mod}")
    if g.added:
        print(f"  也带上了你自己加的：{'、'.join(g.added)}")
    if g.missing:
        print(f"  {name} 里没有这些函数，用了本书的：{'、'.join(g.missing)}")
    if g.given:
        print(f"  给定的文件（{len(g.given)} 个）来自本书，第 {chapter} 章没改的函数仍是你的（算在上面带上的里）：")
        print("\n".join(_by_folder(g.given)))
    if g.replaced:
        lost = f"，标 * 的 {len(g.lost)} 个你的写法和本书不同、没有带过来" if g.lost else ""
        print(f"  给定的文件在第 {chapter} 章改写了这 {len(g.replaced)} 个函数（本章的基础设施，不是要你写的），"
              f"所以用了本书的新版本{lost}：")
        print("\n".join(_by_file(g.replaced, set(g.lost))))
    for note in g.notes:
        print(f"  {note}")


def start(extra: list[str]) -> int:
    """第 N 章的起点：上一章（本书的检查点，或 --from 你自己的目录）+ 本章的桩（stubs 从参考检查点现生成）。"""
    parsed = _start_args(extra)
    if isinstance(parsed, str):
        print(parsed)
        return 2
    spec, where, src, force = parsed
    from tools.workbench import course_record, stubs, workspace
    from tools.manifest import find_checkpoint

    try:
        ck = find_checkpoint(spec)
    except SystemExit as e:  # 清单给的说明已经是一行 错误：…
        print(e)
        return 2
    tag, prev = ck.name.split("_")[0], stubs.previous(ck)
    dest = Path(where or f"my_{tag}").resolve()
    mine = Path(src).resolve() if src is not None else None
    if mine is not None and prev is None:
        print("错误：第 0 步没有上一章，--from 不适用（start step0 从空目录开始）")
        return 2
    if mine is not None and (why := _not_previous(mine, prev)):
        print(f"错误：{why}")
        return 2
    if dest.exists():
        print(f"错误：{workspace.exists_line(dest)}")
        return 1
    if why := inside_the_book(dest, f"my_{tag}"):
        print(f"错误：{why}")
        return 2
    if mine is not None and not force and not _check_previous(mine, prev):
        return 1
    try:  # 上面查过不存在；同时跑的另一个 start 可能刚建了它：认领（mkdir）撞上时同样是一行
        made = workspace.make_workspace(ck, dest) if mine is None else workspace.grow_workspace(ck, dest, mine)
    except FileExistsError as e:
        print(f"错误：{e}")
        return 1
    except OSError as e:
        print(f"错误：建不了 {shown(dest)}：{e.strerror or e}")
        return 1
    if mine is None:
        print(f"{dest}：{prev.name if prev else '空目录'} + 第 {ck.chapter} 章的 {len(made)} 个桩"
              f"（raise NotImplementedError 的地方就是要你写的）。")
        yours = dest.parent / f"my_{prev.name.split('_')[0]}" if prev else None
        if yours is not None and yours.is_dir():
            again = f"python {shown(COURSE)} start {tag}{' ' + shown(dest) if where else ''} --from {shown(yours)}"
            print(f"  （起点是本书的 {prev.name}。想从你自己的 {yours.name} 长出来：删掉 {dest.name}，再 {again}）")
    else:  # --force 的话建成了才说：没建成（同时跑的另一个 start 先建了）就只有"已经存在"那一行
        if force:
            print(f"--force：没有检查 {mine.name}，直接从它长出 {dest.name}（没通过的地方跟着带过来了）")
        print(f"{dest}：从你的 {mine.name} 长出来 + 第 {ck.chapter} 章的 {len(made.stubs)} 个桩"
              f"（raise NotImplementedError 的地方就是要你写的）。")
        _report(made, mine.name, ck.chapter)
    course_record.write_start(dest, ck.chapter, {"from": str(mine) if mine else None, "forced": force})
    print(f"照着 docs/{tag}.md 的「任务」一节写；随时看进度：python {shown(COURSE)} check "
          f"{shown(dest)} --as {tag}")
    return 0
