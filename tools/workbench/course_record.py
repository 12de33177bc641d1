"""读者目录的记录：check 跑出的结果、start 从哪里长出来。python course.py progress 只读这些，不重跑测试。

记录放在仓库的 .cache/course/ 下（按目录的绝对路径分开），不放进读者的目录：那里的每个文件都是代码，
start --from 会把它们带进下一章。记录里有代码的摘要：代码改过之后，progress 会说记录比代码旧。
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from tools.manifest import ROOT, Task, checkpoint_files, is_given_test, load_manifest, load_tasks
from tools.workbench.task_table import chapter_of_test, task_of_test

RECORDS = ROOT / ".cache" / "course"


def _folder(dest: Path) -> Path:
    """MINISGL_COURSE_RECORDS 换一个地方放记录：测试用临时目录，不碰仓库里读者自己的记录。"""
    dest = dest.resolve()
    root = Path(os.environ.get("MINISGL_COURSE_RECORDS") or RECORDS)
    return root / f"{dest.name}-{hashlib.sha256(str(dest).encode()).hexdigest()[:12]}"


def code_digest(dest: Path) -> str:
    """目录里全部代码文件（checkpoint_files 的范围）的摘要。"""
    h = hashlib.sha256()
    for rel, data in checkpoint_files(dest).items():
        h.update(rel.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()


def _write(dest: Path, kind: str, data: dict) -> Path:
    path = _folder(dest) / f"{kind}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"dir": str(dest.resolve()), "when": time.time(), "digest": code_digest(dest), **data}
    part = path.with_suffix(".part")
    part.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    part.replace(path)
    return path


def _broken(data: object, kind: str) -> str | None:
    """记录的形状不对时的一句原因（别的版本写的、手改过的）：读它的地方都按这些字段取值。"""
    if not isinstance(data, dict):
        return f"不是一个 JSON 对象，而是 {type(data).__name__}"
    want = {"chapter": int, "when": (int, float), **({"selection": str, "results": dict} if kind == "check" else {})}
    bad = [k for k, t in want.items() if not isinstance(data.get(k), t) or isinstance(data.get(k), bool)]
    if kind == "check" and "results" not in bad and not all(isinstance(r, dict) and isinstance(
            r.get("outcome"), str) and isinstance(r.get("reason"), str) for r in data["results"].values()):
        bad.append("results")
    if kind == "start" and not isinstance(data.get("from"), (str, type(None))):
        bad.append("from")
    return f"字段 {'、'.join(bad)} 缺了或者类型不对" if bad else None


def _read(dest: Path, kind: str, unreadable: list[str] | None = None) -> dict | None:
    """记录加一个 stale 字段：记录之后代码改过没有。没有记录时 None。
    读不了的记录（写到一半、手改坏了）也当作没有：给了 unreadable 就往里记一行原因，不让读它的命令停下。"""
    path = _folder(dest) / f"{kind}.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        why = _broken(data, kind)
    except (OSError, ValueError) as e:  # JSONDecodeError、UnicodeDecodeError 都是 ValueError
        why = f"不是有效的 JSON（{e}）" if isinstance(e, ValueError) else f"读不出来（{e}）"
    if why is not None:
        if unreadable is not None:
            unreadable.append(f"{dest.name} 的 {kind} 记录读不了，当作没有：{path}：{why}")
        return None
    data["stale"] = data.get("digest") != code_digest(dest)
    return data


def write_check(dest: Path, chapter: int, results: dict[str, dict], selection: str) -> Path:
    """check 跑完一个读者目录后调用。results 是 tests/harness/progress.py 写的 {node id: {outcome, reason}}，
    selection 说这次跑了哪些（"all"、"own"、"task 2"）。"""
    return _write(dest, "check", {"chapter": chapter, "selection": selection, "results": results})


def read_check(dest: Path, unreadable: list[str] | None = None) -> dict | None:
    return _read(dest, "check", unreadable)


def write_start(dest: Path, chapter: int, info: dict) -> Path:
    """start 写出工作目录后调用：info 说它从哪里长出来（比如 {"from": 上一章的目录或 None}）。"""
    return _write(dest, "start", {"chapter": chapter, **info})


def read_start(dest: Path, unreadable: list[str] | None = None) -> dict | None:
    return _read(dest, "start", unreadable)


def task_summary(results: dict[str, dict], chapter: int) -> list[tuple[Task, int, int, int, str]]:
    """本章每个任务：(任务, 通过的测试数, 没通过的测试数, 跳过的测试数, 第一个没通过的测试 "名字：原因" 或 "")。
    给定代码自己的测试、真权重一档（tests/real/）不算进任何任务（和 check 的进度表一样，
    tools/workbench/task_table.py）。"""
    tasks = load_tasks().get(chapter, [])
    rows = {t.number: [t, 0, 0, 0, ""] for t in tasks}
    for nodeid, r in results.items():
        task = task_of_test({chapter: tasks}, nodeid, chapter) if chapter_of_test(nodeid, chapter) == chapter else None
        if task is None or is_given_test(chapter, nodeid) or nodeid.startswith("tests/real/"):
            continue
        row = rows[task.number]
        i = {"passed": 1, "skipped": 3}.get(r["outcome"], 2)
        row[i] += 1
        if i == 2 and not row[4]:
            row[4] = f"{nodeid.split('::')[-1]}：{r['reason']}"
    return [tuple(r) for r in rows.values()]


def first_failure(results: dict[str, dict], chapter: int) -> str | None:
    """一行说清楚第一个没过的：收集错误（测试文件都没能导入）优先，其次按任务号，最后真权重一档。全部通过时 None。"""
    for nodeid, r in results.items():
        if r["outcome"] == "error":
            return f"收集错误：{nodeid}：{r['reason']}"
    for task, ok, bad, skipped, first in task_summary(results, chapter):
        if first:
            return f"{task.label}（{task.title}）没通过：{first}"
        if ok + bad + skipped == 0:
            return f"{task.label}（{task.title}）没有跑到测试"
    for nodeid, r in results.items():
        if nodeid.startswith("tests/real/") and r["outcome"] == "failed":
            return f"真权重一档没通过：{nodeid.split('::')[-1]}：{r['reason']}"
    return None


def _cols(s: str) -> int:
    import unicodedata

    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in s)


def _chapter(dest: Path, check: dict | None, start: dict | None) -> int | None:
    import re

    for rec in (check, start):
        if rec:
            return rec["chapter"]
    m = re.fullmatch(r"my_ch(\d+)", dest.name)
    return int(m.group(1)) if m else None


def progress_report(dirs: list[Path], shown=lambda p: str(p)) -> str:
    """python course.py progress 的表：每个目录一行——第几章、通过了几个任务（每个任务通过的测试/测试数）、
    从哪里长出来、记录是不是比代码旧。只读记录，不跑测试。"""
    if not dirs:
        return "还没有 my_ch* 目录：从 python course.py start ch1 开始"
    chapters: dict[str, int | None] = {}
    rows = [["目录", "章", "任务", "各任务（通过/测试）", "起点", "备注"]]
    unreadable: list[str] = []  # 读不了的记录：表照样列出来，表下每个一行
    for dest in dirs:
        check, start = read_check(dest, unreadable), read_start(dest, unreadable)
        ch = _chapter(dest, check, start)
        chapters[str(dest.resolve())] = ch
        tag = f"ch{ch}" if ch else "chN"
        redo = f"python course.py check {shown(dest)} --as {tag}"
        tasks, each, notes = "—", "", []
        if check is None:
            notes.append(f"还没有 check 的记录：{redo}")
        else:
            summary = task_summary(check["results"], check["chapter"])
            done = sum(1 for _, ok, bad, skip, _ in summary if bad == 0 and ok + skip > 0)
            tasks = f"{'✓' if done == len(summary) else '✗'} {done}/{len(summary)}"
            if check["selection"].startswith("task"):  # --task K 只跑了一个任务：别的任务没有结果，不算没通过
                summary = [row for row in summary if f"task {row[0].number}" == check["selection"]]
                tasks = "—"
            each = "  ".join(f"{t.number}:{ok}/{ok + bad + skip}" + (f"（{skip} 跳过）" if skip else "")
                             for t, ok, bad, skip, _ in summary)
            regress = sum(1 for n, r in check["results"].items() if r["outcome"] in ("failed", "error")
                          and chapter_of_test(n, check["chapter"]) != check["chapter"])
            if regress:
                notes.append(f"前面各章的测试（回归）有 {regress} 个没过")
            real = sum(1 for n, r in check["results"].items()
                       if n.startswith("tests/real/") and r["outcome"] == "failed")
            if real:
                notes.append(f"真权重一档有 {real} 个没过")
            if check["selection"].startswith("task"):
                notes.append(f"上次只跑了任务 {check['selection'].split()[-1]}")
            if check["stale"]:
                notes.append(f"check 之后代码改过，记录比代码旧：{redo}")
        if start is None:
            origin = "没有 start 的记录"
        elif start.get("from") is None:
            names = {c.chapter: c.name for c in load_manifest()}
            origin = f"本书的 {names[ch - 1]}" if ch and ch - 1 in names else "本书"
        else:
            src = Path(start["from"])
            prev = chapters.get(str(src), _chapter(src, read_check(src), read_start(src)))
            origin = f"--from {src.name}" + ("（--force，没检查）" if start.get("forced") else "")
            if ch is not None and prev is not None and prev != ch - 1:
                origin += f"（它是第 {prev} 章，不是上一章）"
        rows.append([dest.name, str(ch if ch is not None else "?"), tasks, each, origin, "；".join(notes)])
    widths = [max(_cols(r[i]) for r in rows) for i in range(len(rows[0]))]
    table = ["  ".join(c + " " * (w - _cols(c)) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(table + [f"注意：{line}" for line in dict.fromkeys(unreadable)])
