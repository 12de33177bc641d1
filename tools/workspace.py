"""读者的工作目录：python course.py start chN 写出的 my_chN（上一章 + 本章的桩）。

桩本身怎么生成（哪些函数、函数体换成什么）在 tools/stubs.py；这里只管目录：从哪里复制、写到哪里。
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tools.manifest import Checkpoint, checkpoint_files, is_given
from tools.stubs import Stub, changes, find_stubs, previous, stub_source


def make_workspace(ck: Checkpoint, dest: Path) -> list[Stub]:
    """复制上一章的检查点，删掉本章删除的文件，写入本章新增、修改的文件（Python 函数体换成桩）。"""
    if dest.exists():
        raise FileExistsError(f"{dest} 已经存在：不覆盖，换个目录名，或者先把它移走")
    prev = previous(ck)
    dest.mkdir(parents=True)
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

