"""报错只有一个来源：tests/chN/errors.toml（tools/book/error_cases.py）。
测试经 tests/harness/errors.py 查它，页面渲染它。

- 章节测试不自己查异常类型或报错消息：没有 pytest.raises（测试自己定义的异常除外）、isinstance(…, XxxError)，
  也没有拿字面片段去比对报错（str(e.value)、stderr、msg……）；给定代码自己的测试（tasks.toml 的 given_tests）除外；
- 测试点名的每一条都在清单里，清单里的每一条都有测试点名，而且都渲染在那一章页面的报错表里；
- 清单本身说得通：占位符都有页面上的词，任务号存在，异常是真的异常类；
- 查报错的帮手失败时说清楚期望的是什么（类型不对、没抛、缺哪个片段），这些检查自己也能失败。
"""

from __future__ import annotations

import ast
import builtins
import re
import subprocess
from pathlib import Path

import pytest

from tools.book import error_cases
from tools.manifest import ROOT, given_test_patterns, is_given_test, load_tasks

HELPERS = ("expect_error", "expect_exit", "check_error")
ERROR_TEXT = re.compile(r"stderr|\.value\b|\bstr\(e|\bmsg\b|\berr\b|\berror\b|\bmessage\b|\breason\b")


def chapter_test_files() -> list[Path]:
    return sorted(p for folder in error_cases.folders() for p in (ROOT / "tests" / folder).glob("test_*.py"))


def _given(path: Path, func: str) -> bool:
    folder = path.parent.name
    return folder != "checkpoint" and is_given_test(error_cases.chapter_of(folder),
                                                    f"{path.relative_to(ROOT).as_posix()}::{func}")


def violations(source: str, path: str = "<test>", given=lambda func: False) -> list[str]:
    """测试源码里自己查异常类型、报错消息的地方（应当经过 tests/harness/errors.py）。"""
    tree = ast.parse(source)
    local_classes = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    out = []
    for fn in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
        if given(fn.name):
            continue
        for node in ast.walk(fn):
            where = f"{path}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("pytest.raises", "raises"):
                names = {ast.unparse(a) for a in ast.walk(node.args[0]) if isinstance(a, (ast.Name, ast.Attribute))} \
                    if node.args else set()
                if not names or not names <= local_classes or node.keywords:
                    out.append(f"{where}: {ast.unparse(node)}（用 expect_error）")
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "isinstance" and len(node.args) == 2 \
                    and re.search(r"Error|Exception", ast.unparse(node.args[1])):
                out.append(f"{where}: {ast.unparse(node)}（用 check_error）")
            if isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) \
                    and isinstance(node.left, (ast.Constant, ast.JoinedStr)) \
                    and ERROR_TEXT.search(ast.unparse(node.comparators[0])):
                out.append(f"{where}: {ast.unparse(node)}（报错片段写进 errors.toml）")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in ("startswith", "endswith") \
                    and ERROR_TEXT.search(ast.unparse(node.func.value)):
                out.append(f"{where}: {ast.unparse(node)}（报错片段写进 errors.toml）")
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("re.search", "re.match", "re.fullmatch") \
                    and any(ERROR_TEXT.search(ast.unparse(a)) for a in node.args[1:]):
                out.append(f"{where}: {ast.unparse(node)}（报错片段写进 errors.toml）")
    return out


def named_ids(source: str) -> set[str]:
    """源码里点名的报错 id：helper 的第一个参数，以及任何形如 "chN/名字" 的字符串常量（参数化、表格里的）。"""
    ids = set()
    pattern = re.compile(rf"(?:{'|'.join(error_cases.folders())})/\w+")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and pattern.fullmatch(node.value):
            ids.add(node.value)
    return ids


def all_cases() -> dict[str, error_cases.Case]:
    return {k: v for folder in error_cases.folders() for k, v in error_cases.load(folder).items()}


def test_chapter_tests_check_errors_only_through_the_data():
    bad = []
    for p in chapter_test_files():
        rel = p.relative_to(ROOT).as_posix()
        bad += violations(p.read_text(encoding="utf-8"), rel, lambda func, p=p: _given(p, func))
    assert not bad, "这些测试自己查异常或报错消息（该写进 tests/chN/errors.toml，经 tests/harness/errors.py 查）：\n" \
        + "\n".join(bad)


