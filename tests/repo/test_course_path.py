"""自己的引擎走完全程：python course.py start chN --from 上一章、demo DIR、progress。

一个脚本化的读者（模块级 fixture，整个文件只走一遍）：start ch1，按 AST 把每个桩换成参考检查点的函数体；
再对 N = 2..6 start chN --from my_ch(N-1)（先真的检查上一章），同样填桩；最后 demo my_ch6。
my_ch2 的 div_even 换成读者自己的等价写法（一条注释、一个局部变量、一个自己加的小函数和一条 import），
它要原样到达 my_ch6，my_ch3~5 的检查和 my_ch6 的里程碑照样通过。my_ch3 的 RopeAttn.__init__ 也换成等价写法：
第 6 章的 models/utils.py 是给定的文件，但它没改这个函数，所以读者的写法同样到达 my_ch6。

子进程都用 OMP_NUM_THREADS=1。demo 用 MINISGL_KERNEL=off：给定的 C++ 核换一个目录就要重编一两分钟，
它归第 6 章自己的测试管。埋了错的 my_ch3 的检查和主线并行跑，省下一次检查的等待。
"""

from __future__ import annotations

import ast
import os
import runpy
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.harness.procs import collect
from tools.manifest import checkpoint_files, is_given_test, load_manifest, load_tasks, match
from tools.workbench.task_table import task_of_test
from tools.workbench.stubs import body, find_stubs, functions

ROOT = Path(__file__).resolve().parents[2]
CK = {c.chapter: c for c in load_manifest()}
TIMEOUT = 900


def _course(env: dict, *args: str, popen: bool = False):
    cmd = [sys.executable, str(ROOT / "course.py"), *args]
    if popen:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                encoding="utf-8", errors="replace")
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, encoding="utf-8", errors="replace",
                          timeout=TIMEOUT)


def _ok(res, what: str) -> None:
    assert res.returncode == 0, f"{what} 以状态 {res.returncode} 退出：\n{res.stdout[-4000:]}\n{res.stderr[-3000:]}"


def _span(lines: list[str], node) -> tuple[int, int]:
    stmts = body(node)
    return stmts[0].lineno - 1, stmts[-1].end_lineno


def fill(ws: Path, chapter: int) -> int:
    """把 ws 里第 chapter 章的每个桩换成参考检查点里同名函数的函数体（docstring 之后的语句，源码原样）。"""
    ck, n = CK[chapter], 0
    files: dict[str, list[str]] = {}
    for s in find_stubs(ck):
        files.setdefault(s.file, []).append(s.qualname)
    for rel, quals in files.items():
        ref_lines = (ck.path / rel).read_text(encoding="utf-8").splitlines(keepends=True)
        ref = dict(functions(ast.parse("".join(ref_lines))))
        lines = (ws / rel).read_text(encoding="utf-8").splitlines(keepends=True)
        mine = dict(functions(ast.parse("".join(lines))))
        edits = []
        for q in quals:
            stub = body(mine[q])
            assert len(stub) == 1 and isinstance(stub[0], ast.Raise), f"{ws.name}/{rel}:{q} 不是桩"
            a, b = _span(ref_lines, ref[q])
            edits.append((*_span(lines, mine[q]), ref_lines[a:b]))
        for a, b, block in sorted(edits, key=lambda e: e[0], reverse=True):
            lines[a:b] = block
            n += 1
        (ws / rel).write_text("".join(lines), encoding="utf-8")
    return n


