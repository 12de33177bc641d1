"""读者目录的记录：check 跑出的结果、start 从哪里长出来。python course.py progress 只读这些，不重跑测试。

记录放在仓库的 .cache/course/ 下（按目录的绝对路径分开），不放进读者的目录：那里的每个文件都是代码，
start --from 会把它们带进下一章。记录里有代码的摘要：代码改过之后，progress 会说记录比代码旧。
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from tools.manifest import ROOT, checkpoint_files

RECORDS = ROOT / ".cache" / "course"


def _folder(dest: Path) -> Path:
    dest = dest.resolve()
    return RECORDS / f"{dest.name}-{hashlib.sha256(str(dest).encode()).hexdigest()[:12]}"


def code_digest(dest: Path) -> str:
    """目录里全部代码文件（checkpoint_files 的范围）的摘要。"""
    h = hashlib.sha256()
    for rel, data in checkpoint_files(dest).items():
        h.update(rel.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()


def _write(dest: Path, kind: str, data: dict) -> Path:
    path = _folder(dest) / f"{kind}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"dir": str(dest.resolve()), "when": time.time(), "digest": code_digest(dest), **data}
    part = path.with_suffix(".part")
    part.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    part.replace(path)
    return path


def _read(dest: Path, kind: str) -> dict | None:
    """记录加一个 stale 字段：记录之后代码改过没有。没有记录时 None。"""
    path = _folder(dest) / f"{kind}.json"
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    data["stale"] = data.get("digest") != code_digest(dest)
    return data


def write_check(dest: Path, chapter: int, results: dict[str, dict], selection: str) -> Path:
    """check 跑完一个读者目录后调用。results 是 tests/harness/progress.py 写的 {node id: {outcome, reason}}，
    selection 说这次跑了哪些（"all"、"own"、"task 2"）。"""
    return _write(dest, "check", {"chapter": chapter, "selection": selection, "results": results})


def read_check(dest: Path) -> dict | None:
    return _read(dest, "check")


def write_start(dest: Path, chapter: int, info: dict) -> Path:
    """start 写出工作目录后调用：info 说它从哪里长出来（比如 {"from": 上一章的目录或 None}）。"""
    return _write(dest, "start", {"chapter": chapter, **info})


def read_start(dest: Path) -> dict | None:
    return _read(dest, "start")
