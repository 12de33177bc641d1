"""一章的代码从 config.json 读哪些键：tests/chN/config_keys.toml（现在只有第 2 章）。

页面上的 {{ config_keys("ch2") }}（连同下面那行 SOURCE_NOTE 开头的说明）由 tools/book/mkdocs_hooks.py 换成
render_table 的表；tests/ch2/test_config_keys.py 把小模型的 config.json 删到只剩这些键（minimal_config），
tests/repo/test_config_keys.py 查清单和参考检查点的代码真读的键一致。页面、测试、代码读的是同一份清单。
"""

from __future__ import annotations

from dataclasses import dataclass

from tools.manifest import ROOT, tomllib

SOURCE_NOTE = "> 这里是一张 `config.json` 的键的表，只在构建好的书里显示"


@dataclass(frozen=True)
class Key:
    name: str
    where: tuple[str, ...]  # "" 是顶层，别的是顶层那个字典的名字
    what: str
    default: str | None = None  # 缺了时怎么办；None 是必需的


def data_file(folder: str):
    return ROOT / "tests" / folder / "config_keys.toml"


def load(folder: str) -> list[Key]:
    data = tomllib.loads(data_file(folder).read_text(encoding="utf-8"))
    return [Key(k["name"], tuple(k["where"]), k["what"], k.get("default")) for k in data["key"]]


def source_note(folder: str, page: str) -> str:
    """占位符下面紧跟的一行：读原文件的人看这里，构建时和占位符一起换成表。"""
    return (f"{SOURCE_NOTE}；读原文件时看 [tests/{folder}/config_keys.toml](../tests/{folder}/config_keys.toml)，"
            f"或者在仓库根目录运行 `.venv/bin/mkdocs serve`，浏览器打开 http://127.0.0.1:8000/{page}/ 。")


def _where(k: Key) -> str:
    places = ["顶层" if w == "" else f"`{w}` 字典里（`{w}[\"{k.name}\"]`）" for w in k.where]
    return "，或者 ".join(places)


def render_table(folder: str) -> str:
    rows = ["| 键 | 在哪里 | 做什么 | 缺了时 |", "|---|---|---|---|"]
    for k in load(folder):
        cells = [f"`{k.name}`", _where(k), k.what, k.default or "必需"]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows)


def minimal_config(folder: str, full: dict, keep: tuple[str, ...] = ()) -> dict:
    """full（一份 config.json）里只留清单上的键（在它原来的那一处），外加 keep 里的顶层键。"""
    out = {k: full[k] for k in keep if k in full}
    for k in load(folder):
        for w in k.where:
            if w == "" and k.name in full:
                out[k.name] = full[k.name]
            elif w and k.name in (full.get(w) or {}):
                out.setdefault(w, {})[k.name] = full[w][k.name]
    return out
