"""课程的清单：checkpoints.toml（有哪些检查点、各支持什么、改了哪些文件）和 tests/tasks.toml（每章的任务）。
工具和测试都从这里读；用哪个模型在 tools/models/find.py。"""

from __future__ import annotations

import copy
import fnmatch
import functools
import os
import re
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "checkpoints.toml"
TASKS = ROOT / "tests" / "tasks.toml"
IGNORED_PARTS = {"__pycache__", ".pytest_cache"}

# 所有检查点共用的提示词：英文、中文、代码，以及一条 60 多个 token 的长提示词
LONG_PROMPT = (
    "Prefill processes the whole prompt in one forward pass, decode processes one new token per request per "
    "step, and batching several requests into one step reads the weights once while computing a few more rows "
    "of every matrix. 所以把请求攒成批，吞吐就上去了。"
)
PROMPTS = ["The capital of France is", "法国的首都是", "def fibonacci(n):", LONG_PROMPT]
TINY_NEW_TOKENS = 20


@dataclass(frozen=True)
class Checkpoint:
    name: str
    chapter: int
    entry: str
    families: list[str]
    page_sizes: list[int]
    changes: list[str] = field(default_factory=list)
    path: Path = ROOT

    @property
    def entry_path(self) -> Path:
        return self.path / self.entry


def load_manifest() -> list[Checkpoint]:
    data = tomllib.loads(MANIFEST.read_text(encoding="utf-8"))
    return [Checkpoint(**c, path=ROOT / c["name"]) for c in data["checkpoint"]]


def by_name(spec: str) -> Checkpoint | None:
    """清单里叫 spec（全名或 ch3 这样的前缀）的那个检查点；没有时 None。"""
    hits = [c for c in load_manifest() if c.name == spec or c.name.split("_")[0] == spec]
    return hits[0] if len(hits) == 1 else None


def find_checkpoint(spec: str, as_chapter: str | None = None) -> Checkpoint:
    """spec 是清单里的名字（或 ch3 这样的前缀），或者读者自己的目录（此时用 as_chapter 指定按哪一章的要求测）。"""
    manifest = load_manifest()
    if (ck := by_name(spec)) is not None and as_chapter is None:
        return ck
    path = Path(spec).resolve()
    if not path.is_dir():
        names = ", ".join(c.name for c in manifest)
        raise SystemExit(f"错误：找不到检查点 {spec!r}：可选 {names}，或者一个目录（配合 --as chN）")
    base = by_name(as_chapter or path.name)
    if base is None:
        raise SystemExit(f"错误：{path} 不是清单里的检查点：请用 --as step0/ch1/…/ch6 说明按哪一章的要求测试")
    return Checkpoint(**{**base.__dict__, "path": path})


def checkpoint_files(path: Path) -> dict[str, bytes]:
    """检查点目录里的全部文件（相对路径 -> 内容），跳过缓存目录。读者的目录里也许还有别的：只读普通文件（设备、
    管道读起来没有尽头），链接只跟到目录里面的普通文件，链接的目录不进去（不绕圈，不走出目录）。"""
    top, out = path.resolve(), {}
    for here, dirs, files in os.walk(top):  # followlinks=False
        dirs[:] = [d for d in dirs if d not in IGNORED_PARTS]
        for name in files:
            p = Path(here, name)
            if p.suffix != ".pyc" and _regular_inside(p, top):
                out[p.relative_to(top).as_posix()] = p.read_bytes()
    return {rel: out[rel] for rel in sorted(out, key=lambda rel: rel.split("/"))}  # 和 Path 排序一样：摘要不变


def _regular_inside(p: Path, top: Path) -> bool:
    """p 是普通文件，或者是指向 top 里面一个普通文件的链接。"""
    if p.is_symlink() and top not in p.resolve().parents:
        return False
    try:
        return stat.S_ISREG(os.stat(p).st_mode)
    except OSError:  # 断了的链接
        return False


