"""桩跟着页面走（python course.py start 写出的桩 = 页面上各任务点了名的符号）：

- tests/tasks.toml 没有兜底的符号模式 "*"：桩只来自任务点了名的文件和符号；
- 给定的文件（tasks.toml 的 given）整份复制、一个桩也没有，页面的「任务」一节写着它们；
- 每一章每个桩的名字都写在它那个任务的正文里，桩的任务号就是那个任务；页面写出的签名用的是桩的参数名；
- 报错表里写成签名的桩归那一条报错的任务（比如第 3 章任务 2 的 create_model）；
- 第 6 章每个有桩的任务：只把这一个任务写成桩、其余放参考文件，这个任务的第一个测试失败，原因写着这个任务。
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tools.manifest import load_manifest
from tools.manifest import load_tasks
from tools.workbench import stubs, workspace
from tools.manifest import given_patterns, is_given

ROOT = Path(__file__).resolve().parents[2]
CHECKPOINTS = load_manifest()
CH6 = next(c for c in CHECKPOINTS if c.chapter == 6)


def _page(chapter: int) -> str:
    return (ROOT / "docs" / ("step0.md" if chapter == 0 else f"ch{chapter}.md")).read_text(encoding="utf-8")


def _task_section(chapter: int) -> str:
    m = re.search(r"^## 任务\n(.*?)(?=^## |\Z)", _page(chapter), re.M | re.S)
    assert m, f"第 {chapter} 章的页面没有「任务」一节"
    return m.group(1)


def _task_texts(chapter: int) -> dict[int, str]:
    """任务号 -> 这个任务的小标题和正文（到下一个三级标题为止）。"""
    return {int(m.group(1)): m.group(0)
            for m in re.finditer(r"^### 任务 (\d+) · .*?(?=^### |\Z)", _task_section(chapter), re.M | re.S)}


def _name(qualname: str) -> str:
    """页面上该写出的名字：方法写方法名；__init__、__post_init__ 写类名。"""
    parts = qualname.split(".")
    return parts[-2] if parts[-1] in ("__init__", "__post_init__") else parts[-1]


def _mentions(text: str, name: str) -> bool:
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", text) is not None


def unnamed_stubs(ck, texts: dict[int, str]) -> list[str]:
    return [f"{s.key}（任务 {s.task.number if s.task else '?'}）" for s in stubs.find_stubs(ck)
            if s.task is None or not _mentions(texts.get(s.task.number, ""), _name(s.qualname))]


def test_tasks_toml_has_no_catch_all_symbol():
    for chapter, tasks in load_tasks().items():
        for t in tasks:
            assert "*" not in t.symbols, f"{t.label} 的 symbols 有兜底的 \"*\"：写出具体的文件和符号"


@pytest.mark.parametrize("ck", CHECKPOINTS, ids=lambda c: c.name)
def test_given_files_hold_no_stub_and_are_on_the_page(ck, tmp_path):
    given = [rel for rel in stubs.changes(ck) if is_given(ck.chapter, rel)]
    assert not [s.key for s in stubs.find_stubs(ck) if is_given(ck.chapter, s.file)]
    section = _task_section(ck.chapter)
    for pattern in given_patterns(ck.chapter):
        assert any(is_given(ck.chapter, rel) for rel in stubs.changes(ck)), f"given 的 {pattern} 一个文件也没选到"
        named = pattern.rstrip("*")
        assert f"`{named}`" in section, \
            f"第 {ck.chapter} 章页面的「任务」一节要写出给定的 `{named}`（做什么、书里哪里讲）"
    if not given:
        return
    ws = tmp_path / "ws"
    workspace.make_workspace(ck, ws)
    for rel in given:
        if (ck.path / rel).exists():
            assert (ws / rel).read_bytes() == (ck.path / rel).read_bytes(), f"给定的 {rel} 没有整份复制"
            assert b"NotImplementedError(" not in (ws / rel).read_bytes() or \
                b"NotImplementedError(" in (ck.path / rel).read_bytes(), f"给定的 {rel} 里有桩"


def misplaced_stubs(ck, texts: dict[int, str]) -> list[str]:
    """桩的任务号（它的 NotImplementedError 写的）必须是页面上点了它名字的那个「### 任务 K」之一。"""
    out = []
    for s in stubs.find_stubs(ck):
        named = sorted(k for k, t in texts.items() if _mentions(t, _name(s.qualname)))
        if s.task is None or s.task.number not in named:
            label = s.task.number if s.task else "?"
            out.append(f"{s.key}：桩写的是任务 {label}，页面上点名它的是任务 {named or '（没有）'}")
    return out