def make_it_mine(ws: Path) -> None:
    """读者自己的等价写法：div_even 多一条注释、一个局部变量，商交给自己加的小函数（它用一条自己加的 import）。"""
    path = ws / "minisgl" / "utils.py"
    text = path.read_text(encoding="utf-8")
    old_check, old_return = "    if a % b != 0:\n", "    return a // b\n"
    assert text.count(old_check) == 1 and text.count(old_return) == 1, "div_even 的写法变了：更新这里埋的写法"
    future = "from __future__ import annotations\n"
    text = text.replace(old_check, "    # 我自己的写法：余数先算出来\n    leftover = a % b\n    if leftover != 0:\n")
    text = text.replace(old_return, "    return _whole_parts(a, b)\n").replace(future, future + "\nimport operator\n")
    text += ('\n\ndef _whole_parts(a: int, b: int) -> int:\n'
             '    """我加的小函数。"""\n    return operator.floordiv(a, b)\n')
    path.write_text(text, encoding="utf-8")


ROPE = "minisgl/models/utils.py"


def make_rope_attn_mine(ws: Path) -> None:
    """读者自己的等价写法：RopeAttn.__init__ 的两个 qk norm 一行建好（第 6 章给定的 models/utils.py 没改这个函数）。"""
    old = ("        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps) if has_qk_norm else None\n"
           "        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps) if has_qk_norm else None\n")
    plant(ws, ROPE, old, "        # 我自己的写法：两个 norm 一起决定\n"
                         "        head, eps = config.head_dim, config.rms_norm_eps\n"
                         "        self.q_norm, self.k_norm = (RMSNorm(head, eps), RMSNorm(head, eps)) if has_qk_norm "
                         "else (None, None)\n")


IMPORT_BOOM = "_PAGE_BYTES = int(\"4k\")  # 我加的常量：写错了，import engine.py 时就抛 ValueError\n"


def segment(ws: Path, rel: str, qual: str) -> str:
    text = (ws / rel).read_text(encoding="utf-8")
    return ast.get_source_segment(text, dict(functions(ast.parse(text)))[qual])


def plant(ws: Path, rel: str, old: str, new: str) -> None:
    path = ws / rel
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1, f"{rel} 里找不到要埋错的那一行 {old!r}：更新这个测试"
    path.write_text(text.replace(old, new), encoding="utf-8")


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    return dst


@pytest.fixture(scope="module")
def path(tmp_path_factory, tiny_models):
    base = tmp_path_factory.mktemp("course_path")
    env = dict(os.environ, OMP_NUM_THREADS="1", MINISGL_KERNEL="off", PYTHONIOENCODING="utf-8",
               MINISGL_COURSE_RECORDS=str(base / "records"))
    p = SimpleNamespace(base=base, env=env, runs={}, filled={}, model=str(tiny_models["qwen3-tied"]))
    p.runs[1] = _course(env, "start", "ch1", str(base / "my_ch1"))
    _ok(p.runs[1], "start ch1")
    p.filled[1] = fill(base / "my_ch1", 1)
    background = {}
    for n in range(2, 7):
        if n == 3:
            make_it_mine(base / "my_ch2")
        if n == 4:  # 埋了错的 my_ch3：它的检查和主线的 start ch4 同时跑
            make_rope_attn_mine(base / "my_ch3")
            bug = copy(base / "my_ch3", base / "bug" / "my_ch3")
            plant(bug, "minisgl/models/config.py", "rms_norm_eps=config.rms_norm_eps,", "rms_norm_eps=1e-6,")
            background["refused"] = _course(env, "start", "ch4", str(bug.parent / "my_ch4"), "--from", str(bug),
                                            popen=True)
        p.runs[n] = _course(env, "start", f"ch{n}", str(base / f"my_ch{n}"), "--from", str(base / f"my_ch{n - 1}"))
        _ok(p.runs[n], f"start ch{n} --from my_ch{n - 1}")
        p.filled[n] = fill(base / f"my_ch{n}", n)
    boom = copy(base / "my_ch6", base / "boom" / "my_ch6")
    plant(boom, "minisgl/utils.py", "return (a + b - 1) // b", "return (a + b - 1) // (b - b)")
    at_import = copy(base / "my_ch6", base / "import_boom" / "my_ch6")  # engine.py 在 import 时就抛异常
    plant(at_import, "minisgl/engine/engine.py", "from .sample import BatchSamplingArgs, Sampler\n",
          "from .sample import BatchSamplingArgs, Sampler\n\n" + IMPORT_BOOM)
    background["demo"] = _course(env, "demo", str(base / "my_ch6"), "--model", p.model, popen=True)
    background["boom"] = _course(env, "demo", str(boom), "--model", p.model, popen=True)
    background["import_boom"] = _course(env, "demo", str(at_import), "--model", p.model, popen=True)
    p.runs.update(collect(background, timeout=TIMEOUT))
    return p


