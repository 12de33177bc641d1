"""start 建目录、读目录：两个 start 同时建同一个目录（workbench/workspace.py 的 building）时恰好一个建成、另一个只说
"已经存在"那一行，没有 traceback、没有半个目录；建到一半出错也不留下东西；读读者的目录（manifest.checkpoint_files）
不读设备、管道，不跟着链接走出目录。赛跑的子进程是 fork 出来的，不重新 import：每次几十毫秒。"""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import os
import traceback
from pathlib import Path

import pytest

from tools.workbench import course_start, workspace
from tools.manifest import checkpoint_files, load_manifest

CK = {c.chapter: c for c in load_manifest()}
TRIALS = 20


def _write(files: dict[str, bytes], dest: Path) -> Path:
    for rel, data in files.items():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_bytes(data)
    return dest


def _start(barrier, argv: list[str], log: str) -> None:
    """子进程：等另一个到齐了一起 start；输出写进 log，退出码就是 start 的（traceback 是 99）。"""
    buf, rc = io.StringIO(), 99
    barrier.wait()
    with contextlib.redirect_stdout(buf):
        try:
            rc = course_start.start(argv)
        except BaseException:  # noqa: BLE001  要的就是把它记下来
            buf.write(traceback.format_exc())
    Path(log).write_text(buf.getvalue(), encoding="utf-8")
    os._exit(rc)


@pytest.fixture
def mine(tmp_path, monkeypatch) -> Path:
    """读者的第 3 章（本书的 ch3 原样）；记录写到临时目录。"""
    monkeypatch.setenv("MINISGL_COURSE_RECORDS", str(tmp_path / "records"))
    return _write(checkpoint_files(CK[3].path), tmp_path / "my_ch3")


def test_two_starts_into_one_folder(mine, tmp_path):
    """start ch4 W --from my_ch3 --force 两个同时跑，重复 TRIALS 次。"""
    ctx = multiprocessing.get_context("fork")
    with contextlib.redirect_stdout(io.StringIO()):
        assert course_start.start(["ch4", str(tmp_path / "alone"), "--from", str(mine), "--force"]) == 0
    whole = checkpoint_files(tmp_path / "alone")
    for i in range(TRIALS):
        dest, barrier = tmp_path / f"w{i}", ctx.Barrier(2)
        argv = ["ch4", str(dest), "--from", str(mine), "--force"]
        procs = [ctx.Process(target=_start, args=(barrier, argv, str(tmp_path / f"log{i}-{k}"))) for k in (0, 1)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        logs = [(tmp_path / f"log{i}-{k}").read_text(encoding="utf-8") for k in (0, 1)]
        codes = sorted(p.exitcode for p in procs)
        assert codes == [0, 1], (codes, logs)
        refused = logs[[p.exitcode for p in procs].index(1)].strip().splitlines()
        assert refused == [f"错误：{workspace.exists_line(dest)}"], refused
        assert checkpoint_files(dest) == whole, f"第 {i} 次：{dest.name} 不完整"
    left = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("."))
    assert not left, f"留下了临时目录：{left}"


def test_a_start_that_fails_halfway_leaves_nothing(mine, tmp_path, monkeypatch):
    """建到一半出错：目标目录和临时目录都不留，下一次 start 照常建。"""
    def boom(ck, dest, src):
        (dest / "half.py").write_text("# 写了一半\n")
        raise RuntimeError("建到一半")

    real = workspace._grow
    monkeypatch.setattr(workspace, "_grow", boom)
    dest = tmp_path / "my_ch4"
    with pytest.raises(RuntimeError):
        workspace.grow_workspace(CK[4], dest, mine)
    assert [p.name for p in tmp_path.iterdir()] == ["my_ch3"]
    monkeypatch.setattr(workspace, "_grow", real)
    assert workspace.grow_workspace(CK[4], dest, mine).stubs and (dest / "minisgl").is_dir()


def test_reading_a_learners_folder_stays_inside_it(mine, tmp_path):
    """my_ch3 里有指向 /dev/zero 的链接、一个命名管道、指向目录外面的文件和目录的链接：都不读（读设备、管道没有
    尽头）；指向目录里面的文件的链接照常读。start --from 长出来的目录里也没有它们。"""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.py").write_text("X = 1\n")
    pkg = mine / "minisgl"
    (pkg / "zero.py").symlink_to("/dev/zero")
    os.mkfifo(pkg / "pipe.py")
    (pkg / "secret.py").symlink_to(outside / "secret.py")
    (pkg / "elsewhere").symlink_to(outside, target_is_directory=True)
    (pkg / "core_again.py").symlink_to(pkg / "core.py")
    files = checkpoint_files(mine)
    assert not {"minisgl/zero.py", "minisgl/pipe.py", "minisgl/secret.py"} & files.keys()
    assert not [rel for rel in files if rel.startswith("minisgl/elsewhere/")]
    assert files["minisgl/core_again.py"] == (pkg / "core.py").read_bytes()
    workspace.grow_workspace(CK[4], tmp_path / "my_ch4", mine)
    grown = tmp_path / "my_ch4" / "minisgl"
    assert not [n for n in ("zero.py", "pipe.py", "secret.py", "elsewhere") if os.path.lexists(grown / n)]