@pytest.mark.parametrize("ck", CHECKPOINTS, ids=lambda c: c.name)
def test_every_stub_is_named_in_its_own_task(ck):
    bad = misplaced_stubs(ck, _task_texts(ck.chapter))
    page = "step0.md" if ck.chapter == 0 else f"ch{ck.chapter}.md"
    assert not bad, f"docs/{page} 的任务正文和桩对不上（tests/tasks.toml 的 symbols 或页面）：\n" + "\n".join(bad)


def test_the_page_check_catches_a_missing_name():
    """自检：把任务 2 的正文里的 check_batch 去掉，上面的检查必须报出它。"""
    texts = _task_texts(6)
    key = "minisgl/engine/engine.py:Engine.check_batch"
    assert not [m for m in misplaced_stubs(CH6, texts) if m.startswith(key)]
    texts[2] = texts[2].replace("check_batch", "check_it")
    assert [m for m in misplaced_stubs(CH6, texts) if m.startswith(key)]


_FENCE = re.compile(r"^```.*?^```", re.M | re.S)
_CALL = re.compile(r"(?<![\w.])((?:[A-Za-z_]\w*\.)*)([A-Za-z_]\w*)\(([^()]*)\)")


def page_signatures(text: str):
    """页面行内代码里写成 名字(参数, …) 的签名：(限定前缀, 名字, 参数名)。参数得都是标识符（可带 = 默认值、: 类型）
    才算签名；名字()、f(x.y) 这样的是调用或提及，不算。代码块（```）里的是代码，不算。"""
    for span in re.findall(r"`([^`\n]+)`", _FENCE.sub("", text)):
        for m in _CALL.finditer(span):
            prefix, name, args = m.groups()
            names = [a.split("=")[0].split(":")[0].strip() for a in args.split(",")] if args.strip() else []
            names = [n for n in names if n not in ("*", "…", "...")]
            if names and all(re.fullmatch(r"\*{0,2}[A-Za-z_]\w*", n) for n in names):
                yield prefix.rstrip("."), name, [n.lstrip("*") for n in names]


def _params(node) -> tuple[list[str], list[str]]:
    """(按位置的参数名（去掉 self/cls）, 没有默认值的那些) 加上仅限关键字的参数名。"""
    a = node.args
    names = [x.arg for x in a.posonlyargs + a.args]
    names = names[1:] if names[:1] in (["self"], ["cls"]) else names
    required = names[:len(names) - len(a.defaults)]
    return names + [x.arg for x in a.kwonlyargs], required


def signature_mismatches(ck, section: str) -> list[str]:
    by_name: dict[str, list] = {}
    for s in stubs.find_stubs(ck):
        parts = s.qualname.split(".")
        by_name.setdefault(parts[-2] if parts[-1] == "__init__" else parts[-1], []).append(s)
    out = []
    for prefix, name, names in page_signatures(section):
        found = by_name.get(name, [])
        if prefix:  # Class.method(...)：只比那个类的；obj.method(...) 的 obj 不是桩的类（ctx、engine……）就不比
            found = [s for s in found if s.qualname.split(".")[0] == prefix.split(".")[-1]]
        if not found:
            continue
        ok = any(names == params[:len(names)] and set(required) <= set(names)
                 for params, required in (_params(s.node) for s in found))
        if not ok:
            want = "；".join(f"{s.qualname}({', '.join(_params(s.node)[0])})" for s in found)
            out.append(f"页面写 {name}({', '.join(names)})，桩是 {want}")
    return out


@pytest.mark.parametrize("ck", CHECKPOINTS, ids=lambda c: c.name)
def test_page_signatures_use_the_stubs_parameter_names(ck):
    """「任务」一节的正文，加上构建时渲染进去的报错表（tests/chN/errors.toml 的"情形"）。"""
    from tools.book import error_cases

    folder = f"ch{ck.chapter}" if ck.chapter else "checkpoint"
    tables = "\n".join(c.when for c in error_cases.load(folder).values())
    bad = signature_mismatches(ck, _task_section(ck.chapter) + "\n" + tables)
    assert not bad, "页面「任务」一节写的签名和桩的参数名不一样：\n" + "\n".join(bad)