def test_the_scripted_learner_goes_the_whole_path(path):
    """每一步的检查都通过、桩都在；填完之后每一章除了读者自己的 utils.py 都和本书逐字节相同；demo 全是 True。"""
    for n in range(1, 7):
        assert path.filled[n] == len(find_stubs(CK[n])), f"my_ch{n} 的桩数和本书第 {n} 章的不同"
        if n >= 2:
            out = path.runs[n].stdout
            assert f"my_ch{n - 1} 通过了第 {n - 1} 章" in out and f"第 {n} 章的 {path.filled[n]} 个桩" in out, out
        mine, ref = checkpoint_files(path.base / f"my_ch{n}"), checkpoint_files(CK[n].path)
        for rel in ["minisgl/utils.py"] * (n >= 2) + [ROPE] * (n >= 3):  # 读者自己的写法
            mine.pop(rel, None)
            ref.pop(rel, None)
        assert mine.keys() == ref.keys(), f"my_ch{n}：文件和本书不同：{sorted(mine.keys() ^ ref.keys())}"
        diff = [rel for rel in ref if mine[rel] != ref[rel]]
        assert not diff, f"my_ch{n} 填完桩之后和本书不同的文件：{diff}"
    demo = path.runs["demo"]
    _ok(demo, "demo my_ch6")
    lines = demo.stdout.strip().splitlines()
    assert lines[0] == "你的引擎：my_ch6", lines[:3]
    script = path.base / "my_ch6" / "examples" / "stage1_milestone.py"  # my_ch6 自己的那份（start 复制的给定文件）
    assert lines[1] == f"里程碑脚本：{script.resolve()}", lines[:3]
    verdicts = [line for line in lines if "与 HF 一致" in line]
    assert len(verdicts) == 4 and all(v.rstrip().endswith("True") for v in verdicts), "\n".join(lines)
    assert lines[-1].startswith("单独跑") and lines[-1].endswith("True"), lines[-1]


def test_the_learners_own_code_reaches_my_ch6(path):
    """my_ch2 里自己写的 div_even（注释、局部变量都在）和自己加的小函数、import 原样到达 my_ch6，沿途每一章都通过。"""
    rel = "minisgl/utils.py"
    mine = {q: segment(path.base / "my_ch2", rel, q) for q in ("div_even", "_whole_parts")}
    assert "leftover" in mine["div_even"] and "# 我自己的写法" in mine["div_even"]
    for n in range(3, 7):
        for q, text in mine.items():
            assert segment(path.base / f"my_ch{n}", rel, q) == text, f"my_ch{n} 里的 {q} 不是读者写的那份"
        assert "import operator\n" in (path.base / f"my_ch{n}" / rel).read_text(encoding="utf-8")
    out = path.runs[3].stdout
    carried = next(line for line in out.splitlines() if "带上了你的" in line)
    added = next(line for line in out.splitlines() if "也带上了你自己加的" in line)
    assert f"{rel}:div_even" in carried and "写法不同" in carried, out
    assert f"{rel}:_whole_parts" in added and "import operator" in added, out
    for n in range(4, 7):  # my_ch3~5 带着它通过了各自的检查；my_ch6 的里程碑见上一个测试
        assert f"my_ch{n - 1} 通过了第 {n - 1} 章" in path.runs[n].stdout


