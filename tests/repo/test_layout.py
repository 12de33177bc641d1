"""仓库的分层：tools/ 是库，tests/ 用它，反过来不行；"用哪个模型"只有 tools/models/find.py 一个答案。"""

from __future__ import annotations

import ast
from pathlib import Path

from tools.manifest import ROOT

# 回答"用哪个模型"的地方之外，谁也不该自己拼出真模型的目录
MODEL_DIRS = ("Qwen3-0.6B", "SmolLM2-135M")


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
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


def test_tools_never_import_tests():
    bad = [f"{p.relative_to(ROOT)}: {m}" for p in [*_python_files(ROOT / "tools"), ROOT / "course.py"]
           for m in _imports(p) if m == "tests" or m.startswith("tests.")]
    assert not bad, "tools/ 和 course.py 不 import tests/（测试用工具，反过来不行）：\n" + "\n".join(bad)


def test_model_directories_are_spelled_only_in_tools_models():
    """演示、测试、书、trace、bench、里程碑脚本都问 tools.models.find.find_model，不各自去 models/ 下找。"""
    files = [*_python_files(ROOT / "tools"), ROOT / "course.py",
             *_python_files(ROOT / "ch6_engine_sampler" / "examples")]
    bad = []
    for p in files:
        if p == ROOT / "tools" / "models.py":
            continue
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in MODEL_DIRS:
                bad.append(f"{p.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert not bad, "真模型的目录只在 tools/models/find.py 里拼出来：\n" + "\n".join(bad)