def stubs_off_their_error_table(ck) -> list[str]:
    """报错表（tests/chN/errors.toml 的"情形"）里写成签名的桩，归那一条报错的任务：页面在那个任务里教它、查它的测试
    归那个任务（test_error_cases.py），check --task K 跑的就是它，桩的 NotImplementedError 也要写任务 K。"""
    from tools.book import error_cases

    folder = f"ch{ck.chapter}" if ck.chapter else "checkpoint"
    out = []
    for c in error_cases.load(folder).values():
        for prefix, name, _ in page_signatures(c.when):
            named = [s for s in stubs.find_stubs(ck) if _name(s.qualname) == name
                     and (not prefix or s.qualname.split(".")[0] == prefix.split(".")[-1])]
            out += [f"{s.key}：桩写的是任务 {s.task.number if s.task else '?'}，报错表 {c.id} 是任务 {c.task}"
                    for s in named if s.task is None or s.task.number != c.task]
    return out


@pytest.mark.parametrize("ck", CHECKPOINTS, ids=lambda c: c.name)
def test_a_stub_named_in_an_error_table_belongs_to_that_task(ck):
    bad = stubs_off_their_error_table(ck)
    assert not bad, "桩的任务号和页面上点名它的报错表不是同一个任务（tests/tasks.toml 的 symbols）：\n" + "\n".join(bad)


def test_the_signature_check_catches_a_renamed_parameter():
    """自检：第 6 章的 TableManager.free 的参数是 slot；页面写成 free(row) 就要报。"""
    assert signature_mismatches(CH6, "`free(slot)` 收回") == []
    assert signature_mismatches(CH6, "`free(row)` 收回")


def _first_test_of(task: int) -> tuple[str, str]:
    for f in sorted((ROOT / "tests" / "ch6").glob("test_*.py")):
        for node in ast.parse(f.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith(f"test_task{task}_"):
                return f.relative_to(ROOT).as_posix(), node.name
    raise AssertionError(f"第 6 章任务 {task} 没有 test_task{task}_ 测试")


STUBBED_TASKS = sorted({s.task.number for s in stubs.find_stubs(CH6) if s.task})


@pytest.mark.parametrize("task", STUBBED_TASKS, ids=lambda n: f"task{n}")
def test_chapter6_each_task_alone_fails_with_its_name(task, tmp_path):
    """参考目录里只有这一个任务是桩：它的第一个测试失败，原因是写着这个任务号的 NotImplementedError。"""
    ws = tmp_path / "my_ch6"
    made = workspace.make_workspace(CH6, ws)
    for rel in {s.file for s in made}:  # 别的任务放回参考代码，只留这个任务的桩
        mine = [s for s in made if s.file == rel and s.task.number == task]
        src = (CH6.path / rel).read_text(encoding="utf-8")
        (ws / rel).write_text(stubs.stub_source(src, mine, "ch5_attention"), encoding="utf-8")
    probe_file, name = _first_test_of(task)
    out = tmp_path / "progress.json"
    env = dict(os.environ, MINISGL_PROGRESS=str(out), OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-m", "pytest", probe_file, "-q", "-x", "-p", "no:cacheprovider",
                          "-p", "tests.harness.progress", "--checkpoint", str(ws), "--as", "ch6", "-k", name],
                         cwd=ROOT, env=env, capture_output=True, text=True)
    results = json.loads(out.read_text()) if out.exists() else {}
    ran = {k: v for k, v in results.items() if k.startswith(f"{probe_file}::{name}")}
    assert ran, res.stdout[-3000:] + res.stderr[-2000:]
    failed = [v for v in ran.values() if v["outcome"] == "failed"]
    assert failed, f"只有任务 {task} 是桩时 {name} 没有失败"
    assert all(v["reason"].startswith(f"NotImplementedError: 第 6 章 · 任务 {task}：") for v in failed), \
        [v["reason"] for v in failed]
