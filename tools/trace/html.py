"""把 tools.trace 的记录写成一个自带脚本和样式的 HTML：双击就能打开，不取任何网络资源。

脚本和样式在 tools/trace/assets/，原样内联；记录放在一个 application/json 的 script 标签里。
"""

from __future__ import annotations

import html
import json
from pathlib import Path

ASSETS = Path(__file__).resolve().parent / "assets"


def _roles(traces: list[dict], diff_mode: bool) -> list[str]:
    if diff_mode:
        return ["你的", "参考"]
    return ["" for _ in traces]


def render(traces: list[dict], diff: dict | None, against: bool | None = None) -> str:
    """traces：一份或几份记录（几个 page_size 并排，或 你的 + 参考）；diff：first_difference 的结果。"""
    against = len(traces) == 2 and traces[0]["page_size"] == traces[1]["page_size"] if against is None else against
    data = {"traces": [{**t, "role": role} for t, role in zip(traces, _roles(traces, against))], "diff": diff}
    t0 = traces[0]
    title = f"引擎的每一步 · {t0['checkpoint']}"
    meta = (f"模型 {t0['model']} · {len(t0['prompts'])} 个请求 · 每个最多生成 {t0['max_new_tokens']} 个 token · "
            f"page_size {'、'.join(dict.fromkeys(str(t['page_size']) for t in traces))}")
    if against:
        meta = f"{traces[0]['checkpoint']} 对照参考 {traces[1]['checkpoint']} · " + meta
    if diff is not None:
        banner = (f'<div class="diff" id="diff">第一个不同：<b>{html.escape(diff["message"])}</b> '
                  f'<button id="jump">跳到这一步</button>（红框是你的，虚线框是参考的同一处）</div>')
    elif against:
        banner = '<div class="diff same" id="diff">和参考逐步逐字段相同。</div>'
    else:
        banner = ""
    errors = "".join(f'<p class="error">{html.escape(t["checkpoint"])} 在第 {len(t["steps"])} 步停下：'
                     f'{html.escape(t["error"])}</p>' for t in traces if t.get("error"))
    payload = json.dumps(data, ensure_ascii=False).replace("</", "<\\/")
    css = (ASSETS / "trace.css").read_text(encoding="utf-8")
    js = (ASSETS / "trace.js").read_text(encoding="utf-8")
    return f"""<!doctype html>
<html lang="zh-CN" data-theme="light">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title>
<style>
{css}</style>
</head>
<body>
<h1>{html.escape(title)}</h1>
<p class="meta">{html.escape(meta)}</p>
{banner}{errors}
<nav class="controls">
<button id="prev" title="←">◀ 上一步</button>
<input type="range" id="slider" min="0" max="0" value="0" aria-label="第几步">
<button id="next" title="→">下一步 ▶</button>
<span id="label"></span>
<span class="keys">← → 换步；鼠标停在槽位上看它属于谁</span>
</nav>
<div class="panels" id="panels"></div>
<div id="tip"></div>
<script type="application/json" id="trace-data">{payload}</script>
<script>
{js}</script>
</body>
</html>
"""
