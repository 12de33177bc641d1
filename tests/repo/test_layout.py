"""仓库的分层：tools/ 是库，tests/ 用它，反过来不行；章节代码不 import tools/；tools/ 按关心的事分包，
顶层至多 6 个模块，import 不成环；"用哪个模型"只有 tools/models/ 一个答案。"""

from __future__ import annotations

import ast
from pathlib import Path

from tools.manifest import ROOT, load_manifest
from tools.models.names import QWEN3, SMOLLM2, TINY_DEMO

# 回答"用哪个模型"的地方之外，谁也不该自己拼出真模型的目录
MODEL_DIRS = ("Qwen3-0.6B", "SmolLM2-135M")
NAMES = ROOT / "tools" / "models" / "names.py"
MILESTONE = ROOT / "ch6_engine_sampler" / "examples" / "stage1_milestone.py"
TOOLS = ROOT / "tools"
MAX_TOP_MODULES = 6  # manifest、run_tests 这几个人人都用的模块放顶层，其余按关心的事进各自的包


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _python_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.relative_to(folder).parts)


def test_tools_never_import_tests():
    bad = [f"{p.relative_to(ROOT)}: {m}" for p in [*_python_files(ROOT / "tools"), ROOT / "course.py"]
           for m in _imports(p) if m == "tests" or m.startswith("tests.")]
    assert not bad, "tools/ 和 course.py 不 import tests/（测试用工具，反过来不行）：\n" + "\n".join(bad)


def test_model_directories_are_spelled_only_in_tools_models():
    """演示、测试、书、trace、bench 都问 tools.models.find.find_model，不各自去 models/ 下找。
    里程碑脚本是例外：章节代码不 import tools/，它单独运行时自己找（顺序由下一个测试核对）。"""
    files = [*_python_files(TOOLS), ROOT / "course.py", *_python_files(ROOT / "ch6_engine_sampler" / "examples")]
    bad = []
    for p in files:
        if p in (NAMES, MILESTONE):
            continue
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in MODEL_DIRS:
                bad.append(f"{p.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert not bad, "真模型的目录只在 tools/models/names.py 里拼出来：\n" + "\n".join(bad)


def test_milestone_looks_for_the_same_models():
    """里程碑脚本单独运行时找的模型和顺序，和 course.py demo 问 tools/models/ 得到的一样。"""
    consts = {}
    for node in ast.parse(MILESTONE.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                consts[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    assert consts.get("REAL_MODELS") == (QWEN3.name, SMOLLM2.name), consts.get("REAL_MODELS")
    assert consts.get("TINY_MODEL") == TINY_DEMO, consts.get("TINY_MODEL")


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _tools_graph() -> dict[str, set[str]]:
    """tools/ 里每个模块 -> 它 import 的 tools/ 模块。函数里、TYPE_CHECKING 里的 import 也算：它们照样把两个文件
    绑在一起。包的 __init__ 只有 docstring（下面的测试查），不算边。"""
    files = {_module(p): p for p in _python_files(TOOLS)}
    modules = {m for m, p in files.items() if p.name != "__init__.py"}
    graph = {}
    for name in modules:
        deps = set()
        for node in ast.walk(ast.parse(files[name].read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                deps.add(node.module)
                deps.update(f"{node.module}.{a.name}" for a in node.names)  # from tools.book import error_cases
        graph[name] = (deps & modules) - {name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """图里的一个环（首尾相同的一串名字）；没有环时 None。"""
    state: dict[str, int] = {}  # 1：在当前路径上，2：查完了
    path: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        path.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return path[path.index(m):] + [m]
            if m not in state and (found := visit(m)):
                return found
        path.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (found := visit(n)):
            return found
    return None


def test_cycle_finder_finds_a_cycle():
    """自检：两个互相 import 的模块必须被认出来。"""
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_tools_top_level_is_small():
    top = sorted(p.name for p in TOOLS.glob("*.py"))
    assert len(top) <= MAX_TOP_MODULES, f"tools/ 顶层有 {len(top)} 个模块（至多 {MAX_TOP_MODULES} 个）：{top}"


def test_tools_packages_say_what_they_are_for():
    """每个包的 __init__ 只有一段 docstring（它是做什么的、谁调用它），不 import、不放代码。"""
    for init in sorted(TOOLS.rglob("__init__.py")):
        tree = ast.parse(init.read_text(encoding="utf-8"))
        assert ast.get_docstring(tree), f"{init.relative_to(ROOT)} 缺 docstring"
        assert len(tree.body) == 1, f"{init.relative_to(ROOT)} 只放 docstring"


def test_tools_imports_have_no_cycle():
    """模块之间不成环；按包（tools/ 下第一层：workbench、book、trace、models、arch、bench、顶层模块）看也不成环。"""
    graph = _tools_graph()
    assert not (found := _cycle(graph)), "tools/ 的 import 成环：" + " → ".join(found)
    unit = lambda m: ".".join(m.split(".")[:2])  # noqa: E731
    units: dict[str, set[str]] = {}
    for m, deps in graph.items():
        units.setdefault(unit(m), set()).update(unit(d) for d in deps if unit(d) != unit(m))
    assert not (found := _cycle(units)), "tools/ 的包之间 import 成环：" + " → ".join(found)
    assert not graph["tools.manifest"], f"tools/manifest.py 在最底层，不 import 别的工具：{graph['tools.manifest']}"


def test_chapters_never_import_tools():
    """章节代码自成一体：读者复制走一章也能跑，所以不 import 仓库的 tools/（课程经命令行参数把答案交给它）。"""
    bad = [f"{p.relative_to(ROOT)}: {m}" for ck in load_manifest() for p in _python_files(ck.path)
           for m in _imports(p) if m == "tools" or m.startswith("tools.")]
    assert not bad, "章节代码 import 了 tools/：\n" + "\n".join(bad)