def test_the_learners_function_in_a_given_file_reaches_my_ch6(path):
    """my_ch3 里自己写的 RopeAttn.__init__ 原样到达 my_ch6：第 6 章给定的 models/utils.py 没改它。start ch6 说出
    给定的文件改了哪些函数、用了本书的（GatedMLP.forward 换成了选 C++ 核的版本），my_ch6 的里程碑照样通过。"""
    mine = segment(path.base / "my_ch3", ROPE, "RopeAttn.__init__")
    assert "# 我自己的写法" in mine
    for n in range(4, 7):
        assert segment(path.base / f"my_ch{n}", ROPE, "RopeAttn.__init__") == mine, f"my_ch{n} 的 RopeAttn.__init__"
    assert segment(path.base / "my_ch6", ROPE, "GatedMLP.forward") == segment(CK[6].path, ROPE, "GatedMLP.forward")
    out = path.runs[6].stdout.splitlines()
    carried = next(line for line in out if "带上了你的" in line)
    assert f"{ROPE}:RopeAttn.__init__" in carried.split("写法不同")[-1], carried
    i = next(i for i, line in enumerate(out) if "改写了这" in line)
    assert "给定的文件" in out[i] and "用了本书的新版本" in out[i], out[i]
    listed = {line.split()[0]: line.split()[1] for line in out[i + 1:] if line.startswith("    ")}
    assert "GatedMLP.forward" in listed.get(ROPE, "").split("、") and "RopeAttn" not in listed[ROPE], out[i:]


def test_a_broken_previous_chapter_is_refused(path, monkeypatch):
    """my_ch3 里埋一个错：start ch4 --from 拒绝，说出任务和第一个没过的测试；--force 照样长出来，并且说了。"""
    from tools.workbench.course_record import read_check

    res, bug = path.runs["refused"], path.base / "bug" / "my_ch3"
    assert res.returncode != 0 and not (bug.parent / "my_ch4").exists(), res.stdout[-3000:]
    last = res.stdout.strip().splitlines()[-1]
    assert "Traceback" not in res.stdout + res.stderr, res.stderr[-3000:]
    task = match(load_tasks()[3], "minisgl/models/config.py:ModelConfig.from_hf", "symbols")[0]
    monkeypatch.setenv("MINISGL_COURSE_RECORDS", path.env["MINISGL_COURSE_RECORDS"])
    failed = [n.split("::")[-1] for n, r in read_check(bug)["results"].items() if r["outcome"] == "failed"]
    assert last.startswith("错误：my_ch3") and task.label in last, last
    assert failed and any(f"{name}：" in last for name in failed), (last, failed[:5])

    forced = _course(path.env, "start", "ch4", str(bug.parent / "my_ch4"), "--from", str(bug), "--force")
    _ok(forced, "start ch4 --from my_ch3 --force")
    assert forced.stdout.startswith("--force：没有检查 my_ch3"), forced.stdout[:500]
    assert "rms_norm_eps=1e-6," in (bug.parent / "my_ch4" / "minisgl/models/config.py").read_text(encoding="utf-8")


def test_demo_names_the_task_of_the_failing_code(path):
    """my_ch6 的 div_ceil 里埋一个 ZeroDivisionError：demo 打印 traceback，最后一行说它属于哪一章的哪个任务。"""
    res = path.runs["boom"]
    assert res.returncode != 0, res.stdout[-2000:]
    assert res.stdout.splitlines()[0] == "你的引擎：my_ch6"
    assert "Traceback" in res.stderr and "ZeroDivisionError" in res.stderr, res.stderr[-3000:]
    key = "minisgl/utils.py:div_ceil"
    owner = [s.task for c in CK.values() for s in find_stubs(c) if s.key == key][-1]  # 最后把它做成桩的那一章
    last = res.stderr.strip().splitlines()[-1]
    assert key in last and owner.label in last, last


