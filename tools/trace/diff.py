"""--against 的比较：两份记录第一个不同的步和字段，说成一句中文（"第 3 步 decode：out_loc[1] 是 17，参考是 21"）。

按 batch 的填写顺序比：phase、每个请求的字段、positions / input_ids / out_loc、页表、注意力元数据、采样结果、
前向之后的长度。key 是 HTML 里那个格子的名字，用来高亮同一处。
"""

from __future__ import annotations

from typing import Any


def _list_diff(name: str, a: Any, b: Any, key: str) -> tuple[str, str] | None:
    """两个（可能嵌套的）列表第一个不同的地方：(说明, 高亮用的 key)。"""
    if a is None or b is None:
        if a is None and b is None:
            return None
        return (f"你的检查点没有 {name}，参考有" if a is None else f"参考没有 {name}，你的检查点有"), key
    if not isinstance(a, list) or not isinstance(b, list):
        return (f"{name} 是 {a}，参考是 {b}", key) if a != b else None
    for i, (x, y) in enumerate(zip(a, b)):
        if (d := _list_diff(f"{name}[{i}]", x, y, f"{key}:{i}")) is not None:
            return d
    if len(a) != len(b):
        return f"{name} 有 {len(a)} 个，参考有 {len(b)} 个", key
    return None


REQ_FIELDS = ("uid", "table_idx", "cached_len", "device_len", "extend_len")


def _step_diff(s: dict, r: dict) -> tuple[str, str, str] | None:
    """一步之内按 batch 的填写顺序比：(说明, 状态 prepared/after, key)。"""
    checks: list[tuple[str, Any, Any, str, str]] = [("phase", s["phase"], r["phase"], "phase", "prepared"),
                                                    ("请求数", len(s["reqs"]), len(r["reqs"]), "phase", "prepared")]
    for i, (x, y) in enumerate(zip(s["reqs"], r["reqs"])):
        checks += [(f"请求 {i} 的 {f}", x[f], y[f], f"req:{i}:{f}", "prepared") for f in REQ_FIELDS]
    checks += [(f, s[f], r[f], f, "prepared") for f in ("positions", "input_ids", "out_loc")]
    checks.append(("页表", s["page_table"], r["page_table"], "pt", "prepared"))
    attn_a, attn_b = s["attn"] or {}, r["attn"] or {}
    for k in [k for k in attn_b if k in attn_a] + [k for k in attn_b if k not in attn_a]:
        checks.append((f"attn_metadata.{k}", attn_a.get(k), attn_b[k], f"attn:{k}", "prepared"))
    checks.append(("采样出的 token", s["sampled"], r["sampled"], "sampled", "after"))
    for i, (x, y) in enumerate(zip(s.get("after") or [], r.get("after") or [])):
        checks += [(f"前向之后请求 {i} 的 {f}", x[f], y[f], f"after:{i}:{f}", "after") for f in REQ_FIELDS[2:]]
    for name, a, b, key, state in checks:
        if (d := _list_diff(name, a, b, key)) is not None:
            return d[0] + _where(s, d[1]), state, d[1]
    return None


def _where(s: dict, key: str) -> str:
    """batch 里第 j 个新 token 是哪个请求的哪个位置：'（请求 0 的位置 12）'。"""
    name, _, j = key.partition(":")
    if name not in ("positions", "input_ids", "out_loc") or not j.isdigit() or s["positions"] is None:
        return ""
    j, start = int(j), 0
    for r in s["reqs"]:
        if j < start + r["extend_len"]:
            return f"（请求 {r['uid']} 的位置 {s['positions'][j]}）" if j < len(s["positions"]) else ""
        start += r["extend_len"]
    return "（凑批的假请求）"


def first_difference(ours: dict, ref: dict) -> dict | None:
    """第一个不同的步和字段；完全相同时 None。step 从 0 数，message 里从 1 数。"""
    for k, r in enumerate(ref["steps"]):
        head = f"第 {k + 1} 步 {r['phase']}"
        if k >= len(ours["steps"]):
            why = f"它出错了：{ours['error']}" if ours["error"] else "它提前停了"
            return {"step": k, "state": "prepared", "key": "step",
                    "message": f"{head}：你的检查点没有走到这一步（{why}）"}
        s = ours["steps"][k]
        if "after" not in s and "after" in r:
            return {"step": k, "state": "after", "key": "step",
                    "message": f"{head}：你的检查点前向出错了：{ours['error'] or '没有写回采样结果'}"}
        if (d := _step_diff(s, r)) is not None:
            return {"step": k, "state": d[1], "key": d[2], "message": f"{head}：{d[0]}"}
    if len(ours["steps"]) > len(ref["steps"]):
        k = len(ref["steps"])
        return {"step": k, "state": "prepared", "key": "step",
                "message": f"第 {k + 1} 步：参考已经结束，你的检查点多走了一步"}
    if ours["error"] and not ref["error"]:
        return {"step": max(0, len(ours["steps"]) - 1), "state": "after", "key": "step",
                "message": f"全部步都一样，但你的检查点最后出错了：{ours['error']}"}
    return None
