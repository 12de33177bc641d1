"""读 checkpoints.toml：课程有哪些检查点、每个检查点支持什么、改了哪些文件。"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "checkpoints.toml"
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


def find_checkpoint(spec: str, as_chapter: str | None = None) -> Checkpoint:
    """spec 是清单里的名字（或 ch3 这样的前缀），或者读者自己的目录（此时用 as_chapter 指定按哪一章的要求测）。"""
    manifest = load_manifest()

    def by_name(s: str) -> Checkpoint | None:
        hits = [c for c in manifest if c.name == s or c.name.split("_")[0] == s]
        return hits[0] if len(hits) == 1 else None

    if (ck := by_name(spec)) is not None and as_chapter is None:
        return ck
    path = Path(spec).resolve()
    if not path.is_dir():
        names = ", ".join(c.name for c in manifest)
        raise SystemExit(f"找不到检查点 {spec!r}：可选 {names}，或者一个目录（配合 --as chN）")
    base = by_name(as_chapter or path.name)
    if base is None:
        raise SystemExit(f"{path} 不是清单里的检查点：请用 --as step0/ch1/…/ch6 说明按哪一章的要求测试")
    return Checkpoint(**{**base.__dict__, "path": path})


def checkpoint_files(path: Path) -> dict[str, bytes]:
    """检查点目录里的全部文件（相对路径 -> 内容），跳过缓存目录。"""
    out = {}
    for p in sorted(path.rglob("*")):
        if p.is_file() and not IGNORED_PARTS.intersection(p.parts) and p.suffix != ".pyc":
            out[p.relative_to(path).as_posix()] = p.read_bytes()
    return out
