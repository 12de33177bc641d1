"""生成本书的示意图（docs/images/*.svg）。图里的数都按代码里的同一个式子算出来，不手填：

    python -m tools.book.make_figures            # 重写全部图；tests/repo/test_figures.py 检查提交的图与它一致

- batch-layout：一个 prefill batch 首尾相接（positions、out_loc 同 generate.py，cu_seqlens 同 torch_backend.py）；
- causal-mask：右下角对齐的因果掩码（torch_backend._attend 的 future 式子）；
- gqa-heads：repeat_interleave 与 repeat，以及 KV 头少于 TP 份数时的复制（LinearQKVMerged.shard）；
- tp-cut：列并行 → 行并行，all-reduce / all-gather 在哪；
- engine-init：Engine 的初始化顺序、假页和假行（engine.py）；
- streaming-load：小模型检查点里真实的键顺序，合并的 qkv / gate_up 怎样等齐（models/weight.py 的 _rename）；
- roadmap-step0 … roadmap-ch6：每章换掉骨架的哪一块。
"""

from __future__ import annotations

import argparse

from tools.book.svgkit import BLUE, DARK, GREEN, GREY, INK, LINE, MUTED, ORANGE, PURPLE, RED, SVG
from tools.manifest import ROOT

OUT = ROOT / "docs" / "images"
REQ_COLORS = [BLUE, GREEN, ORANGE]


def batch_layout() -> SVG:
    # 三个请求一个 prefill batch；page_size = 4，C 的前 3 个 token 已在缓存里（前缀复用）。
    # 页和 CacheManager.allocate_paged 一样从空闲列表 [0, 1, 2, 3] 的尾部拿：C 的前缀早先拿了第 3 页，
    # 这一步按请求顺序 A 拿第 2 页、B 拿第 1 页、C 的第二页是第 0 页
    free = [0, 1, 2, 3]
    c_first = free.pop()
    a, b, c_second = free.pop(), free.pop(), free.pop()
    reqs = [("A", 0, 4, [a]), ("B", 0, 2, [b]), ("C", 3, 5, [c_first, c_second])]  # 名字、cached_len、device_len、页号
    page_size = 4
    rows = [[p * page_size + i for p in pages for i in range(page_size)] for *_, pages in reqs]
    ids, pos, out_loc, indices, who, hist_who = [], [], [], [], [], []
    for k, ((name, cached, dev, _), row) in enumerate(zip(reqs, rows)):
        pos += list(range(cached, dev))  # generate.py：arange(cached_len, device_len)
        ids += [f"{name.lower()}{p}" for p in range(cached, dev)]
        out_loc += row[cached:dev]  # page_table[table_idx, cached_len:device_len]
        indices += row[:dev]  # page_table[table_idx, :device_len]
        who += [k] * (dev - cached)
        hist_who += [k] * dev
    cu_q, cu_k = [0], [0]
    for _, cached, dev, _ in reqs:
        cu_q.append(cu_q[-1] + dev - cached)
        cu_k.append(cu_k[-1] + dev)
    last = [c - 1 for c in cu_q[1:]]  # get_last_indices：cu_seqlens_q[1:] - 1

    svg = SVG(860, 470, "一个 prefill batch 的扁平布局")
    svg.text(430, 30, "一个 prefill batch：3 个请求的新 token 首尾相接（page_size = 4）", 16, bold=True)
    svg.text(20, 58, "A：4 个提示词 token，cached_len = 0 ｜ B：2 个，cached_len = 0 ｜ "
             "C：前 3 个已在 KV 池里（cached_len = 3），新算 2 个", 12, MUTED, anchor="start")
    x0, cw, ch = 170, 52, 28

    def row(y: float, label: str, values: list, colors: list, hi: set | None = None) -> None:
        svg.text(20, y + 19, label, 13, anchor="start", bold=True, mono=True)
        for i, v in enumerate(values):
            emph = hi is not None and i in hi
            svg.box(x0 + i * cw, y, cw - 4, ch, str(v), colors[i], 13, mono=True,
                    stroke=DARK[ORANGE] if emph else MUTED, bold=emph)
            if emph:
                svg.rect(x0 + i * cw - 2, y - 2, cw, ch + 4, "none", DARK[ORANGE], width=2.5)

    def bounds(y: float, label: str, cu: list[int]) -> None:
        svg.text(20, y + 4, label, 13, anchor="start", bold=True, mono=True)
        svg.line(x0 - 2, y, x0 + cu[-1] * cw - 2, y, INK)
        for c in cu:
            svg.line(x0 + c * cw - 2, y - 8, x0 + c * cw - 2, y + 8, DARK[PURPLE], 2.5)
            svg.text(x0 + c * cw - 2, y + 24, str(c), 12, DARK[PURPLE], bold=True, mono=True)

    colors = [REQ_COLORS[k] for k in who]
    row(80, "input_ids", ids, colors)
    row(118, "positions", pos, colors)
    row(156, "out_loc", out_loc, colors)
    bounds(206, "cu_seqlens_q", cu_q)
    row(248, "最后一行", [f"行{i}" if i in last else "" for i in range(len(ids))], colors, set(last))
    svg.text(x0 + cu_q[-1] * cw + 8, 267, f"get_last_indices = {last}", 12, DARK[ORANGE], anchor="start", mono=True)
    svg.text(20, 316, "全部历史（indices，注意力按它从 KV 池取 K/V）：", 13, anchor="start", bold=True)
    row(326, "indices", indices, [REQ_COLORS[k] for k in hist_who])
    bounds(376, "cu_seqlens_k", cu_k)
    svg.caption([f"out_loc 和 indices 都从页表读。页从空闲列表尾部拿：A 第 {a} 页，B 第 {b} 页，"
                 f"C 先后拿了第 {c_first}、{c_second} 页（不连续）。",
                 f"C 的新 token 在位置 {reqs[2][1]}、{reqs[2][2] - 1}；LM head 只取每个请求最后一行。",
                 "cu_seqlens_q 是 extend_len 的前缀和，cu_seqlens_k 是 device_len 的前缀和。"])
    return svg


