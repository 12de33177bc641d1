"""读者的工作目录：python course.py start chN 写出的 my_chN（上一章 + 本章的桩）。

桩本身怎么生成（哪些函数、函数体换成什么）在 tools/workbench/stubs.py；这里只管目录：从哪里复制、写到哪里。
start chN --from DIR 让工作目录从读者自己的上一章长出来（grow_workspace）：

- 第 N 章不改的文件：来自 DIR，逐字节；
- 第 N 章改的文件：照常从参考生成桩；参考里和上一章一模一样的函数，换成读者自己在 DIR 里写的函数体
  （按限定名找）；读者自己加的顶层函数、类、常量、import 和方法也带上，免得带过来的函数找不到它们；
- 给定的文件（tests/tasks.toml 的 given）：本书的文件、没有桩，其余同上——本章没改的函数仍是读者的，
  本章改了的函数用本书的新版本，记在 replaced 里，start 逐个说出来。
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tools.workbench.carry_code import Grown, Learner, bodies, carry
from tools.manifest import Checkpoint, checkpoint_files, is_given
from tools.workbench.stubs import Stub, changes, find_stubs, previous, stub_source


def exists_line(dest: Path) -> str:
    """目录已经存在时 start 说的话（事先查到的、认领时才撞上的，都是这一句）。"""
    return f"{dest} 已经存在：不覆盖，换个目录名，或者先把它移走"


@contextlib.contextmanager
def building(dest: Path) -> Iterator[Path]:
    """先认领 dest（不带 exist_ok 的 mkdir：两个 start 同时建一个目录，只有一个成功，另一个得到 FileExistsError），
    再在旁边的临时目录里建，建好了改名换掉认领的空目录（rename 原子地替换空目录）：dest 要么是空的认领，要么是
    完整的。出错时临时目录和认领都删掉，不留半个目录。"""
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        dest.mkdir()
    except FileExistsError:
        raise FileExistsError(exists_line(dest)) from None
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".partial", dir=dest.parent))
    except OSError:
        dest.rmdir()
        raise
    try:
        os.chmod(tmp, dest.stat().st_mode & 0o7777)  # mkdtemp 只给自己读写；和 mkdir 一样按 umask
        yield tmp
        os.rename(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        with contextlib.suppress(OSError):
            dest.rmdir()  # 只删空的认领：有人往里放了东西就留着
        raise


def make_workspace(ck: Checkpoint, dest: Path) -> list[Stub]:
    """复制上一章的检查点，删掉本章删除的文件，写入本章新增、修改的文件（Python 函数体换成桩）。"""
    with building(dest) as tmp:
        return _make(ck, tmp)


def _make(ck: Checkpoint, dest: Path) -> list[Stub]:
    prev = previous(ck)
    if prev is not None:
        for rel, data in checkpoint_files(prev.path).items():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_bytes(data)
    stubs = find_stubs(ck)
    for rel in changes(ck):
        src, dst = ck.path / rel, dest / rel
        if not src.exists():
            dst.unlink(missing_ok=True)
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        if rel.endswith(".py") and not is_given(ck.chapter, rel):
            mine = [s for s in stubs if s.file == rel]
            dst.write_text(stub_source(src.read_text(encoding="utf-8"), mine, prev.name if prev else None),
                           encoding="utf-8")
        else:
            shutil.copyfile(src, dst)
    return stubs


def grow_workspace(ck: Checkpoint, dest: Path, mine: Path) -> Grown:
    """第 N 章的工作目录，从读者自己的第 N-1 章（mine）长出来。"""
    with building(dest) as tmp:
        return _grow(ck, tmp, mine)


def _grow(ck: Checkpoint, dest: Path, mine: Path) -> Grown:
    prev = previous(ck)
    assert prev is not None, "第 0 步没有上一章"
    changed = set(changes(ck))
    theirs, ref_prev = checkpoint_files(mine), checkpoint_files(prev.path)
    g = Grown(find_stubs(ck))

    def put(rel: str, data: bytes) -> None:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_bytes(data)

    for rel, data in theirs.items():
        if rel not in changed and not is_given(ck.chapter, rel):
            put(rel, data)
            g.from_dir.append(rel)
    for rel, data in ref_prev.items():
        if rel not in theirs and rel not in changed and not is_given(ck.chapter, rel):
            put(rel, data)
            g.notes.append(f"{mine.name} 里没有 {rel}：用了本书的")
    learner = Learner(mine, theirs, g.notes)
    old = bodies(ref_prev)
    given = [rel for rel in checkpoint_files(ck.path) if is_given(ck.chapter, rel)]
    for rel in sorted(set(changes(ck)) | set(given)):
        src = ck.path / rel
        if not src.exists():  # 本章删掉的文件
            continue
        g.given += [rel] if rel in given else []
        if not rel.endswith(".py"):
            put(rel, src.read_bytes())
            continue
        stubs = [s for s in g.stubs if s.file == rel]  # 给定的文件没有桩
        text = stub_source(src.read_text(encoding="utf-8"), stubs, mine.name)
        text = carry(text, rel, {s.qualname for s in stubs}, old, ref_prev, learner, g, given=rel in given)
        put(rel, text.encode("utf-8"))
    return g
