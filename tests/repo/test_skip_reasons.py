"""跳过的原因是真的：一个测试说"这件事由别的测试覆盖"而跳过时，要点名那个测试（node id），点名的测试要存在。

- 跳过原因（pytest.skip、skip / skipif 的 reason）里说"覆盖"的，要写出 node id：直接写在字符串里，或者是帮手函数的
  参数插进 f-string，这时每一处调用都要给一个写着 node id 的字面量；
- 章节测试和 harness 里写出的每个 node id（tests/…/test_x.py::test_y）都真有这个文件和这个测试函数。

只读源文件（ast），不收集测试。
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NODE = re.compile(r"tests/[\w/]+\.py::\w+")
CLAIM = "覆盖"
SKIPS = {"pytest.skip", "pytest.mark.skip", "pytest.mark.skipif", "skip"}


def _sources() -> dict[str, str]:
    """tests/ 下除 repo 以外的 python 源文件（repo 的自检里有编出来的 node id）。"""
    files = sorted((ROOT / "tests").rglob("*.py"))
    return {p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8") for p in files
            if p.relative_to(ROOT).parts[1] != "repo"}


def _texts(node: ast.AST) -> list[str]:
    """字符串字面量和 f-string 里字面的部分。"""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        return [v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str)]
    return []


def exists(nodeid: str) -> bool:
    """tests/x.py::name：文件在，里面（模块级或类里）有这个测试函数。"""
    rel, name = nodeid.split("::")
    path = ROOT / rel
    if not path.is_file():
        return False
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name
               for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))))


def _reason(call: ast.Call) -> ast.AST | None:
    for kw in call.keywords:
        if kw.arg in ("reason", "msg"):
            return kw.value
    name = ast.unparse(call.func)
    if name in ("pytest.skip", "skip", "pytest.mark.skip") and call.args:
        return call.args[0]
    return None


def unproven_claims(sources: dict[str, str]) -> list[str]:
    """说"覆盖"却没点名测试的跳过原因。帮手函数把参数插进原因时，查它的每一处调用。"""
    trees = {rel: ast.parse(src) for rel, src in sources.items()}
    bad = []
    for rel, tree in trees.items():
        for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
            params = [a.arg for a in fn.args.args]
            for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call) and ast.unparse(n.func) in SKIPS):
                reason = _reason(call)
                if reason is None or not any(CLAIM in t for t in _texts(reason)):
                    continue
                if any(NODE.search(t) for t in _texts(reason)):
                    continue
                used = [v.value.id for v in getattr(reason, "values", []) if isinstance(v, ast.FormattedValue)
                        and isinstance(v.value, ast.Name) and v.value.id in params]
                if not used:
                    bad.append(f"{rel}:{call.lineno}：跳过原因说由别的测试覆盖，却没写出是哪个（node id）")
                    continue
                for where, arg in _arguments(trees, fn.name, params.index(used[0]), used[0]):
                    if arg is None or not any(NODE.search(t) for t in _texts(arg)):
                        bad.append(f"{where}：{fn.name} 的 {used[0]} 要是写着 node id 的字面量")
    return bad


def _arguments(trees: dict[str, ast.Module], func: str, index: int, name: str):
    """每一处 func(...) 调用给参数 name 的表达式（没给时是 None）。"""
    for rel, tree in trees.items():
        for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) == func):
            arg = call.args[index] if index < len(call.args) else \
                next((kw.value for kw in call.keywords if kw.arg == name), None)
            yield f"{rel}:{call.lineno}", arg


def named_tests(sources: dict[str, str]) -> dict[str, list[str]]:
    """源码的字符串里写出的 node id -> 写在哪里。"""
    out: dict[str, list[str]] = {}
    for rel, src in sources.items():
        for node in ast.walk(ast.parse(src)):
            for text in _texts(node):
                for nodeid in NODE.findall(text):
                    out.setdefault(nodeid, []).append(f"{rel}:{node.lineno}")
    return out


def test_skip_reasons_that_claim_coverage_name_the_test():
    bad = unproven_claims(_sources())
    assert not bad, "\n".join(bad)


def test_every_named_test_exists():
    named = named_tests(_sources())
    missing = {k: v for k, v in named.items() if not exists(k)}
    assert not missing, f"这些地方点名的测试不存在（改了名字、挪了文件？）：{missing}"


def test_the_checks_can_fail():
    """自检：没点名、点名给了一个变量、点名了不存在的测试，都要报出来。"""
    src = '''
import pytest

def only_before(checkpoint, covered_by):
    if checkpoint.chapter > 2:
        pytest.skip(f"第 3 章起由 {covered_by} 覆盖")

def test_a(checkpoint):
    only_before(checkpoint, "tests/ch3/test_generate_limits.py::test_the_position_limit_is_exact")

def test_b(checkpoint, name):
    only_before(checkpoint, name)

def test_c():
    pytest.skip("第 3 章起由命令行测试覆盖")

def test_d():
    pytest.skip("由 tests/ch3/test_nowhere.py::test_gone 覆盖")
'''
    bad = unproven_claims({"tests/x.py": src})
    assert len(bad) == 2 and "tests/x.py:12" in bad[0] and "tests/x.py:15" in bad[1], bad
    named = named_tests({"tests/x.py": src})
    assert [k for k in named if not exists(k)] == ["tests/ch3/test_nowhere.py::test_gone"], named
