"""按任务归类测试结果：tests/tasks.toml 的读法（Task、match）在 tools/manifest.py，这里是测试结果的归类和
run_tests 打印的进度表。两个任务打平就是清单写得有歧义（tests/repo/test_workbench.py 会报出来）。
"""

from __future__ import annotations

import re

from tools.manifest import Task, is_given_test, load_tasks, match


def chapter_of_test(nodeid: str, chapter: int) -> int:
    """tests/chM/ 下的测试归第 M 章（在第 N 章的目录上是回归）；tests/checkpoint、tests/real 归所测的这一章。"""
    m = re.match(r"tests/ch(\d+)/", nodeid)
    return int(m.group(1)) if m else chapter


def task_of_test(all_tasks: dict[int, list[Task]], nodeid: str, chapter: int) -> Task | None:
    hits = match(all_tasks.get(chapter_of_test(nodeid, chapter), []), nodeid.split("[")[0], "tests")
    return hits[0] if len(hits) == 1 else None


def _width(s: str) -> int:
    import unicodedata

    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in s)


def _pad(s: str, n: int) -> str:
    return s + " " * max(0, n - _width(s))


def progress_table(results: dict[str, dict], chapter: int, reason_chars: int = 110,
                   only_task: int | None = None) -> tuple[str, bool]:
    """results 是 tests/harness/progress.py 写的 {node id: {outcome, reason}}。返回（按任务的进度表, 是否全部通过）。

    本章每个任务一行（只数"本章的任务"那一份跑的测试：各行加起来就是它的个数）；给定代码自己的测试
    （tests/tasks.toml 的 given_tests）一行、真权重一档（tests/real/，在 tasks.toml 里归某个任务，
    --task K --real 才跑到它）一行，排在任务之后；前面各章的测试（回归）每章一行；
    归不到任务的测试和收集错误单独成行，也算失败。
    only_task（check 的 --task K）：只列这个任务，别的任务没跑，不算"没有测试"。
    """
    all_tasks = load_tasks()
    rows: dict[str, dict] = {}
    mine = [t for t in all_tasks.get(chapter, []) if only_task is None or t.number == only_task]
    order = [t.label for t in mine]
    for t in mine:
        rows[t.label] = {"title": f"任务 {t.number} · {t.title}", "n": 0, "ok": 0, "skip": 0, "first": ""}
    for nodeid, r in results.items():
        task = None
        if r["outcome"] == "error":
            key, title = "收集错误", "收集错误（测试文件都没能导入）"
        else:
            ch = chapter_of_test(nodeid, chapter)
            task = task_of_test(all_tasks, nodeid, chapter)
            if task is None:
                key, title = "未归类", "未归类的测试（tests/tasks.toml 里没有任务管它）"
            elif ch == chapter and is_given_test(chapter, nodeid):
                key, title, task = "给定", "给定代码自己的测试（不是你要写的）", None
            elif nodeid.startswith("tests/real/"):
                key, title = "真权重", "真权重一档（真模型上和 HF 对齐，不算在上面的任务里）"
            elif ch != chapter:
                key, title = f"第 {ch} 章", f"第 {ch} 章的测试（回归）"
            else:
                key, title = task.label, ""
        row = rows.setdefault(key, {"title": title, "n": 0, "ok": 0, "skip": 0, "first": ""})
        if key not in order:
            order.append(key)
        row["n"] += 1
        row["ok"] += r["outcome"] == "passed"
        row["skip"] += r["outcome"] == "skipped"
        # 第一个没通过的测试；优先挑原因就是本任务的桩的那个（别的任务的桩挡在前面时，先写那个任务）
        own = task is not None and f"{task.label}：" in r["reason"] if r["outcome"] != "error" else False
        if r["outcome"] in ("failed", "error") and (not row["first"] or (own and not row.get("own"))):
            reason = r["reason"] if len(r["reason"]) <= reason_chars else r["reason"][:reason_chars] + "…"
            row["first"], row["own"] = f"{nodeid.split('/')[-1]}：{reason}", own
    # 本章的任务、给定代码的、真权重一档、回归、归不了类的
    order.sort(key=lambda k: 4 if k in ("未归类", "收集错误") else 3 if k.startswith("第") and "任务" not in k
               else 2 if k == "真权重" else 1 if k == "给定" else 0)
    width = max(_width(rows[k]["title"]) for k in order) + 2 if order else 10
    lines = [_pad("任务", width + 2) + _pad("通过", 12) + "第一个没通过的测试：原因"]
    ok_all = bool(order)
    for k in order:
        r = rows[k]
        bad = r["n"] - r["ok"] - r["skip"]
        ok_all &= bad == 0 and r["n"] > 0
        count = f"{r['ok']}/{r['n']}" + (f"（{r['skip']} 跳过）" if r["skip"] else "")
        mark = "✓ " if bad == 0 and r["n"] > 0 else "✗ "
        first = r["first"] or ("没有测试" if not r["n"] else "")
        lines.append(mark + _pad(r["title"], width) + _pad(count, 12) + first)
    return "\n".join(lines), ok_all