def test_every_named_case_exists_and_every_case_is_tested():
    cases = all_cases()
    named: dict[str, list[str]] = {}
    for p in sorted((ROOT / "tests").rglob("*.py")):
        if "repo" in p.relative_to(ROOT).parts:  # 只看仓库里面的路径：克隆放在 ~/repo/ 下也一样
            continue
        for case_id in named_ids(p.read_text(encoding="utf-8")):
            named.setdefault(case_id, []).append(p.relative_to(ROOT).as_posix())
    unknown = {k: v for k, v in named.items() if k not in cases}
    assert not unknown, f"测试点名了清单里没有的报错：{unknown}"
    untested = sorted(set(cases) - set(named))
    assert not untested, f"清单里这些报错没有测试点名（页面上写着、却没人查）：{untested}"


@pytest.mark.parametrize("folder", error_cases.folders())
def test_data_is_well_formed(folder):
    tasks = {t.number for t in load_tasks().get(error_cases.chapter_of(folder), [])}
    for c in error_cases.load(folder).values():
        assert c.task in tasks or c.task == 0 and given_test_patterns(c.chapter), f"{c.id}：没有任务 {c.task}"
        for name in c.raises:
            cls = getattr(builtins, name, None)
            assert isinstance(cls, type) and issubclass(cls, BaseException), f"{c.id}：{name} 不是内置的异常类"
        for frag in (*c.message, *c.absent):
            for p in error_cases.PLACEHOLDER.findall(frag):
                assert p in c.echo, f"{c.id}：占位符 {{{p}}} 在 [echo] 里没有页面上的词"
        assert c.message or c.raises != (error_cases.EXIT,), f"{c.id}：命令行的报错至少要说出一个片段"


MARKER = re.compile(r"\{\{\s*errors\(\"(\w+)\"(?:,\s*(\d+))?\)\s*\}\}")


def page_of(folder: str) -> Path:
    return ROOT / "docs" / ("testing.md" if folder == "checkpoint" else f"{folder}.md")


@pytest.mark.parametrize("folder", error_cases.folders())
def test_every_case_is_rendered_on_its_page(folder):
    """页面上的 {{ errors("chN", K) }} 覆盖清单里每个任务（task 0 是给定的代码）；渲染出来每一条都在。"""
    page = page_of(folder).read_text(encoding="utf-8")
    marked = {(m.group(1), int(m.group(2)) if m.group(2) else None) for m in MARKER.finditer(page)}
    for c in error_cases.load(folder).values():
        assert (folder, c.task) in marked or (folder, None) in marked, \
            f"{page_of(folder).name} 没有渲染任务 {c.task} 的报错表（{{{{ errors(\"{folder}\", {c.task}) }}}}）：{c.id}"
    for _, task in marked:
        assert error_cases.render_table(folder, task).count("\n") >= 2  # 标记的任务真有报错：没有时 render_table 报错


def test_a_chapter_page_read_raw_says_where_each_table_is():
    """在代码托管网站、编辑器里读 docs/chN.md 的人只看得到 {{ errors(…) }}：紧跟的下一行说表在构建好的书里、
    怎么打开（mkdocs serve、这一页的地址）。构建时那一行和占位符一起换成表，书里不出现。"""
    from tools.book.mkdocs_hooks import render_errors

    for page in sorted((ROOT / "docs").glob("ch*.md")):
        lines = page.read_text(encoding="utf-8").splitlines()
        marks = [(i, m) for i, line in enumerate(lines) if (m := MARKER.search(line))]
        assert marks, f"{page.name} 没有报错表"
        for i, m in marks:
            note = error_cases.source_note(m.group(1), page.stem, int(m.group(2)) if m.group(2) else None)
            assert lines[i + 1:i + 2] == [note], f"{page.name}:{i + 2} 要是这一行：{note}"
            assert "mkdocs serve" in note and f"/{page.stem}/" in note
            target = page.parent / note.split("](", 1)[1].split(")", 1)[0].split("#")[0]
            assert target.resolve() == error_cases.tables_file(m.group(1)), note
        rendered = render_errors("\n".join(lines))
        assert not MARKER.search(rendered) and error_cases.SOURCE_NOTE not in rendered, page.name
        assert rendered.count("| 情形 | 异常 | 消息里要有 |") == len(marks), page.name


@pytest.mark.parametrize("folder", error_cases.folders())
def test_the_committed_tables_match_the_lists(folder):
    """tests/<folder>/errors.md（读原文件的人看的表）和清单一致；过时了就重写：python -m tools.book.error_cases。"""
    path = error_cases.tables_file(folder)
    assert path.is_file() and path.read_text(encoding="utf-8") == error_cases.render_file(folder), \
        f"{path.relative_to(ROOT)} 和 tests/{folder}/errors.toml 不一致：运行 python -m tools.book.error_cases 重写"
    for c in error_cases.load(folder).values():
        assert c.when.replace("|", "\\|") in path.read_text(encoding="utf-8"), c.id