def test_demo_names_file_line_and_task_of_an_import_error(path):
    """my_ch6 的 engine.py 在 import 时就抛异常（模块顶层的一行）：最后一行说出读者的文件、行和任务，
    不说"不在你的目录里"。"""
    from tools.manifest import match

    res = path.runs["import_boom"]
    assert res.returncode != 0, res.stdout[-2000:]
    assert "ValueError" in res.stderr, res.stderr[-3000:]
    rel = "minisgl/engine/engine.py"
    text = (path.base / "import_boom" / "my_ch6" / rel).read_text(encoding="utf-8")
    line = text.splitlines().index(IMPORT_BOOM.rstrip("\n")) + 1
    task = match(load_tasks()[6], f"{rel}:", "symbols")[0]  # 管着整个 engine.py 的那个任务
    last = res.stderr.strip().splitlines()[-1]
    assert f"{rel} 第 {line} 行" in last and task.label in last and "import" in last, last
    assert "不在你的目录里" not in res.stderr


@pytest.mark.parametrize("kind", ["syntax", "top_level", "helper_at_import"])
def test_whose_task_names_errors_raised_while_importing(kind, tmp_path):
    """import 时出的错（语法错误、模块顶层的一行、顶层调用的自己的函数）：一行说出文件、行和管这个文件的任务。"""
    from tools.manifest import match
    from tools.workbench.own_demo import whose_task

    rel = "minisgl/scheduler/table.py"
    path = tmp_path / "my_ch6" / rel
    path.parent.mkdir(parents=True)
    source = {"syntax": "x = 1\ndef broken(:\n    pass\n",
              "top_level": "x = 1\ny = int('4k')\n",
              "helper_at_import": "def _mine():\n    return int('4k')\n\n\ny = _mine()\n"}[kind]
    path.write_text(source, encoding="utf-8")
    try:
        runpy.run_path(str(path))
    except (SyntaxError, ValueError) as e:
        said = whose_task(tmp_path / "my_ch6", e)
    task = match(load_tasks()[6], f"{rel}:", "symbols")[0]
    line = {"syntax": 2, "top_level": 2, "helper_at_import": 5}[kind]
    assert said and f"你的 {rel} 第 {line} 行" in said and task.label in said, said
    assert ("语法错误" in said) == (kind == "syntax"), said
    assert ("_mine" in said) == (kind == "helper_at_import"), said  # 异常抛在哪里也说


def test_demo_runs_the_folders_own_milestone_script(tmp_path, monkeypatch, capsys):
    """demo DIR 跑 DIR 自己的 examples/stage1_milestone.py（start ch6 复制的给定文件），不是书里的那份。"""
    from tools.workbench import own_demo

    for d in ("examples", "minisgl"):
        (tmp_path / d).mkdir()
    (tmp_path / "minisgl" / "__init__.py").write_text("")
    (tmp_path / "examples" / "stage1_milestone.py").write_text("import sys\nprint('own', sys.argv[1:])\n")
    monkeypatch.setattr(sys, "path", list(sys.path))  # main 改 sys.path、sys.argv 并 import minisgl：测完还原
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    ours = lambda: [k for k in sys.modules if k == "minisgl" or k.startswith("minisgl.")]  # noqa: E731
    for k in ours():  # 别的测试 import 过的 minisgl 先拿开（测完由 monkeypatch 放回）
        monkeypatch.delitem(sys.modules, k)
    try:
        assert own_demo.main([str(tmp_path), "--page-size", "4"]) == 0
    finally:
        for k in ours():
            sys.modules.pop(k)
    assert "own ['--page-size', '4']" in capsys.readouterr().out


