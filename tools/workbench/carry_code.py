"""start chN --from DIR 的 Python 部分：把读者在 DIR 里写的函数体、自己加的定义搬进参考生成的桩文件。

tools/workbench/workspace.py 决定每个文件从哪里来；这里只处理第 N 章改的 Python 文件和给定的文件（carry）：参考里和
上一章一模一样的函数换成读者的函数体（源码原样，注释和写法都保留），读者自己加的顶层函数、类、常量、import 和
方法接上去。给定的文件里本章改了的函数用本书的新版本：读者也有这个函数时记下来，start 说出来。
记录这些的 Grown 也在这里：workspace.py 在上面用它，这里不回头 import workspace。
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

from tools.workbench.stubs import Stub, body, functions


@dataclass
class Grown:
    """grow_workspace 做了什么：start 据此告诉读者哪些是自己的、哪些来自本书。"""
    stubs: list[Stub]
    carried: list[str] = field(default_factory=list)  # "文件:限定名"：函数体来自读者的目录
    rewritten: list[str] = field(default_factory=list)  # carried 里和本书写法不同的
    missing: list[str] = field(default_factory=list)  # 读者的目录里没有，用了本书的函数体
    added: list[str] = field(default_factory=list)  # 读者自己加的顶层定义、import、方法
    from_dir: list[str] = field(default_factory=list)  # 整份来自读者目录的文件
    given: list[str] = field(default_factory=list)  # 给定的文件（本书的文件，本章没改的函数带上读者的）
    replaced: list[str] = field(default_factory=list)  # 给定的文件改了的函数：读者有，用了本书的新版本
    lost: list[str] = field(default_factory=list)  # replaced 里读者的写法和本书上一章不同的
    notes: list[str] = field(default_factory=list)  # 别的要说的：解析不了的文件、同名冲突、缺的文件


class Learner:
    """读者目录里的 Python 文件：按需解析，解析不了的记一条说明、当作没有。"""

    def __init__(self, path: Path, files: dict[str, bytes], notes: list[str]) -> None:
        self.path, self.files, self.notes = path, files, notes
        self._parsed: dict[str, tuple[list[str], ast.Module] | None] = {}

    def parsed(self, rel: str) -> tuple[list[str], ast.Module] | None:
        if rel not in self._parsed:
            self._parsed[rel] = None
            if rel in self.files:
                text = self.files[rel].decode("utf-8", errors="replace")
                try:
                    self._parsed[rel] = text.splitlines(keepends=True), ast.parse(text)
                except SyntaxError as e:
                    self.notes.append(f"{self.path.name}/{rel} 第 {e.lineno} 行有语法错误：这个文件里的函数用了本书的")
        return self._parsed[rel]

    def find(self, rel: str, qual: str, homes: list[str]):
        """限定名 qual 的函数：先找同一个文件，再找参考上一章里它所在的文件（文件搬过家），最后全目录里唯一的那个。"""
        for f in [rel, *homes]:
            hit = self._function(f, qual)
            if hit:
                return hit
        hits = [h for f in self.files if f.endswith(".py") and (h := self._function(f, qual))]
        return hits[0] if len(hits) == 1 else None

    def _function(self, rel: str, qual: str):
        p = self.parsed(rel)
        node = dict(functions(p[1])).get(qual) if p else None
        return (p[0], node) if node is not None else None


def dump(node) -> str:
    return "\n".join(ast.dump(s) for s in body(node))


def bodies(files: dict[str, bytes]) -> dict[str, dict[str, str]]:
    """限定名 -> {文件: 函数体的 AST}（参考的上一章）。"""
    out: dict[str, dict[str, str]] = {}
    for rel, data in files.items():
        if rel.endswith(".py"):
            for q, n in functions(ast.parse(data.decode())):
                out.setdefault(q, {})[rel] = dump(n)
    return out


def _region(lines: list[str], node) -> tuple[int, int] | None:
    """函数体（docstring 之后）占的行 [start, end)，0 起；往上带上紧挨着它的注释行。一行写完的函数：None。"""
    stmts = body(node)
    if not stmts or stmts[0].lineno == node.lineno:
        return None
    floor = node.body[0].end_lineno if stmts[0] is not node.body[0] else max(
        [getattr(n, "end_lineno", 0) or 0 for n in ast.walk(node.args)] + [node.lineno]
        + [node.returns.end_lineno if node.returns else 0])
    top = stmts[0].lineno - 1
    while top - 1 >= floor and lines[top - 1].strip().startswith("#"):
        top -= 1
    return top, stmts[-1].end_lineno


def _reindent(block: list[str], src: str, dst: str) -> list[str]:
    if src == dst:
        return block
    return [dst + line[len(src):] if line.startswith(src) else line for line in block]


def _indent(line: str) -> str:
    return line[:len(line) - len(line.lstrip())]


def carry(text: str, rel: str, stubbed: set[str], old: dict, ref_prev: dict[str, bytes], learner: Learner,
           g: Grown, given: bool = False) -> str:
    """在桩文件 text 上：和参考上一章一样的函数换成读者的函数体，再加上读者自己加的定义。
    given：text 是给定的文件（没有桩），它改了的函数读者也有时记进 g.replaced。"""
    lines = text.splitlines(keepends=True)
    tree = ast.parse(text)
    # (start, end, 新的行, 先后)：替换 lines[start:end]；同一处插入几段时，先后大的先插（所以落在后面）
    edits: list[tuple[int, int, list[str], int]] = []
    used: set[str] = set()  # 带过来的代码用到的名字：决定带哪些 import
    for qual, node in functions(tree):
        same = [f for f, d in old.get(qual, {}).items() if d == dump(node)]
        if given and not same and rel in old.get(qual, {}):
            _replaced(rel, qual, old[qual][rel], learner, g)
        if qual in stubbed or not same or _region(lines, node) is None:
            continue
        hit = learner.find(rel, qual, same)
        if hit is None or _region(*hit) is None:
            g.missing.append(f"{rel}:{qual}")
            continue
        (their_lines, their), (start, end) = hit, _region(lines, node)
        top, bottom = _region(*hit)
        block = _reindent(their_lines[top:bottom], _indent(their_lines[body(their)[0].lineno - 1]),
                          _indent(lines[body(node)[0].lineno - 1]))
        edits.append((start, end, block, 0))
        g.carried.append(f"{rel}:{qual}")
        if dump(their) != dump(node):
            g.rewritten.append(f"{rel}:{qual}")
        params = {a.arg for a in ast.walk(their.args) if isinstance(a, ast.arg)}
        used |= _free_names(ast.Module(body(their), []), params)
    parsed = learner.parsed(rel)
    if parsed is not None and rel in ref_prev:
        edits += _additions(lines, tree, parsed, ast.parse(ref_prev[rel].decode()), rel, used, g)
    for start, end, new, _ in sorted(edits, key=lambda e: (e[0], e[1], e[3]), reverse=True):
        lines[start:end] = new
    return "".join(lines)


def _replaced(rel: str, qual: str, before: str, learner: Learner, g: Grown) -> None:
    """给定的文件改了 qual（本书上一章的函数体是 before）：读者有这个函数时，它被本书的新版本换掉了。"""
    hit = learner.find(rel, qual, [])
    if hit is not None:
        g.replaced.append(f"{rel}:{qual}")
        if dump(hit[1]) != before:
            g.lost.append(f"{rel}:{qual}")


def _free_names(node, local: set[str] | None = None) -> set[str]:
    """node 里读到、却不是它自己赋值或参数的名字（大致的自由变量）：决定要不要带上一条 import。"""
    loads, local = set(), set(local or ())
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            (loads if isinstance(n.ctx, ast.Load) else local).add(n.id)
        elif isinstance(n, ast.arg):
            local.add(n.arg)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n is not node:
            local.add(n.name)
    return loads - local


def _top_names(tree: ast.Module) -> set[str]:
    names = set()
    for s in tree.body:
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(s.name)
        elif isinstance(s, (ast.Import, ast.ImportFrom)):
            names |= {a.asname or a.name.split(".")[0] for a in s.names}
        elif isinstance(s, (ast.Assign, ast.AnnAssign)):
            targets = s.targets if isinstance(s, ast.Assign) else [s.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def _source(lines: list[str], node) -> list[str]:
    """一个定义的源码行：带上装饰器和紧挨在上面的注释行。"""
    top = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
    while top > 0 and lines[top - 1].strip().startswith("#"):
        top -= 1
    block = lines[top:node.end_lineno]
    return block if block[-1].endswith("\n") else block[:-1] + [block[-1] + "\n"]


def _additions(lines, tree, parsed, ref_prev_tree, rel: str, used: set[str], g: Grown):
    """读者在这个文件里自己加的：顶层的函数、类、常量（接在末尾，if __name__ 之前）、import（接在 import 之后）、
    本书也有的类里加的方法（接在类的末尾）。和第 N 章新加的名字同名的不带，说一声。"""
    their_lines, their = parsed
    book_now, book_before = _top_names(tree), _top_names(ref_prev_tree)
    before_imports = {ast.dump(s) for s in ref_prev_tree.body if isinstance(s, (ast.Import, ast.ImportFrom))}
    defs: list[str] = []
    imports: list[str] = []
    edits = []
    for s in their.body:
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names = {s.name}
        elif isinstance(s, (ast.Assign, ast.AnnAssign)):
            targets = s.targets if isinstance(s, ast.Assign) else [s.target]
            if not all(isinstance(t, ast.Name) for t in targets):
                continue
            names = {t.id for t in targets}
        else:
            continue
        if names & book_before:
            if isinstance(s, ast.ClassDef):
                edits += _methods(lines, tree, their_lines, s, ref_prev_tree, rel, used, g)
            continue
        if names & book_now:
            g.notes.append(f"你在 {rel} 里加的 {'、'.join(sorted(names))} 和本章新加的同名：用了本书的")
            continue
        defs += ["\n", "\n", *_source(their_lines, s)]
        used |= _free_names(s)
        g.added.append(f"{rel}:{'、'.join(sorted(names))}")
    for s in their.body:  # 读者加的 import，和带过来的代码用到、本章不再 import 的名字
        if isinstance(s, (ast.Import, ast.ImportFrom)):
            names = {a.asname or a.name.split(".")[0] for a in s.names}
            if getattr(s, "module", None) == "__future__" or names & book_now:
                continue
            if ast.dump(s) not in before_imports or names & used:
                imports += _source(their_lines, s)
                g.added.append(f"{rel}:{ast.unparse(s)}")
    if imports:
        heads = [s for s in tree.body[:next((i for i, s in enumerate(tree.body) if isinstance(
            s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))), len(tree.body))]
            if isinstance(s, (ast.Import, ast.ImportFrom))]
        doc = tree.body[0] if tree.body and isinstance(tree.body[0], ast.Expr) else None
        at = heads[-1].end_lineno if heads else doc.end_lineno if doc else 0
        edits.append((at, at, imports, 0))
    if defs:
        main = next((s for s in tree.body if isinstance(s, ast.If) and "__name__" in ast.unparse(s.test)), None)
        at = main.lineno - 1 if main else len(lines)
        if main:
            defs = defs[2:] + ["\n", "\n"]
        elif lines and not lines[-1].endswith("\n"):
            lines[-1] += "\n"
        edits.append((at, at, defs, 1))  # 文件末尾的类里加的方法要在这些定义之前
    return edits


def _methods(lines, tree, their_lines, their_cls: ast.ClassDef, ref_prev_tree, rel: str, used: set[str], g: Grown):
    """读者在本书也有的类里加的方法：接在第 N 章这个类的末尾。"""
    ours = next((s for s in tree.body if isinstance(s, ast.ClassDef) and s.name == their_cls.name), None)
    before = dict(functions(ref_prev_tree))
    if ours is None:
        return []
    now = {n.name for n in ours.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    block = []
    for n in their_cls.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and f"{ours.name}.{n.name}" not in before:
            if n.name in now:
                g.notes.append(f"你在 {rel} 里加的 {ours.name}.{n.name} 和本章新加的同名：用了本书的")
                continue
            src = _indent(their_lines[n.lineno - 1])
            dst = _indent(lines[ours.body[-1].lineno - 1])
            block += ["\n", *_reindent(_source(their_lines, n), src, dst)]
            used |= _free_names(n)
            g.added.append(f"{rel}:{ours.name}.{n.name}")
    return [(ours.end_lineno, ours.end_lineno, block, 0)] if block else []
