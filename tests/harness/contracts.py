"""测试要求的契约从哪里读得到：从测试源码里静态地取出异常类型和报错必须含有的字面片段。

tests/repo/test_contracts.py 用它检查：每个片段都出现在那一章页面的「任务」一节或桩的 docstring 里，
读者不用读测试就知道要报什么。只取字面量（f-string 里的常量部分、match= 正则里的字面段），现算的部分不取。
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from tools.manifest import ROOT, is_given, load_manifest

# 断言 "X in <这些>" 才算"报错必须含有 X"：异常、子进程输出、消息变量
_MESSAGE_HINTS = ("str(", "stderr", "stdout", "msg", "message", ".value", "err", "out", "reason", "text")
_REGEX_META = re.compile(r"\\.|[.^$*+?{}\[\]|()]")


@dataclass(frozen=True)
class Contract:
    test: str  # tests/chN/file.py::test_name
    kind: str  # "exception" 或 "fragment"
    text: str  # 异常类名或字面片段


def regex_literals(pattern: str) -> list[str]:
    """match= 的正则里连续的字面段（转义的字符算字面量）；太短的（1 个字符）不算。"""
    pattern = re.sub(r"\(\?(?:[:=!]|P<\w+>|<[=!])", "(", pattern)  # (?: 之类只是分组，不是字面量
    parts, cur, i = [], "", 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            if nxt.isalnum():  # \d、\s 之类是字符类，断开
                parts.append(cur)
                cur = ""
            else:
                cur += nxt
            i += 2
            continue
        if c in "^$*+?{}[]|()":  # 没转义的 . 当字面量：match="model.norm.weight" 的本意是点
            parts.append(cur)
            cur = ""
        else:
            cur += c
        i += 1
    parts.append(cur)
    return [p.strip() for p in parts if len(p.strip()) >= 2]


def _literal_parts(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        return [v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str)]
    return []


def _exception_names(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Tuple):
        return [n for e in node.elts for n in _exception_names(e)]
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    return []


def _is_raises(call: ast.AST) -> bool:
    return isinstance(call, ast.Call) and ast.unparse(call.func) in ("pytest.raises", "raises")


def _is_exception_name(name: str) -> bool:
    return name.endswith(("Error", "Exception", "Interrupt")) or name in ("StopIteration",)


def contracts_of_function(fn: ast.FunctionDef, module_constants: set[str]) -> list[tuple[str, str]]:
    """(kind, text)：kind 是 exception（异常类名）或 fragment（报错必须含有、页面上必须写出的字面段）。

    片段里回显测试自己输入的部分（测试里别处出现的字符串常量、数字）不要求写在页面上：页面只需说"报错带上它"，
    剩下的固定部分（比如 'vocab_size=50' 里的 'vocab_size='）才要求逐字出现。"""
    found: list[tuple[str, str]] = []
    asserted: set[int] = set()
    for node in ast.walk(fn):
        if _is_raises(node) and node.args:
            found += [("exception", n) for n in _exception_names(node.args[0]) if _is_exception_name(n)]
            for kw in node.keywords:
                if kw.arg == "match":
                    asserted.update(id(n) for n in ast.walk(kw.value))
                    found += [("fragment", p) for lit in _literal_parts(kw.value) for p in regex_literals(lit)]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("startswith", "endswith") and node.args \
                and any(h in ast.unparse(node.func.value) for h in _MESSAGE_HINTS):  # err.strip().startswith("错误：")
            asserted.update(id(n) for n in ast.walk(node.args[0]))
            found += [("fragment", p) for p in _literal_parts(node.args[0])]
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.In, ast.NotIn)):
            rhs = ast.unparse(node.comparators[0])
            if any(h in rhs for h in _MESSAGE_HINTS):
                asserted.update(id(n) for n in ast.walk(node.left))
                found += [("fragment", p) for p in _literal_parts(node.left)]
    echoes = set(module_constants)
    echoes.update(n.value for n in ast.walk(fn) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                  and id(n) not in asserted and len(n.value) >= 2)
    out = []
    for kind, text in found:
        if kind == "exception":
            out.append((kind, text))
        else:
            out += [("fragment", piece) for piece in fixed_pieces(text, echoes)]
    return out


def fixed_pieces(fragment: str, echoes: set[str]) -> list[str]:
    """去掉回显（测试输入里的字符串、数字）之后剩下的固定部分；没有字母、汉字的碎片不算。"""
    for e in sorted(echoes, key=len, reverse=True):  # 只换整段的回显：'tokenizer' 不吃掉 'tokenizer.json' 的前半
        fragment = re.sub(rf"(?<![\w.]){re.escape(e)}(?![\w.])", "\x00", fragment)
    pieces = re.split(r"\x00|(?<![\w])\d+(?:\.\d+)?", fragment)
    return [p.strip() for p in pieces if len(p.strip()) >= 2 and re.search(r"[A-Za-z\u4e00-\u9fff]", p)]


def _module_patterns(tree: ast.Module) -> dict[str, str]:
    """模块级的 NAME = re.compile("...")：测试拿它去搜报错，它的字面段也是契约。"""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) \
                and ast.unparse(node.value.func) == "re.compile" and node.value.args:
            pattern = "".join(_literal_parts(node.value.args[0]))
            if pattern:
                out.update({t.id: pattern for t in node.targets if isinstance(t, ast.Name)})
    return out


def fixed_pieces_of_regex(pattern: str) -> list[str]:
    return [p for lit in regex_literals(pattern) for p in fixed_pieces(lit, set())]


def test_files(chapter: int) -> list[Path]:
    """第 N 章的测试文件：tests/chN/；命令行契约（tests/checkpoint/）归第 0 章。"""
    folder = ROOT / "tests" / (f"ch{chapter}" if chapter else "checkpoint")
    return sorted(folder.glob("test_*.py"))


def contracts(chapter: int) -> list[Contract]:
    out = []
    for f in test_files(chapter):
        tree = ast.parse(f.read_text(encoding="utf-8"))
        consts = {n.value for node in tree.body if not isinstance(node, (ast.FunctionDef, ast.ClassDef))
                  for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        patterns = _module_patterns(tree)
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                test = f"{f.relative_to(ROOT).as_posix()}::{node.name}"
                used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
                found = contracts_of_function(node, consts)
                found += [("fragment", p) for name, pat in patterns.items() if name in used
                          for p in fixed_pieces_of_regex(pat)]
                for kind, text in dict.fromkeys(found):
                    out.append(Contract(test, kind, text))
    return out


def task_text(chapter: int) -> str:
    """页面上「任务」一节（到下一个二级标题为止）；第 0 章的命令行契约写在 docs/testing.md。"""
    if chapter == 0:
        return (ROOT / "docs" / "testing.md").read_text(encoding="utf-8")
    page = (ROOT / "docs" / f"ch{chapter}.md").read_text(encoding="utf-8")
    m = re.search(r"^## 任务\n(.*?)(?=^## )", page, re.S | re.M)
    return m.group(1) if m else ""


def stub_docstrings(chapter: int) -> str:
    """这一章的桩里读者看得到的 docstring：本章改动的每个 .py 文件的模块、类、函数 docstring。"""
    ck = next(c for c in load_manifest() if c.chapter == chapter)
    files = ck.changes if chapter else [ck.entry]
    docs = []
    for rel in files:
        path = ck.path / rel
        if rel.endswith(".py") and path.exists():
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    docs.append(ast.get_docstring(node) or "")
    return "\n".join(docs)


def given_sources(chapter: int) -> str:
    """给定的文件（tasks.toml 的 given）整份复制给读者：它们的报错就写在读者手里的源码里，不必再写上页面。"""
    ck = next(c for c in load_manifest() if c.chapter == chapter)
    return "\n".join(p.read_text(encoding="utf-8") for p in sorted(ck.path.rglob("*"))
                     if p.is_file() and p.suffix in (".py", ".cpp")
                     and is_given(chapter, p.relative_to(ck.path).as_posix()))


def missing(chapter: int) -> list[Contract]:
    where = task_text(chapter) + "\n" + stub_docstrings(chapter) + "\n" + given_sources(chapter)
    return [c for c in contracts(chapter) if c.text not in where]