def causal_mask() -> SVG:
    svg = SVG(860, 330, "右下角对齐的因果掩码")
    svg.text(430, 30, "因果掩码右下角对齐：第 i 个新 query 的位置是 cached_len + i，看得见 key 0 … cached_len + i", 15,
             bold=True)
    cases = [("全新 prefill", 0, 4), ("前缀复用", 3, 3), ("decode", 5, 1)]  # 标题、cached_len、新 token 数
    cell, x = 30, 40
    for title, cached, n_q in cases:
        n_k = cached + n_q
        svg.text(x, 58, title, 13, anchor="start", bold=True)
        svg.text(x, 76, f"cached_len={cached}，新 {n_q} 个", 12, MUTED, anchor="start")
        top = 96
        for j in range(n_k):
            svg.text(x + 30 + j * cell + cell / 2, top - 8, f"k{j}", 11, MUTED, mono=True)
        for i in range(n_q):
            q_pos = cached + i
            svg.text(x + 26, top + i * cell + 20, f"q{q_pos}", 11, MUTED, anchor="end", mono=True)
            for j in range(n_k):
                future = j > q_pos  # torch_backend._attend：arange(n_k)[None, :] > q_pos[:, None]
                fill = GREY if future else (GREEN if j < cached else BLUE)
                svg.box(x + 30 + j * cell, top + i * cell, cell - 2, cell - 2, "×" if future else "", fill, 13,
                        color=DARK[RED])
        if cached:
            svg.path(f"M{x + 30 + cached * cell - 1},{top - 2} V{top + n_q * cell}", DARK[GREEN], 2)
        x += 60 + n_k * cell + 40
    for i, (fill, label) in enumerate([(GREEN, "缓存里的历史 key"), (BLUE, "这一步新写的 key"),
                                       (GREY, "× 未来：-inf")]):
        svg.rect(40 + i * 200, 262, 18, 18, fill)
        svg.text(64 + i * 200, 276, label, 12, anchor="start")
    svg.caption(["矩阵的行是新 query，列是这个请求的全部 key（indices 取出的历史 + 刚写进池的新 token）。"
                 "cached_len = 0 时就是普通的下三角。"])
    return svg


