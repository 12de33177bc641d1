"""第 2 章页面上那张 config.json 的键的表（tests/ch2/config_keys.toml）就是参考代码读的键：

- ch2_ops 里 cfg["X"]、cfg.get("X")、model.cfg["X"] 读的键，和从 cfg.get("D") 取出的字典再取的键（记成 D.X），
  正好是清单上的（read_config 自己算出来再存回去的键，比如 theta，不算）；
- 清单上必需的键在第 2 章的每个小模型的 config.json 里都有（在它写的某一处），rope_theta 的两处都有小模型用；
- 页面任务 5 里有这张表（占位符下面一行告诉读原文件的人表在哪里）。
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

from tools.book import config_keys
from tools.manifest import by_name

ROOT = Path(__file__).resolve().parents[2]
NAMES = ("cfg",)


def _is_cfg(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id in NAMES or isinstance(node, ast.Attribute) and node.attr in NAMES


def _get_key(node: ast.AST) -> str | None:
    """cfg.get("X") 的 X。"""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
            and _is_cfg(node.func.value) and node.args and isinstance(node.args[0], ast.Constant):
        return node.args[0].value
    return None


def keys_read(sources: list[str]) -> set[str]:
    got, stored, dicts = set(), set(), {}
    trees = [ast.parse(s) for s in sources]
    for tree in trees:  # rope_params = cfg.get("rope_parameters") or {} -> rope_params 是 rope_parameters 那个字典
        for n in ast.walk(tree):
            if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name):
                inner = [k for m in ast.walk(n.value) if (k := _get_key(m))]
                if inner:
                    dicts[n.targets[0].id] = inner[0]
    for tree in trees:
        for n in ast.walk(tree):
            if (k := _get_key(n)) is not None:
                got.add(k)
            if isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant):
                if _is_cfg(n.value):
                    (stored if isinstance(n.ctx, ast.Store) else got).add(n.slice.value)
                elif isinstance(n.value, ast.Name) and n.value.id in dicts:
                    got.add(f"{dicts[n.value.id]}.{n.slice.value}")
    gets = {k for tree in trees for n in ast.walk(tree) if (k := _get_key(n))}
    return got - (stored - gets)  # 自己算出来存回去、从没从 config.json 取过的键不算


def listed(folder: str) -> set[str]:
    out = set()
    for k in config_keys.load(folder):
        out |= {k.name if w == "" else f"{w}.{k.name}" for w in k.where} | {w for w in k.where if w}
    return out


def test_the_list_is_what_chapter2_reads():
    ck = by_name("ch2")
    sources = [p.read_text(encoding="utf-8") for p in sorted(ck.path.rglob("*.py"))]
    read = keys_read(sources)
    assert "theta" not in read and "head_dim" in read and "rope_parameters.rope_theta" in read, read
    assert read == listed("ch2"), (f"代码读了清单上没有的 {sorted(read - listed('ch2'))}，"
                                   f"清单上有代码不读的 {sorted(listed('ch2') - read)}（tests/ch2/config_keys.toml）")


def test_the_tiny_models_have_every_required_key(tiny_models):
    ck = by_name("ch2")
    configs = {f: json.loads((tiny_models[f] / "config.json").read_text()) for f in ck.families}
    places: dict[str, set[str]] = {}
    for k in config_keys.load("ch2"):
        for family, cfg in configs.items():
            here = {w for w in k.where if k.name in (cfg if w == "" else cfg.get(w) or {})}
            assert here or k.default, f"{family} 的 config.json 里没有必需的 {k.name}"
            places.setdefault(k.name, set()).update(here)
    assert places["rope_theta"] == {"", "rope_parameters"}, "rope_theta 的两处要各有一个小模型用"


def test_the_check_sees_a_key_the_list_lacks():
    """自检：代码多读一个键、或者换个字典取，都和清单对不上。"""
    src = 'def f(cfg):\n    d = cfg.get("rope_parameters") or {}\n    cfg["theta"] = d["rope_theta"]\n' \
          '    return cfg["hidden_size"], cfg["theta"], model.cfg["vocab_size"]\n'
    assert keys_read([src]) == {"rope_parameters", "rope_parameters.rope_theta", "hidden_size", "vocab_size"}


def test_chapter2_page_renders_the_table():
    page = (ROOT / "docs" / "ch2.md").read_text(encoding="utf-8")
    task5 = page.split("### 任务 5", 1)[1].split("\n## ", 1)[0]
    mark = '{{ config_keys("ch2") }}'
    assert f"{mark}\n{config_keys.source_note('ch2', 'ch2')}\n" in task5, f"ch2.md 任务 5 要有 {mark} 和下面那行说明"
    from tools.book.mkdocs_hooks import render_config_keys

    rendered = render_config_keys(page)
    assert mark not in rendered and config_keys.SOURCE_NOTE not in rendered
    assert "`rope_parameters` 字典里" in rendered and "`tie_word_embeddings`" in rendered
