"""tools.book.make_figures 的其余几张图：张量并行的切法、Engine 的初始化顺序、流式加载的时间线、每章的路线图。"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from tools.manifest import use_checkpoint
from tools.book.svgkit import BLUE, DARK, GREEN, GREY, INK, LINE, MUTED, ORANGE, PURPLE, RED, SVG


def tp_cut() -> SVG:
    svg = SVG(860, 500, "张量并行：列并行 → 行并行，通信点在哪")
    svg.text(430, 30, "列并行接行并行：中间不通信，行并行之后一次 all-reduce（TP = 2）", 16, bold=True)
    # 上半：MLP 的矩阵切法
    svg.box(30, 70, 70, 120, "x", GREY, 14, mono=True)
    svg.text(65, 208, "(N, hidden)", 11, MUTED, mono=True)
    svg.text(65, 224, "每个 rank 都有", 11, MUTED)
    for r, fill in enumerate((BLUE, ORANGE)):
        y = 64 + r * 70
        svg.box(150, y, 130, 56, f"gate_up 第 {r} 份", fill, 12)
        svg.box(330, y, 100, 56, f"h{r}", fill, 13, mono=True)
        svg.box(480, y, 130, 56, f"down 第 {r} 份", fill, 12)
        svg.box(660, y, 60, 56, f"y{r}", fill, 13, mono=True)
        svg.line(100, 130, 148, y + 28, MUTED, arrow=True)
        svg.line(280, y + 28, 328, y + 28, MUTED, arrow=True)
        svg.line(430, y + 28, 478, y + 28, MUTED, arrow=True)
        svg.line(610, y + 28, 658, y + 28, MUTED, arrow=True)
        svg.line(720, y + 28, 760, 130, DARK[RED], arrow=True)
    svg.box(762, 100, 80, 60, "Σ y_r", RED, 14, mono=True, bold=True)
    svg.text(802, 178, "all-reduce", 12, DARK[RED], bold=True, mono=True)
    svg.text(215, 212, "列并行：按输出切", 12, DARK[BLUE], bold=True)
    svg.text(215, 228, "weight 的行分给各 rank", 11, MUTED)
    svg.text(380, 212, "本 rank 的一段", 12, MUTED)
    svg.text(380, 228, "不通信", 11, MUTED)
    svg.text(545, 212, "行并行：按输入切", 12, DARK[ORANGE], bold=True)
    svg.text(545, 228, "weight 的列分给各 rank", 11, MUTED)
    svg.text(690, 212, "部分和", 12, MUTED)
    # 下半：一层里的通信点
    svg.text(20, 268, "一次前向里的通信点（TP = 1 时一次都没有）：", 13, anchor="start", bold=True)
    steps = [("词嵌入", "按词表切", "all-reduce"), ("qkv_proj", "列并行", ""), ("注意力", "本 rank 的头", ""),
             ("o_proj", "行并行", "all-reduce"), ("gate_up", "列并行", ""), ("down_proj", "行并行", "all-reduce"),
             ("lm_head", "按词表切", "all-gather")]
    x = 20
    for i, (name, how, comm) in enumerate(steps):
        fill = RED if comm else (BLUE if "列" in how else GREY)
        svg.box(x, 290, 104, 36, name, fill, 12, mono=True)
        svg.text(x + 52, 344, how, 11, MUTED)
        if comm:
            svg.text(x + 52, 362, comm, 12, DARK[RED], bold=True, mono=True)
        if i == 1:
            svg.rect(x - 4, 282, 2 * 118 + 112, 90, "none", LINE, dash=True)
        if i < len(steps) - 1:
            svg.line(x + 104, 308, x + 116, 308, MUTED, arrow=True)
        x += 118
    svg.text(178, 390, "× 层数；每层另有 RMSNorm、RoPE、残差：各 rank 都完整地算一遍（不切）", 12, MUTED,
             anchor="start")
    svg.caption(["列并行的输出正好是行并行要的那一段输入，所以一对列 → 行只在末尾 all-reduce 一次："
                 "每层两次（o_proj、down_proj）。",
                 "词嵌入每个 rank 只查自己那段词表、别的 id 记 0，求和（all-reduce）拼出完整向量；",
                 "lm_head 每个 rank 算自己那段词表的 logits，all-gather 拼成完整的一行再采样。"])
    return svg


def engine_init() -> SVG:
    steps = [("check_tp()", "切不开就先报错"), ("set_tp_info", "本进程的 rank / size"),
             ("设备 + 线程数", "cuda:rank 或 CPU"), ("Context", "set_global_ctx"),
             ("进程组", "只在 TP > 1 时建"), ("模型", "meta 上构造，流式加载"),
             ("KV 池", "先定页数，再多分 1 页"), ("页表", "max_running_req + 1 行"),
             ("注意力后端", "构造时读 ctx.kv_cache"), ("Sampler", ""), ("dummy_req", "table_idx = 最后一行"),
             ("GraphRunner", "拿着 dummy_req 凑批")]
    svg = SVG(920, 470, "Engine 的初始化顺序，以及留给假请求的一页和一行")
    svg.text(460, 30, "Engine.__init__ 的顺序：后一步要用前一步的东西", 16, bold=True)
    for i, (name, note) in enumerate(steps):
        col, r = divmod(i, 6)
        x, y = 20 + col * 300, 52 + r * 46
        dummy = name in ("KV 池", "页表", "dummy_req")
        svg.box(x, y, 120, 32, name, ORANGE if dummy else BLUE, 12, bold=dummy)
        svg.text(x + 128, y + 21, note, 11, MUTED, anchor="start")
        if r < 5:
            svg.line(x + 60, y + 32, x + 60, y + 44, MUTED, arrow=True)
    svg.path("M80,314 V326 H300 V42 H380 V50", MUTED, arrow=True)
    # 右边：假页和假行
    x0 = 620
    svg.text(x0, 62, "KV 池（page_size = 2，num_pages = 4）", 12, anchor="start", bold=True)
    for p in range(5):
        fill = ORANGE if p == 4 else GREEN
        for s in range(2):
            slot = p * 2 + s
            svg.box(x0 + slot * 28, 72, 26, 26, str(slot), fill, 11, mono=True)
    svg.text(x0 + 4 * 56 + 28, 116, "假页", 12, DARK[ORANGE], bold=True)
    svg.text(x0, 150, "页表（max_running_req = 3）", 12, anchor="start", bold=True)
    for r in range(4):
        y = 160 + r * 30
        dummy = r == 3
        svg.text(x0 + 18, y + 18, f"行{r}", 11, MUTED, anchor="end")
        for c in range(8):
            svg.box(x0 + 24 + c * 28, y, 26, 26, "8" if dummy else "", ORANGE if dummy else "#ffffff", 11, mono=True)
    svg.text(x0 + 260, 296, "假行：全填 8", 12, DARK[ORANGE], bold=True, anchor="end")
    svg.path(f"M{x0 + 250},{263} C{x0 + 285},220 {x0 + 285},130 {x0 + 240},100", DARK[ORANGE], arrow=True)
    svg.text(x0, 330, "8 = num_pages × page_size：假页的第一个槽位", 11, MUTED, anchor="start")
    svg.caption(["KV 池和页表都比真请求用得到的多一份：凑批的假请求（dummy_req）的 KV 全写进假页，",
                 "不会碰到任何真请求的槽位。注意力后端构造时就拿 ctx.kv_cache，所以必须排在 KV 池之后；",
                 "Context 要在模型之前设好：模型的 forward() 不接参数，从 Context 读当前 batch。"])
    return svg


def _weight_module():
    """第 6 章的 models.weight，以及模型声明的 packed_modules_mapping（_rename 要它）。"""
    use_checkpoint("ch6_engine_sampler")
    weight = importlib.import_module("minisgl.models.weight")
    packed = importlib.import_module("minisgl.models.decoder").DecoderForCausalLM.packed_modules_mapping
    return weight, packed


def _load_keys(weight) -> list[tuple[str, str]]:
    """小模型 qwen3-untied 检查点里 load_weight 读到的键的真实顺序：(分片文件名, 键)。"""
    from safetensors import safe_open

    from tools.models.make_tiny_models import make_all

    path = make_all(names=["qwen3-untied"])["qwen3-untied"]
    out = []
    for file in weight.safetensors_files(str(path)):
        with safe_open(file, framework="pt") as f:
            out += [(Path(file).name, k) for k in f.keys()]
    return out


def _short(name: str) -> str:
    return name.replace("model.layers.", "L").replace("model.", "").replace(".weight", "")


def streaming_load() -> SVG:
    weight, packed = _weight_module()
    keys = _load_keys(weight)
    keys = keys[:1 + next(i for i, (_, k) in enumerate(keys) if k == "model.layers.1.mlp.up_proj.weight")]
    svg = SVG(900, 110 + 26 * len(keys) + 64, "流式加载：按文件顺序读，合并的权重等齐了再交出")
    svg.text(450, 30, "load_weight 按分片、按键的顺序逐个读（qwen3-untied 小模型的前 " + str(len(keys)) + " 个键）",
             16, bold=True)
    for x, h in ((20, "分片"), (80, "读到的键"), (430, "交出（yield）"), (690, "pending 里等着的")):
        svg.text(x, 64, h, 13, anchor="start", bold=True)
    pending: dict[str, set[int]] = {}
    prev_file = ""
    for i, (file, key) in enumerate(keys):
        y = 74 + i * 26
        name, part, total = weight._rename(key, packed)
        if file != prev_file:
            svg.line(16, y, 884, y, LINE, 1)
            svg.text(20, y + 17, file.split("-")[1].lstrip("0") + " / " + file.split("-")[3].split(".")[0].lstrip("0"),
                     11, MUTED, anchor="start", mono=True)
            prev_file = file
        svg.text(80, y + 17, _short(key), 12, INK, anchor="start", mono=True)
        out, fill = "", None
        if total == 1:
            out, fill = _short(name), GREEN
        else:
            pending.setdefault(name, set()).add(part)
            if len(pending[name]) == total:
                out, fill = _short(name) + "（拼好）", ORANGE
                del pending[name]
        if fill:
            svg.box(430, y + 2, 250, 21, out, fill, 11, mono=True)
        waiting = [f"{_short(n).replace('.mlp', '').replace('.self_attn', '').replace('_proj', '')} "
                   f"{len(p)}/{3 if 'qkv' in n else 2}" for n, p in pending.items()]
        if waiting:
            svg.box(690, y + 2, 194, 21, "，".join(waiting), PURPLE, 11, mono=True)
    svg.caption(["合并的几块不一定挨着，甚至不在同一个分片（L1 的 gate_proj 在分片 3，up_proj 在分片 4）："
                 "先到的切好放进 pending，",
                 "凑齐才按 q、k、v / gate、up 的顺序拼成一块交出。其余张量切好立刻交出（复制一份），",
                 "所以任何时刻内存里只有已交出的权重 + pending 里没凑齐的几块。"])
    return svg


PARTS = [("一个 ids、一个 pos 张量", "Req / Batch / Context"), ("四个函数 + 权重 dict", "算子层 BaseOP"),
         ("safe_open 一次读完", "ModelConfig + 流式加载"), ("每层一个 list，torch.cat", "KV 池 + 页表"),
         ("einsum + 显式掩码", "注意力后端"), ("argmax", "Engine + Sampler")]


def roadmap(chapter: int) -> SVG:
    title = "第 0 步：六个朴素部件" if chapter == 0 else f"第 {chapter} 章换掉骨架的哪一块"
    svg = SVG(760, 60 + 40 * len(PARTS) + 30, title)
    svg.text(380, 30, title + ("，后面六章一章换一块" if chapter == 0 else ""), 15, bold=True)
    for i, (naive, formal) in enumerate(PARTS):
        ch, y = i + 1, 48 + i * 40
        done, now = ch < chapter, ch == chapter
        svg.text(22, y + 20, f"第 {ch} 章", 12, DARK[ORANGE] if now else MUTED, anchor="start", bold=now)
        svg.box(90, y, 260, 30, naive, GREY if done else (ORANGE if now else "#ffffff"), 12, dash=done,
                color=MUTED if done else INK)
        svg.line(352, y + 15, 408, y + 15, DARK[ORANGE] if now else LINE, 2 if now else 1.5, arrow=True)
        svg.box(410, y, 260, 30, formal, GREEN if done else (ORANGE if now else "#ffffff"), 12, dash=ch > chapter,
                color=INK if ch <= chapter else MUTED, bold=now)
        label = "已换" if done else ("本章" if now else "")
        if label:
            svg.text(682, y + 20, label, 12, DARK[GREEN] if done else DARK[ORANGE], anchor="start", bold=True)
    svg.caption(["左：第 0 步骨架里的朴素部件；右：换成的正式模块。每一章都和 HF 逐 token 一致。"])
    return svg


MORE = {"tp-cut": tp_cut, "engine-init": engine_init, "streaming-load": streaming_load,
        **{f"roadmap-{'step0' if n == 0 else f'ch{n}'}": (lambda n=n: roadmap(n)) for n in range(7)}}