def use_checkpoint(spec: str) -> Checkpoint:
    """让 import minisgl 得到这个检查点的包（放到 sys.path 最前面）。

    每个检查点都是一份完整的 minisgl 快照、包名相同，一个进程只能用其中一个：已经 import 了别的检查点就报错，
    免得测的是另一章的代码。bench（含 bench.kernels）、figures_more 都经过这里，不各自改 sys.path。
    """
    ck = find_checkpoint(spec)
    loaded = sys.modules.get("minisgl")
    if loaded is not None and ck.path not in Path(loaded.__file__ or "").resolve().parents:
        raise RuntimeError(f"这个进程已经 import 了 {Path(loaded.__file__ or '?').parent}，不能再换成 {ck.path}")
    if sys.path[:1] != [str(ck.path)]:
        sys.path.insert(0, str(ck.path))
    return ck


@dataclass(frozen=True)
class Task:
    chapter: int
    number: int
    title: str
    symbols: list[str] = field(default_factory=list)
    tests: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"第 {self.chapter} 章 · 任务 {self.number}"


@functools.lru_cache(maxsize=4)
def _parsed(path: Path, stamp: tuple[int, int]) -> dict:
    return tomllib.loads(path.read_text(encoding="utf-8"))


def _tasks_data() -> dict:
    """tests/tasks.toml 解析一次：收集测试时每个测试都要问它（以前每问一次解析一次，一个 pytest 进程 3 秒）。
    按修改时间和大小缓存，文件改了就重新读。调用方只读不改。"""
    st = TASKS.stat()
    return _parsed(TASKS, (st.st_mtime_ns, st.st_size))


def load_tasks() -> dict[int, list[Task]]:
    data = _tasks_data()
    out: dict[int, list[Task]] = {}
    for ch in data["chapter"]:
        out[ch["chapter"]] = [Task(chapter=ch["chapter"], **copy.deepcopy(t)) for t in ch["task"]]
    return out


def keep_symbols() -> list[str]:
    """每一章都原样保留、不做成桩的符号（命令行解析这类脚手架）。"""
    return list(_tasks_data().get("keep", []))


def given_patterns(chapter: int) -> list[str]:
    """这一章给定的文件（fnmatch 模式）：基础设施而不是本章要学的，start 时整份复制，不做成桩。"""
    data = _tasks_data()
    return next((list(ch.get("given", [])) for ch in data["chapter"] if ch["chapter"] == chapter), [])


def is_given(chapter: int, rel: str) -> bool:
    return any(fnmatch.fnmatchcase(rel, p) for p in given_patterns(chapter))


def given_test_patterns(chapter: int) -> list[str]:
    """这一章给定代码自己的测试（tests/tasks.toml 的 given_tests，node id 的 fnmatch 模式）：check 把它们放在
    读者的任务之后单独一行，--task K、--own 都不跑它们。"""
    data = _tasks_data()
    return next((list(ch.get("given_tests", [])) for ch in data["chapter"] if ch["chapter"] == chapter), [])


def is_given_test(chapter: int, nodeid: str) -> bool:
    return any(fnmatch.fnmatchcase(nodeid.split("[")[0], p) for p in given_test_patterns(chapter))


def _specificity(pattern: str) -> int:
    return len(re.sub(r"[*?]|\[[^\]]*\]", "", pattern))


def match(tasks: list[Task], name: str, kind: str) -> list[Task]:
    """name 归属的任务：只有一个是正常的；空表示没人管，多于一个表示清单有歧义。kind 是 "symbols" 或 "tests"。

    一个名字（"文件:符号" 或测试的 node id）归属于模式最具体的那个任务：模式里通配符以外的字符最多者胜。
    """
    best, hits = -1, []
    for t in tasks:
        scores = [_specificity(p) for p in getattr(t, kind) if fnmatch.fnmatchcase(name, p)]
        if not scores:
            continue
        s = max(scores)
        if s > best:
            best, hits = s, [t]
        elif s == best:
            hits.append(t)
    return hits