# ---------------------------------------------------------------- 自检：这些检查能失败

def test_the_scan_catches_raises_and_fragments():
    src = '''
class Boom(Exception):
    pass

def test_x(res):
    with pytest.raises(ValueError, match="x"):
        f()
    with pytest.raises(Boom):
        g()
    assert "vocab_size=" in str(e.value)
    assert "Traceback" not in res.stderr
    assert msg.startswith("错误：")
    assert isinstance(err, KeyError)
    assert "Paris" in out_text
'''
    found = violations(src)
    assert len(found) == 5, found  # Boom 是测试自己的异常；"Paris" in out_text 不是报错
    assert any("pytest.raises(ValueError" in f for f in found)


def test_helper_says_what_was_expected():
    from tests.harness.errors import ErrorCaseFailure, expect_error

    def failure(fn, **values) -> str:
        with pytest.raises(ErrorCaseFailure) as e:
            with expect_error("ch1/sampling_param", **values):
                fn()
        return str(e.value)

    values = dict(field="top_k", value="0")

    def raise_(exc):
        raise exc

    assert failure(lambda: raise_(KeyError("x")), **values) == \
        "期望 ValueError（match='SamplingParams.top_k=0'），得到 KeyError: 'x'"
    assert failure(lambda: None, **values) == "期望 ValueError（match='SamplingParams.top_k=0'），没有抛出异常"
    assert failure(lambda: raise_(ValueError("top_k 不对")), **values).startswith(
        "ValueError 的消息里没有 'SamplingParams.top_k=0'：top_k 不对")
    with pytest.raises(NotImplementedError, match="第 1 章 · 任务 1"):  # 桩原样抛出：进度表写的是桩的任务号
        with expect_error("ch1/sampling_param", **values):
            raise NotImplementedError("第 1 章 · 任务 1：SamplingParams")


def test_cli_helper_checks_the_last_line():
    from tests.harness.errors import ErrorCaseFailure, expect_exit

    def res(code, err):
        return subprocess.CompletedProcess([], code, "", err)

    assert expect_exit("ch4/pool_too_small", res(1, "warning\n错误：页用完了（--num-pages）\n")).startswith("错误：")
    traceback = "Traceback (most recent call last):\nValueError: x"
    bad_runs = [(res(0, ""), "却正常退出"), (res(1, traceback), "Traceback"),
                (res(1, "页用完了（--num-pages）"), "不以 '错误：' 开头"),
                (res(1, "错误：页用完了"), "没有 '--num-pages'")]
    for bad, why in bad_runs:
        with pytest.raises(ErrorCaseFailure, match=why):
            expect_exit("ch4/pool_too_small", bad)


def test_tests_of_a_case_belong_to_its_task():
    """查第 N 章任务 K 那一条报错的测试归任务 K（tests/tasks.toml）：check --task K 跑的正是页面上任务 K 的报错表。"""
    from tools.manifest import match

    tasks, wrong = load_tasks(), []
    for folder in error_cases.folders():
        chapter, cases = error_cases.chapter_of(folder), error_cases.load(folder)
        for f in sorted((ROOT / "tests" / folder).glob("test_*.py")):
            tree = ast.parse(f.read_text(encoding="utf-8"))
            tables = {t.id: named_ids(ast.unparse(node)) for node in tree.body if isinstance(node, ast.Assign)
                      for t in node.targets if isinstance(t, ast.Name)}  # 模块级的表（比如 CASES）
            for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")):
                ids = named_ids(ast.unparse(fn))
                ids |= {i for n in ast.walk(fn) if isinstance(n, ast.Name) for i in tables.get(n.id, ())}
                nodeid = f"{f.relative_to(ROOT).as_posix()}::{fn.name}"
                hits = match(tasks.get(chapter, []), nodeid, "tests")
                for case_id in sorted(i for i in ids if i in cases and cases[i].task):
                    if [t.number for t in hits] != [cases[case_id].task]:
                        got = [t.number for t in hits]
                        wrong.append(f"{nodeid}（任务 {got}）查 {case_id}（任务 {cases[case_id].task}）")
    assert not wrong, "这些测试归的任务和它查的报错不是同一个（改测试名 test_taskK_… 或 tests/tasks.toml）：\n" + \
        "\n".join(wrong)