def test_demo_without_the_books_milestone_script_says_one_line(tmp_path, monkeypatch, capsys):
    """DIR 里没有里程碑脚本时退回书里第 6 章检查点的那份：它也不见了（被删、没克隆全）时说一行，不是 traceback。"""
    from tools.workbench import own_demo

    monkeypatch.setattr(own_demo, "SCRIPT", tmp_path / "gone" / "stage1_milestone.py")
    assert own_demo.main([str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "stage1_milestone.py" in err[0] and "git checkout" in err[0], err


def test_progress_reads_the_records(path):
    """progress：每章通过了几个任务、是不是从上一章长出来的；代码改过就说记录旧了；只读记录，不跑测试。"""
    dirs = [str(path.base / f"my_ch{n}") for n in range(1, 7)]
    records = Path(path.env["MINISGL_COURSE_RECORDS"])
    before = {p: p.read_bytes() for p in records.rglob("*.json")}
    res = _course(path.env, "progress", *dirs)
    _ok(res, "progress")
    rows = {line.split()[0]: line for line in res.stdout.splitlines()[1:]}
    for n in range(1, 6):
        k = len(load_tasks()[n])
        assert f"✓ {k}/{k}" in rows[f"my_ch{n}"], res.stdout
        assert ("--from my_ch" + str(n - 1) if n > 1 else f"本书的 {CK[0].name}") in rows[f"my_ch{n}"], res.stdout
    assert "还没有 check 的记录" in rows["my_ch6"] and "--from my_ch5" in rows["my_ch6"], res.stdout
    assert {p: p.read_bytes() for p in records.rglob("*.json")} == before, "progress 改了记录"

    core = path.base / "my_ch1" / "minisgl" / "core.py"
    original = core.read_bytes()
    try:
        core.write_bytes(original + b"\n# \xe6\x94\xb9\xe4\xb8\x80\xe4\xb8\x8b\n")
        stale = _course(path.env, "progress", dirs[0])
    finally:
        core.write_bytes(original)
    assert "记录比代码旧" in stale.stdout, stale.stdout

    wrong = _course(path.env, "start", "ch4", str(path.base / "wrong"), "--from", dirs[1])
    assert wrong.returncode != 0 and wrong.stdout.strip().splitlines() == [
        line for line in wrong.stdout.strip().splitlines() if line.startswith("错误：")], wrong.stdout
    assert "第 2 章的目录" in wrong.stdout and "第 3 章" in wrong.stdout, wrong.stdout


BAD = {
    "from_missing_folder": (["start", "ch4", "--from", "no_such_dir"], "no_such_dir 不存在"),
    "from_not_a_chapter": (["start", "ch4", "--from", "docs"], "docs 不是第 3 章的目录"),
    "from_with_step0": (["start", "step0", "--from", "docs"], "第 0 步没有上一章"),
    "from_without_folder": (["start", "ch4", "--from"], "--from 后面"),
    "force_without_from": (["start", "ch4", "--force"], "--force 只和 --from"),
    "start_unknown_option": (["start", "ch4", "--frm", "x"], "--frm"),
    "demo_missing_folder": (["demo", "no_such_dir"], "no_such_dir 不存在"),
    "demo_not_an_engine": (["demo", "--page-size", "4", "docs"], "minisgl"),
    "demo_two_folders": (["demo", "docs", "tools"], "一个目录"),
    "progress_missing_folder": (["progress", "no_such_dir"], "no_such_dir 不是目录"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input_is_one_line(name, tmp_path):
    argv, culprit = BAD[name]
    env = dict(os.environ, MINISGL_COURSE_RECORDS=str(tmp_path))
    res = subprocess.run([sys.executable, "course.py", *argv], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    out = (res.stdout + res.stderr).strip().splitlines()
    assert res.returncode != 0, f"{name}：用错了却正常退出\n{res.stdout[-2000:]}"
    assert "Traceback" not in res.stdout + res.stderr, res.stderr[-3000:]
    assert len(out) == 1 and out[0].startswith("错误：") and culprit in out[0], out[-3:]
    assert not list(tmp_path.iterdir()), "用错了还写了记录"


def _course_commands() -> list[tuple[str, str]]:
    """书和 README 的代码块里每一条 python course.py …：(文件, 命令行)。"""
    out = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        fenced = False
        for line in page.read_text(encoding="utf-8").splitlines():
            if line.lstrip().startswith("```"):
                fenced = not fenced
            elif fenced and "python course.py" in line:
                cmd = line.split("python course.py", 1)[1].split("#")[0].split("&&")[0].strip()
                out.append((page.name, cmd))
    return out


def test_every_course_command_in_the_book_parses():
    """书里写的 course.py 命令：子命令存在；start 的参数 course.py 自己认得，章也在清单里。"""
    from tools.workbench.course_start import _start_args
    from tools.manifest import find_checkpoint

    cmds = _course_commands()
    assert any(cmd.startswith("start ch2 --from my_ch1") for _, cmd in cmds), "书里没有 start --from 这条路径"
    for page, cmd in cmds:
        argv = cmd.split()
        assert argv and argv[0] in ("demo", "test", "start", "check", "trace", "progress"), (page, cmd)
        if argv[0] == "start":
            parsed = _start_args(argv[1:])
            assert not isinstance(parsed, str), (page, cmd, parsed)
            find_checkpoint(parsed[0])


def _record_dirs(tmp_path: Path, monkeypatch, *names: str) -> list[Path]:
    """几个只有一个文件的工作目录，记录写进 tmp_path/records（progress 只读记录，不跑测试）。"""
    monkeypatch.setenv("MINISGL_COURSE_RECORDS", str(tmp_path / "records"))
    dirs = [tmp_path / n for n in names]
    for d in dirs:
        d.mkdir()
        (d / "x.py").write_text("x = 1\n")
    return dirs


@pytest.mark.parametrize("broken", ["truncated", "not_an_object", "missing_field"])
def test_progress_reports_an_unreadable_record_in_one_line(broken, tmp_path, monkeypatch):
    """.cache/course/ 里一份坏了的记录：progress 照样列出整张表，这份记录当作没有，表下一行说它读不了。"""
    from tools.workbench.course_record import write_check, write_start

    good, bad = _record_dirs(tmp_path, monkeypatch, "my_ch1", "my_ch2")
    write_start(good, 1, {"from": None, "forced": False})
    write_start(bad, 2, {"from": str(good), "forced": False})
    record = write_check(bad, 2, {"tests/ch2/test_ops.py::test_task1_x": {"outcome": "passed", "reason": ""}}, "all")
    record.write_text({"truncated": record.read_text(encoding="utf-8")[:40], "not_an_object": "[1, 2]",
                       "missing_field": '{"chapter": 2, "when": 1.0, "selection": "all"}'}[broken], encoding="utf-8")
    res = _course(dict(os.environ), "progress", str(good), str(bad))
    assert res.returncode == 0 and "Traceback" not in res.stdout + res.stderr, res.stdout + res.stderr[-3000:]
    lines = res.stdout.strip().splitlines()
    rows = {line.split()[0]: line for line in lines[1:3]}
    assert rows.keys() == {"my_ch1", "my_ch2"}, lines
    assert "还没有 check 的记录" in rows["my_ch2"] and "--from my_ch1" in rows["my_ch2"], rows["my_ch2"]
    said = [line for line in lines if "读不了" in line]
    assert len(said) == 1 and "my_ch2" in said[0] and str(record) in said[0], lines


@pytest.mark.parametrize("inside", ["ch3_model_loading/mine", "tests/my_ch4", "tools/sub/my_ch4", "docs/my_ch4"])
def test_start_refuses_a_folder_inside_the_book(inside, tmp_path):
    """start ch4 放进检查点、tests/、tools/、docs/：一行 错误：…，什么都不建（建了就是书的一部分）。"""
    target = ROOT / inside
    new = next(p for p in [*reversed(target.parents), target] if not p.exists())  # 会被建出来的最外层
    env = dict(os.environ, MINISGL_COURSE_RECORDS=str(tmp_path))
    try:
        res = subprocess.run([sys.executable, "course.py", "start", "ch4", inside], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=120, check=False)
    finally:
        made = new.exists()
        shutil.rmtree(new, ignore_errors=True)
    out = (res.stdout + res.stderr).strip().splitlines()
    assert res.returncode != 0 and not made, f"{inside}：建出来了\n{res.stdout[-2000:]}"
    assert len(out) == 1 and out[0].startswith("错误：") and inside.split("/")[0] in out[0], out[-3:]
    assert not list(tmp_path.iterdir()), "用错了还写了记录"


def test_progress_says_what_a_record_does_not_cover(tmp_path, monkeypatch):
    """只跑了一个任务、回归有失败、--force 从不是上一章的目录长出来：progress 都写在备注和起点里。"""
    from tools.workbench.course_record import progress_report, write_check, write_start

    src, dest = _record_dirs(tmp_path, monkeypatch, "my_ch2", "my_ch4")
    write_start(src, 2, {"from": None, "forced": False})
    write_start(dest, 4, {"from": str(src), "forced": True})
    write_check(dest, 4, {"tests/ch4/test_kv_pool.py::test_task2_x": {"outcome": "passed", "reason": ""},
                          "tests/ch1/test_core.py::test_task1_y": {"outcome": "failed", "reason": "boom"}}, "task 2")
    row = progress_report([dest]).splitlines()[1]
    assert "2:1/1" in row and "1:0/0" not in row and "上次只跑了任务 2" in row, row
    assert "回归）有 1 个没过" in row and "--force" in row and "它是第 2 章，不是上一章" in row, row
    (dest / "x.py").write_text("x = 2\n")
    assert "记录比代码旧" in progress_report([dest]), progress_report([dest])


def test_progress_leaves_given_code_tests_out_of_the_tasks(tmp_path, monkeypatch):
    """给定代码自己的测试（tests/tasks.toml 的 given_tests）不算进读者的任务：它没过也不让任务变成 ✗。"""
    from tools.workbench.course_record import progress_report, write_check

    monkeypatch.setenv("MINISGL_COURSE_RECORDS", str(tmp_path / "records"))
    dest = tmp_path / "my_ch6"
    dest.mkdir()
    (dest / "x.py").write_text("x = 1\n")
    given = "tests/ch6/test_kernel.py::test_small_linear_matches"
    mine = {f"tests/ch6/test_engine.py::test_task{t.number}_x": {"outcome": "passed", "reason": ""}
            for t in load_tasks()[6]}
    assert is_given_test(6, given) and all(task_of_test(load_tasks(), n, 6) for n in mine)
    write_check(dest, 6, {**mine, given: {"outcome": "failed", "reason": "boom"}}, "all")
    row = progress_report([dest]).splitlines()[1]
    k = len(load_tasks()[6])
    assert f"✓ {k}/{k}" in row, row
    assert all(f"{t.number}:1/1" in row for t in load_tasks()[6]), row


def test_start_from_uses_a_fresh_passing_check(tmp_path, monkeypatch, capsys):
    """check 刚测过、代码没改过、任务全过：start --from 用那次的记录，不再跑一遍；代码改过就重跑。"""
    from tools.workbench import course_start
    from tools.workbench.course_record import write_check

    monkeypatch.setenv("MINISGL_COURSE_RECORDS", str(tmp_path / "records"))
    mine = tmp_path / "my_ch3"
    mine.mkdir()
    (mine / "x.py").write_text("x = 1\n")
    runs = []
    monkeypatch.setattr(course_start.subprocess, "run",
                        lambda cmd, **kw: runs.append(cmd) or SimpleNamespace(returncode=0, stdout="", stderr=""))
    passed = {f"tests/ch3/test_loading.py::test_task{t.number}_x": {"outcome": "passed", "reason": ""}
              for t in load_tasks()[3]}
    write_check(mine, 3, passed, "all")
    assert course_start._check_previous(mine, CK[3]) and runs == []
    assert "不再重跑检查" in capsys.readouterr().out
    (mine / "x.py").write_text("x = 2\n")
    assert course_start._check_previous(mine, CK[3]) and len(runs) == 1
