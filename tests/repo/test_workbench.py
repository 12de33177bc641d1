"""自己动手的工作台（python course.py start / check）：每一章现生成一份桩目录，检查

- 桩目录收集测试 0 个错误，收集到的每个测试恰好归一个任务，每个任务至少有一个测试；
- 每个桩都归一个任务，它的 NotImplementedError 写着这个任务；
- 每章真跑一个测试：在桩上失败、原因是写着任务号的 NotImplementedError；把参考文件放回去就通过。

每章两个 pytest 进程（收集全部 + 跑一个测试；放回参考文件再跑这一个），CI 里有界。
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tools.manifest import load_manifest
from tools.manifest import load_tasks, match
from tools.workbench.task_table import chapter_of_test
from tools.workbench import stubs, workspace

ROOT = Path(__file__).resolve().parents[2]

CHECKPOINTS = load_manifest()


def _pytest(ws: Path, tag: str, tmp: Path, *args: str) -> tuple[dict, list[str], str]:
    out = tmp / f"progress-{len(list(tmp.glob('progress-*')))}.json"
    env = dict(os.environ, MINISGL_PROGRESS=str(out), OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-m", "pytest", "tests", "-q", "-p", "no:cacheprovider", "-p",
                          "tests.harness.progress", "--checkpoint", str(ws), "--as", tag, *args],
                         cwd=ROOT, env=env, capture_output=True, text=True)
    results = json.loads(out.read_text()) if out.exists() else {}
    collected = json.loads(Path(str(out) + ".collected").read_text()) if out.exists() else []
    return results, collected, res.stdout[-3000:] + res.stderr[-2000:]


def _probe(chapter: int) -> tuple[str, str]:
    """每章真跑的那个测试：tests/chN/ 里第一个 test_task1_ 函数（第 0 步：test_cli.py 的第一个测试）。"""
    files = sorted((ROOT / "tests" / f"ch{chapter}").glob("test_*.py")) if chapter else \
        [ROOT / "tests" / "checkpoint" / "test_cli.py"]
    for f in files:
        for node in ast.parse(f.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_task1_" if chapter else "test_"):
                return f.relative_to(ROOT).as_posix(), node.name
    raise AssertionError(f"第 {chapter} 章没有 test_task1_ 测试")


@pytest.mark.parametrize("ck", CHECKPOINTS, ids=lambda c: c.name)
def test_stub_workspace(ck, tmp_path):
    tag = ck.name.split("_")[0]
    tasks = load_tasks()
    mine = tasks.get(ck.chapter, [])
    assert mine, f"tests/tasks.toml 里没有第 {ck.chapter} 章的任务"
    ws = tmp_path / f"my_{tag}"
    made = workspace.make_workspace(ck, ws)

    # 每个桩归一个任务，桩里的消息写着它
    for s in made:
        hits = match(mine, s.key, "symbols")
        assert len(hits) == 1, f"{s.key} 归属的任务不唯一：{[t.label for t in hits]}（tests/tasks.toml 的 symbols）"
    for rel in {s.file for s in made}:
        tree = ast.parse((ws / rel).read_text(encoding="utf-8"))
        raised = {n.exc.args[0].value for n in ast.walk(tree)  # 桩的消息是字面量；基类原样给出的默认实现可能是 f-string
                  if isinstance(n, ast.Raise) and isinstance(n.exc, ast.Call) and getattr(n.exc.func, "id", "")
                  == "NotImplementedError" and n.exc.args and isinstance(n.exc.args[0], ast.Constant)}
        for s in (s for s in made if s.file == rel):
            assert any(m.startswith(f"{s.task.label}：{s.qualname}") for m in raised), f"{s.key} 的桩没写任务号"

    # 一个进程里：收集全部（0 个错误、每个测试恰好一个任务），用 -k 只跑本章的一个测试
    probe_file, name = _probe(ck.chapter)
    results, collected, out = _pytest(ws, tag, tmp_path, "-k", name)
    errors = {k: v for k, v in results.items() if v["outcome"] == "error"}
    assert collected and not errors, f"桩目录收集出错：{errors}\n{out}"
    for nodeid in collected:
        own = tasks.get(chapter_of_test(nodeid, ck.chapter), [])
        hits = match(own, nodeid.split("[")[0], "tests")
        assert len(hits) == 1, f"{nodeid} 归属的任务不唯一：{[t.label for t in hits]}（tests/tasks.toml 的 tests）"
    for t in mine:
        assert any(match(mine, n.split("[")[0], "tests") == [t] for n in collected
                   if chapter_of_test(n, ck.chapter) == ck.chapter), f"{t.label} 没有测试"
    ran = {k: v for k, v in results.items() if k.startswith(f"{probe_file}::{name}")}
    assert ran and all(v["outcome"] == "failed" for v in ran.values()), f"{name} 在桩上没有失败：\n{out}"
    for v in ran.values():
        assert v["reason"].startswith(f"NotImplementedError: 第 {ck.chapter} 章 · 任务 "), v["reason"]

    for rel in stubs.changes(ck):  # 放回参考文件
        if (ck.path / rel).exists():
            shutil.copyfile(ck.path / rel, ws / rel)
    results, _, out = _pytest(ws, tag, tmp_path, probe_file, "-k", name)
    again = {k: v for k, v in results.items() if k in ran}
    assert again.keys() == ran.keys() and all(v["outcome"] == "passed" for v in again.values()), \
        f"放回参考文件后 {name} 还是没通过：\n{out}"


def test_start_refuses_an_existing_directory(tmp_path):
    ws = tmp_path / "mine"
    ws.mkdir()
    (ws / "keep.txt").write_text("读者的东西")
    with pytest.raises(FileExistsError, match="已经存在"):
        workspace.make_workspace(CHECKPOINTS[4], ws)
    assert (ws / "keep.txt").read_text() == "读者的东西"


def test_progress_table_counts_and_names_the_first_failure():
    from tools.workbench.task_table import progress_table

    results = {
        "tests/ch4/test_kv_pool.py::test_task1_shapes_dtype_device": {"outcome": "failed", "reason": "boom"},
        "tests/ch4/test_kv_pool.py::test_task1_many_stores_never_reallocate": {"outcome": "passed", "reason": ""},
        "tests/ch1/test_core.py::test_task1_batch_properties": {"outcome": "passed", "reason": ""},
        "tests/elsewhere/test_x.py::test_x": {"outcome": "passed", "reason": ""},
    }
    table, ok = progress_table(results, 4)
    assert not ok
    assert "1/2" in table and "test_task1_shapes_dtype_device：boom" in table
    assert "第 1 章的测试（回归）" in table and "未归类" in table
    ok_results = {k: {"outcome": "passed", "reason": ""} for k in list(results)[:3]}
    assert progress_table(ok_results, 4)[1] is False  # 任务 2~4 没有测试，不算全部通过


def test_details_are_capped_keeping_head_and_tail():
    from tools.suite.procs import capped

    out = "FIRST FAILURE\n" + "x" * 50000 + "\nshort test summary"
    kept = capped(out, 4000)
    assert len(kept) < 4200 and kept.startswith("FIRST FAILURE") and kept.endswith("short test summary")


def test_progress_table_prefers_the_failure_naming_its_own_task():
    from tools.workbench.task_table import progress_table

    results = {
        "tests/ch4/test_kv_pool.py::test_task1_a": {"outcome": "failed",
                                                    "reason": "NotImplementedError: 第 4 章 · 任务 2：step"},
        "tests/ch4/test_kv_pool.py::test_task1_b": {"outcome": "failed",
                                                    "reason": "NotImplementedError: 第 4 章 · 任务 1：MHAKVCache"},
    }
    table, _ = progress_table(results, 4)
    assert "test_task1_b：NotImplementedError: 第 4 章 · 任务 1" in table and "test_task1_a" not in table


def test_progress_reason_is_the_failed_expectation_not_captured_output(tmp_path):
    """一行原因取自失败的异常：报错清单的帮手说的那一行、桩、测试自己给的一句话；断言附带的是整段子进程 stderr 时，
    用 assert 的说明，不用 stderr 的第一行。"""
    (tmp_path / "test_reasons.py").write_text(textwrap.dedent('''
        from tests.harness.errors import expect_error
        ERR = "Traceback (most recent call last):\\n  File x\\nValueError: boom"
        def test_assert_with_stderr_message():
            code = 1
            assert code == 0, ERR
        def test_helper_wrong_type():
            with expect_error("ch1/req_lengths"):
                raise KeyError("x")
        def test_stub():
            raise NotImplementedError("第 1 章 · 任务 2：Context.batch")
        def test_report():
            report = "提示词 'Hi'：第 3 步（从 0 数）第一次分叉"
            assert not [report], report + "\\n  HF ..."
        def test_stub_in_a_child_process():
            assert False, "generate.py 以状态 1 退出：\\nNotImplementedError: 第 3 章 · 任务 4：load_weight\\n"
    '''), encoding="utf-8")
    out = tmp_path / "progress.json"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.harness.progress",
                    "--tb=short", str(tmp_path / "test_reasons.py")], cwd=ROOT,
                   env=dict(os.environ, MINISGL_PROGRESS=str(out)), capture_output=True, text=True)
    reasons = {k.split("::")[-1]: v["reason"] for k, v in json.loads(out.read_text()).items()}
    assert reasons["test_assert_with_stderr_message"] == "assert 1 == 0", reasons
    assert reasons["test_helper_wrong_type"] == "期望 ValueError（match='cached_len'），得到 KeyError: 'x'", reasons
    assert reasons["test_stub"] == "NotImplementedError: 第 1 章 · 任务 2：Context.batch", reasons
    assert reasons["test_report"] == "提示词 'Hi'：第 3 步（从 0 数）第一次分叉", reasons
    assert reasons["test_stub_in_a_child_process"] == "NotImplementedError: 第 3 章 · 任务 4：load_weight", reasons


@pytest.mark.parametrize("where", ["inside", "elsewhere"])
def test_start_prints_a_check_command_that_resolves(tmp_path, where):
    """course.py start ch1 /绝对路径：打印的 check 命令在当前目录下照抄就能跑（脚本和目录都找得到）。"""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    dest = cwd / "mine" if where == "inside" else tmp_path / "mine"
    res = subprocess.run([sys.executable, str(ROOT / "course.py"), "start", "ch1", str(dest)], cwd=cwd,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    cmd = res.stdout.split("随时看进度：")[-1].split()
    assert cmd[0] == "python" and cmd[2] == "check" and cmd[4:] == ["--as", "ch1"], cmd
    assert (cwd / cmd[1]).resolve() == (ROOT / "course.py").resolve(), cmd
    assert (cwd / cmd[3]).resolve() == dest.resolve(), cmd


def _selected(ck_name: str, chapter: int, **env: str) -> list[str]:
    res = subprocess.run([sys.executable, "-m", "pytest", "tests", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "-p", "tests.harness.progress", "--checkpoint", ck_name, "--real"], cwd=ROOT,
                         env=dict(os.environ, MINISGL_CHAPTER=str(chapter), **env), capture_output=True, text=True)
    return [line.split("[")[0] for line in res.stdout.splitlines() if "::" in line]


def test_check_runs_own_tasks_regressions_and_one_task_apart():
    """check 分几份进程：own 只有本章（tests/ch2、tests/checkpoint），regress 只有前面各章，--task K 只有任务 K。"""
    own = _selected("ch2", 2, MINISGL_SELECT="own")
    regress = _selected("ch2", 2, MINISGL_SELECT="regress")
    real = _selected("ch2", 2, MINISGL_SELECT="real")
    task4 = _selected("ch2", 2, MINISGL_SELECT="own", MINISGL_TASK="4")
    assert own and all(n.startswith(("tests/ch2/", "tests/checkpoint/")) for n in own), own[:5]
    assert regress and all(n.startswith("tests/ch1/") for n in regress), regress[:5]
    assert real and all(n.startswith("tests/real/") for n in real), real[:5]
    assert task4 and set(task4) < set(own) and all("test_task4_" in n for n in task4), task4


def test_progress_table_for_one_task_lists_only_that_task():
    from tools.workbench.task_table import progress_table

    results = {"tests/ch4/test_kv_pool.py::test_task2_x": {"outcome": "passed", "reason": ""}}
    table, ok = progress_table(results, 4, only_task=2)
    assert ok and "任务 2" in table and "任务 1" not in table and "没有测试" not in table, table


def test_given_code_tests_are_a_row_of_their_own_and_not_in_own_or_a_task():
    """第 6 章给定代码自己的测试（tasks.toml 的 given_tests）：只在 given 那一份里，进度表上排在任务之后单独一行。"""
    from tools.manifest import is_given_test
    from tools.workbench.task_table import progress_table

    given = _selected("ch6", 6, MINISGL_SELECT="given")
    own = _selected("ch6", 6, MINISGL_SELECT="own")
    task6 = _selected("ch6", 6, MINISGL_SELECT="own", MINISGL_TASK="6")
    assert given and all(is_given_test(6, n) for n in given), given[:5]
    assert not set(given) & (set(own) | set(task6))
    results = {given[0]: {"outcome": "passed", "reason": ""}, own[0]: {"outcome": "passed", "reason": ""}}
    table, _ = progress_table(results, 6)
    rows = [line for line in table.splitlines()[1:]]
    assert "给定代码自己的测试" in rows[-1] and all("任务" in r for r in rows[:-1]), table


def test_task_and_own_run_the_real_tier_only_when_asked(capsys):
    """--own 从不跑真权重一档；--task K 只在任务 K 含它、并且明说了 --real 时跑；不跑时说为什么。"""
    import argparse

    from tools.manifest import find_checkpoint
    from tools.suite.real import real_tier

    ck = find_checkpoint("ch6")

    def decide(**kw):
        args = argparse.Namespace(**{"real": False, "real_if_present": True, "own": False, "task": None, **kw})
        return real_tier(args, ck), capsys.readouterr().out

    for kw, said in [(dict(own=True), "--own"), (dict(task=7), "任务 7 不含它"), (dict(task=6), "任务 6 含它，")]:
        ran, out = decide(**kw)
        assert not ran, kw
        assert said in out, out


def test_check_summary_counts_skips_and_says_the_parts_overlap(capsys):
    """每一份的摘要带跳过的个数（理由另起几行列出），最后一行也带；几份同时跑时说明各份的秒数互相重叠。"""
    from tools import run_tests

    job = [sys.executable, "-c", "print('3 passed, 2 skipped in 0.1s')"]
    tally: dict = {}
    passed, failed, details = run_tests._run([("甲", job, {}), ("乙", job, {})], dict(os.environ), 2, tally=tally)
    out = capsys.readouterr().out
    assert (passed, failed, tally["skipped"]) == (6, 0, 4), out
    assert "通过  甲: 3 passed, 0 failed, 2 skipped（" in out and "-rs" not in out, out
    assert run_tests._finish(passed, failed, details, tally["skipped"], (1.0, True)) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "6 passed, 0 failed, 4 skipped" and "同时跑" in lines[-2], lines


def test_check_prints_the_task_table_once(monkeypatch, capsys):
    """本章的任务、回归、真权重一档各跑一份，按任务的表只在全部跑完之后打一次（表头写着跑了哪几份）。"""
    import argparse

    from tools import run_tests

    results = {"tests/ch3/test_models.py::test_task2_x": {"outcome": "passed", "reason": ""}}

    def fake_run(jobs, env, n_jobs, on_done=None, **kw):
        for name, _, _ in jobs:
            on_done(name, results)
        return 1, 0, []

    monkeypatch.setattr(run_tests, "_run", fake_run)
    monkeypatch.setattr(run_tests, "real_tier", lambda args, ck: True)
    monkeypatch.setattr(run_tests, "prepare_real", lambda: None)
    args = argparse.Namespace(checkpoint="ch3", as_chapter=None, task=None, own=False, real=True,
                              real_if_present=False, jobs=2)
    assert run_tests._one_checkpoint(args, ["pytest"], {}) == 0
    out = capsys.readouterr().out
    assert out.count("第一个没通过的测试") == 1, out
    header = next(ln for ln in out.splitlines() if ln.startswith("ch3_model_loading（"))
    assert "本章的任务" in header and "真权重一档" in header, header


def test_real_tier_absence_reads_as_information(monkeypatch, capsys, tiny_models):
    """这一章装不下真模型的家族：说这一章不跑、为什么、从哪一章起跑，不读成警告。"""
    import argparse
    import types

    from tools.manifest import find_checkpoint

    from tools.suite import real

    monkeypatch.setattr(real, "find_model", lambda **kw: types.SimpleNamespace(path=tiny_models["llama3"]))
    args = argparse.Namespace(real=True, real_if_present=False, own=False, task=None)
    assert real.real_tier(args, find_checkpoint("ch2")) is False
    out = capsys.readouterr().out
    assert out.startswith("真权重一档：这一章不跑") and "不适用" not in out and "第 3 章起" in out, out