def gqa_heads() -> SVG:
    h_q, h_kv, tp = 8, 2, 4
    groups = h_q // h_kv
    svg = SVG(860, 470, "GQA：q 头到 KV 头的对应，以及张量并行下 KV 头的复制")
    svg.text(430, 30, f"GQA：H_q = {h_q}，H_kv = {h_kv}，每 {groups} 个 q 头共用一个 KV 头", 16, bold=True)
    kv_fill = [PURPLE, ORANGE]
    x0, cw = 230, 70

    def mapping(y: float, title: str, kv_of: list[int], ok: bool) -> None:
        svg.text(20, y + 20, title, 13, anchor="start", bold=True, mono=True)
        for h in range(h_q):
            svg.box(x0 + h * cw, y, cw - 8, 28, f"q{h}", BLUE, 12, mono=True)
            right = kv_of[h] == h // groups
            svg.box(x0 + h * cw, y + 40, cw - 8, 28, f"K{kv_of[h]}", kv_fill[kv_of[h]], 12, mono=True,
                    stroke=MUTED if right else DARK[RED])
            svg.line(x0 + h * cw + 31, y + 29, x0 + h * cw + 31, y + 39, MUTED)
        svg.text(20, y + 60, "对" if ok else "错：和 HF 不同", 12, DARK[GREEN] if ok else DARK[RED], anchor="start",
                 bold=True)

    mapping(56, "repeat_interleave", [h // groups for h in range(h_q)], True)  # torch_backend._attend 用的
    mapping(146, "repeat", [h % h_kv for h in range(h_q)], False)
    svg.text(20, 258, f"张量并行 TP = {tp}：q 头平分（每份 {h_q // tp} 个），KV 头只有 {h_kv} 个不够分，"
             "每份拿 1 个、几份共用（复制）", 13, anchor="start", bold=True)
    for r in range(tp):
        x = 40 + r * 205
        q = list(range(r * h_q // tp, (r + 1) * h_q // tp))
        kv = r * h_kv // tp  # LinearQKVMerged.shard：first = rank * num_kv_heads // tp
        svg.rect(x, 274, 190, 116, "#ffffff", LINE)
        svg.text(x + 95, 294, f"rank {r}", 13, bold=True)
        for i, h in enumerate(q):
            svg.box(x + 16 + i * 84, 306, 72, 28, f"q{h}", BLUE, 12, mono=True)
            svg.line(x + 52 + i * 84, 335, x + 95, 349, MUTED)
        svg.box(x + 59, 350, 72, 28, f"K{kv} V{kv}", kv_fill[kv], 12, mono=True)
    svg.caption(["rank r 的 KV 头 = r · H_kv // TP（LinearQKVMerged.shard）："
                 "rank 0、1 都存 K0/V0，rank 2、3 都存 K1/V1；",
                 "每个 rank 的 q 头正好属于它存的那个 KV 头的组，所以注意力在本 rank 内算完，不用通信。"])
    return svg


FIGURES = {"batch-layout": batch_layout, "causal-mask": causal_mask, "gqa-heads": gqa_heads}


def main() -> None:
    # 没有参数：只认 --help（书里写着这条命令，测试带 --help 跑它）
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    from tools.book.figures_more import MORE

    for name, make in {**FIGURES, **MORE}.items():
        make().save(OUT / f"{name}.svg")
        print(f"docs/images/{name}.svg")


if __name__ == "__main__":
    main()
