"""start chN --from 的搬运规则（tools/workbench/ 的 workspace.grow_workspace、carry_code），不跑检查：
拿本书的上一章当"读者的目录"，改动一处，看第 N 章的目录里是什么。整条路径见 test_course_path.py。
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

from tools.manifest import checkpoint_files, load_manifest
from tools.workbench.stubs import functions
from tools.workbench.workspace import grow_workspace

CK = {c.chapter: c for c in load_manifest()}


def mine(chapter: int, tmp_path: Path) -> Path:
    """本书第 chapter 章的一份拷贝，当作读者写完的目录。"""
    return Path(shutil.copytree(CK[chapter].path, tmp_path / f"my_ch{chapter}",
                                ignore=shutil.ignore_patterns("__pycache__")))


def source_of(path: Path, qual: str) -> str:
    text = path.read_text(encoding="utf-8")
    return ast.get_source_segment(text, dict(functions(ast.parse(text)))[qual])


def test_a_function_the_learner_lacks_comes_from_the_book_and_is_named(tmp_path):
    src = mine(2, tmp_path)
    utils = src / "minisgl/utils.py"
    text = utils.read_text(encoding="utf-8")
    utils.write_text(text.replace(source_of(utils, "div_ceil"), ""), encoding="utf-8")
    g = grow_workspace(CK[3], tmp_path / "my_ch3", src)
    assert g.missing == ["minisgl/utils.py:div_ceil"], g.missing
    assert source_of(tmp_path / "my_ch3/minisgl/utils.py", "div_ceil") == \
        source_of(CK[3].path / "minisgl/utils.py", "div_ceil")


def test_a_method_the_learner_added_to_a_book_class_is_carried(tmp_path):
    src = mine(4, tmp_path)
    rel = "minisgl/layers/attention.py"
    lines = (src / rel).read_text(encoding="utf-8").splitlines(keepends=True)
    cls = next(n for n in ast.parse("".join(lines)).body if isinstance(n, ast.ClassDef) and n.name == "AttentionLayer")
    lines[cls.end_lineno:cls.end_lineno] = ["\n", "    def _mine(self) -> int:\n", "        return 7  # 我加的\n"]
    lines += ["\n", "\n", "def _also_mine() -> int:\n", "    return 8\n"]  # 顶层的也加一个：两段插在同一处时次序不乱
    (src / rel).write_text("".join(lines), encoding="utf-8")
    g = grow_workspace(CK[5], tmp_path / "my_ch5", src)
    assert f"{rel}:AttentionLayer._mine" in g.added, g.added
    out = (tmp_path / "my_ch5" / rel).read_text(encoding="utf-8")
    assert {"AttentionLayer._mine", "_also_mine"} <= dict(functions(ast.parse(out))).keys(), out[-600:]
    assert "return 7  # 我加的" in out
    assert f"{rel}:AttentionLayer.__init__" in g.carried, g.carried


def test_given_files_come_from_the_book_and_caches_stay_behind(tmp_path):
    src = mine(5, tmp_path)
    (src / "minisgl/layers/norm.py").write_text("# 我改过给定的文件\n", encoding="utf-8")
    (src / "minisgl/__pycache__").mkdir(exist_ok=True)
    (src / "minisgl/__pycache__/core.cpython-311.pyc").write_bytes(b"\0")
    (src / ".pytest_cache").mkdir()
    (src / ".pytest_cache/README.md").write_text("x")
    (src / "notes.md").write_text("我的笔记\n", encoding="utf-8")
    dest = tmp_path / "my_ch6"
    g = grow_workspace(CK[6], dest, src)
    assert "minisgl/layers/norm.py" in g.given
    assert (dest / "minisgl/layers/norm.py").read_bytes() == (CK[6].path / "minisgl/layers/norm.py").read_bytes()
    assert not list(dest.rglob("__pycache__")) and not (dest / ".pytest_cache").exists()
    assert "notes.md" in g.from_dir and (dest / "notes.md").read_text(encoding="utf-8") == "我的笔记\n"
    ref = checkpoint_files(CK[5].path)
    for rel in g.from_dir:  # 第 6 章不改的文件：逐字节来自读者的目录
        assert (dest / rel).read_bytes() == (src / rel).read_bytes() and (rel in ref or rel == "notes.md"), rel


def test_a_file_that_does_not_parse_falls_back_to_the_book_and_says_so(tmp_path):
    src = mine(2, tmp_path)
    with (src / "minisgl/utils.py").open("a", encoding="utf-8") as f:
        f.write("\ndef broken(:\n")
    g = grow_workspace(CK[3], tmp_path / "my_ch3", src)
    assert any("minisgl/utils.py" in n and "语法错误" in n for n in g.notes), g.notes
    assert "minisgl/utils.py:div_even" in g.missing
    ast.parse((tmp_path / "my_ch3/minisgl/utils.py").read_text(encoding="utf-8"))


def test_a_helper_named_like_a_new_book_function_is_not_carried(tmp_path):
    """读者在第 2 章自己加了 torch_dtype，第 3 章本书也加了同名的：用本书的，并且说一声。"""
    src = mine(2, tmp_path)
    with (src / "minisgl/utils.py").open("a", encoding="utf-8") as f:
        f.write("\n\ndef torch_dtype(x):\n    return x\n")
    g = grow_workspace(CK[3], tmp_path / "my_ch3", src)
    assert any("torch_dtype" in n and "同名" in n for n in g.notes), g.notes
    assert "return x" not in source_of(tmp_path / "my_ch3/minisgl/utils.py", "torch_dtype")  # 第 3 章的桩


def test_a_given_file_keeps_the_learners_functions_it_does_not_change(tmp_path):
    """第 6 章的 models/utils.py 是给定的文件：它没改的 RopeAttn.__init__ 是读者写的那份；它改了的 GatedMLP.forward
    用本书的新版本，记在 replaced 里（读者的写法和本书不同，也记在 lost 里）；文件其余部分是本书的。"""
    src, rel = mine(5, tmp_path), "minisgl/models/utils.py"
    text = (src / rel).read_text(encoding="utf-8")
    mine_init = source_of(src / rel, "RopeAttn.__init__").replace(
        "self.o_proj = ", "# 我自己的写法\n        o_proj = ").rstrip() + "\n        self.o_proj = o_proj"
    mine_forward = source_of(src / rel, "GatedMLP.forward").replace("return ", "y = ") + "\n        return y"
    text = text.replace(source_of(src / rel, "RopeAttn.__init__"), mine_init)
    (src / rel).write_text(text.replace(source_of(src / rel, "GatedMLP.forward"), mine_forward), encoding="utf-8")
    g = grow_workspace(CK[6], tmp_path / "my_ch6", src)
    out = tmp_path / "my_ch6" / rel
    assert source_of(out, "RopeAttn.__init__") == mine_init, source_of(out, "RopeAttn.__init__")
    assert f"{rel}:RopeAttn.__init__" in g.carried and f"{rel}:RopeAttn.__init__" in g.rewritten, g.carried
    book = CK[6].path / rel
    for qual in ("GatedMLP.forward", "GatedMLP.__init__", "GatedMLP.load_state_dict"):
        assert source_of(out, qual) == source_of(book, qual), qual
    assert {f"{rel}:GatedMLP.forward", f"{rel}:GatedMLP.__init__"} <= set(g.replaced), g.replaced
    assert g.lost == [f"{rel}:GatedMLP.forward"] and rel in g.given, (g.lost, g.given)
    restored = out.read_text(encoding="utf-8").replace(mine_init, source_of(CK[5].path / rel, "RopeAttn.__init__"))
    assert restored == book.read_text(encoding="utf-8")  # 除了读者的那个函数，和本书的给定文件逐字节相同
