"""docs/fidelity.md（和官方代码的对照）要列出第 6 章检查点每个模块的每个公开名字。

公开名字用 AST 列：模块级的类、函数、常量，以及公开类的公开方法、属性和类体里声明的字段（不以 _ 开头）。
页面按 `### ` 小节组织，小节标题里用反引号写模块路径（`minisgl/core.py`，或整个包 `minisgl/kvcache/`）。
反过来，标题里的模块路径必须存在；表格第一列（"我们"）写的名字必须还在那个模块的代码里。
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "ch6_engine_sampler" / "minisgl"
PAGE = ROOT / "docs" / "fidelity.md"
TICKS = re.compile(r"`([^`]+)`")
IDENT = re.compile(r"[A-Za-z_]\w*")


def public_names(source: str) -> set[str]:
    """模块级公开名字，加上公开类的公开成员（写成 类名.成员）。"""
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            names.add(node.name)
            for m in node.body:
                if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and not m.name.startswith("_"):
                    names.add(f"{node.name}.{m.name}")
                elif (isinstance(m, ast.AnnAssign) and isinstance(m.target, ast.Name)
                      and not m.target.id.startswith("_")):
                    names.add(f"{node.name}.{m.target.id}")
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(t, ast.Name) and not t.id.startswith("_") and t.id != "__all__":
                    names.add(t.id)
    return names


def identifiers(source: str) -> set[str]:
    """模块代码里出现的所有标识符：页面写的名字至少要在这里面。"""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        for attr in ("name", "id", "attr", "arg"):
            value = getattr(node, attr, None)
            if isinstance(value, str):
                out.add(value)
        if isinstance(node, ast.alias):
            out.add(node.asname or node.name.split(".")[-1])
    return out


def modules(package: Path) -> dict[str, str]:
    """"minisgl/xxx.py" -> 源码。"""
    return {p.relative_to(package.parent).as_posix(): p.read_text(encoding="utf-8")
            for p in sorted(package.rglob("*.py"))}


def sections(page: str) -> list[tuple[list[str], str]]:
    """[(标题里的模块路径, 小节正文)]；只收标题里写了 minisgl/ 路径的小节。"""
    out = []
    for chunk in re.split(r"^### ", page, flags=re.M)[1:]:
        title, _, body = chunk.partition("\n")
        paths = [t for t in TICKS.findall(title) if t.startswith("minisgl/")]
        if paths:
            out.append((paths, body))
    return out


def covers(path: str, module: str) -> bool:
    return module == path or (path.endswith("/") and module.startswith(path))


def first_column_names(body: str) -> list[str]:
    """表格第一列里反引号写的名字（括号里的参数不算），比如 `Engine.check_batch`、`launch_tp(config, ...)`。"""
    names = []
    for line in body.splitlines():
        cells = line.split("|")
        if not line.startswith("|") or len(cells) < 3 or set(cells[1].strip()) <= set("-: "):
            continue
        for tick in TICKS.findall(cells[1]):
            if "/" in tick:  # 文件路径，比如 `attention/gpu.py`
                continue
            names += IDENT.findall(tick.split("(")[0])
    return names


def problems(page: str, mods: dict[str, str]) -> list[str]:
    found, secs = [], sections(page)
    for module, source in mods.items():
        required = public_names(source)
        if not required:
            continue
        bodies = [body for paths, body in secs if any(covers(p, module) for p in paths)]
        if not bodies:
            found.append(f"{module}：页面上没有写它的小节（### 标题里写 `{module}`）")
            continue
        written = {part for body in bodies for tick in TICKS.findall(body) for part in IDENT.findall(tick)}
        missing = sorted(n for n in required if n.split(".")[-1] not in written)
        if missing:
            found.append(f"{module}：这些公开名字没写在页面上：{missing}")
    for paths, body in secs:
        covered = [m for m in mods if any(covers(p, m) for p in paths)]
        gone = [p for p in paths if not any(covers(p, m) for m in mods)]
        if gone:
            found.append(f"小节标题里的模块已经不存在：{gone}")
            continue
        known = set().union(*(identifiers(mods[m]) for m in covered))
        stale = sorted({n for n in first_column_names(body) if n not in known})
        if stale:
            found.append(f"{paths}：'我们'一列写的名字在代码里找不到：{stale}")
    return found


def test_fidelity_page_lists_every_public_name():
    assert PAGE.is_file(), f"缺少 {PAGE.relative_to(ROOT)}"
    found = problems(PAGE.read_text(encoding="utf-8"), modules(PACKAGE))
    assert not found, "docs/fidelity.md 和第 6 章的代码对不上：\n" + "\n".join(found)


def test_checker_catches_missing_and_stale_names(tmp_path):
    """检查本身要能失败：少写一个名字、写了不存在的名字或模块，都要报出来。"""
    pkg = tmp_path / "minisgl"
    pkg.mkdir()
    (pkg / "a.py").write_text("X = 1\n\nclass Foo:\n    size: int\n    def run(self): ...\n    def _hide(self): ...\n")
    mods = modules(pkg)
    assert public_names(mods["minisgl/a.py"]) == {"X", "Foo", "Foo.size", "Foo.run"}
    good = "### `minisgl/a.py`\n\n| 我们 | 官方 |\n|---|---|\n| `Foo`（`size`、`run`）、`X` | 同 |\n"
    assert problems(good, mods) == []
    assert any("Foo.run" in p for p in problems(good.replace("、`run`", ""), mods))
    assert any("Gone" in p for p in problems(good.replace("| 同 |", "| 同 |\n| `Gone` | 无 |"), mods))
    assert any("不存在" in p for p in problems(good + "\n### `minisgl/b.py`\n", mods))
    assert any("没有写它的小节" in p for p in problems("### 别的\n", mods))
