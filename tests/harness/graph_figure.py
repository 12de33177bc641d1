"""第 6 章任务 3 的图：在模拟的 CUDA 上真建一个开着 CUDA 图的引擎、真录、真放一步，图里的数都是这次运行读出来的。

    python -m tests.harness.graph_figure      # 写 docs/images/cuda-graph-replay.svg

引擎是第 6 章检查点的 Engine（小模型 qwen3-tied，max_running_req=4，page_size=1），调度器的一步用检查点里的
prepare_batch / process_output。放在 tests/ 里：要用模拟的 CUDA（tests/harness/cuda_emu），tools/ 不 import tests/。
带 CUDA 的 torch 上模拟用不了（那里有真 GPU），这时 problem() 说一句原因，命令和测试都跳过。
"""

from __future__ import annotations

from tools.book.svgkit import BLUE, DARK, GREEN, GREY, INK, MUTED, ORANGE, PURPLE, SVG
from tools.manifest import ROOT, use_checkpoint

NAME = "cuda-graph-replay"
OUT = ROOT / "docs" / "images" / f"{NAME}.svg"
PROMPTS = [[17, 42, 99, 7], [5, 300], [64, 65, 66]]  # 三个请求 A、B、C 的提示词（token id）
REQ_COLORS = [BLUE, GREEN, ORANGE, GREY]  # A、B、C、假请求
COLS = 7  # 静态缓冲画出的列数（页表宽 32 列，右边都一样：补的、遮掉的）


def problem() -> str | None:
    """这台机器上画不了的原因（模拟的 CUDA 用不了），能画时 None。"""
    from tests.harness.cuda_emu import guard_problem

    return guard_problem()


def _rows(t) -> list:
    return t.cpu().tolist()


def run() -> dict:
    """建引擎、录图、prefill 一步、decode 一步（重放），把图里要画的数都读出来。"""
    use_checkpoint("ch6_engine_sampler")
    import torch

    from minisgl.core import SamplingParams, get_global_ctx
    from minisgl.distributed import DistributedInfo
    from minisgl.engine import Engine, EngineConfig
    from minisgl.scheduler import CacheManager, TableManager, add_req, prepare_batch, process_output
    from tests.harness.cuda_emu import emulated_cuda
    from tools.models.make_tiny_models import make_all

    path = make_all(names=["qwen3-tied"])["qwen3-tied"]
    with emulated_cuda():
        graph_cls, captured = torch.cuda.CUDAGraph, []
        real_end = graph_cls.capture_end

        def capture_end(self):  # 记下录图的先后
            captured.append(self)
            real_end(self)

        graph_cls.capture_end = capture_end
        try:
            engine = Engine(EngineConfig(model_path=str(path), tp_info=DistributedInfo(0, 1), dtype=torch.float32,
                                         max_running_req=4, page_size=1, num_page_override=64,
                                         max_seq_len_override=32, device="cuda"))
        finally:
            graph_cls.capture_end = real_end
        runner, backend = engine.graph_runner, engine.attn_backend
        bs_of = {id(g): bs for bs, g in runner.graph_map.items()}
        data = {"sizes": runner.graph_bs_list, "order": [(bs_of[id(g)], len(g.ops)) for g in captured],
                "width": engine.page_table.shape[1], "dummy_slot": engine.num_pages * engine.config.page_size}

        def snapshot(key: str) -> None:
            buf, cap = runner.buffer, backend.capture
            data[key] = {"input_ids": _rows(buf.input_ids[:4]), "positions": _rows(buf.positions[:4]),
                         "out_loc": _rows(buf.out_loc[:4]), "slots": _rows(cap.slots[:4, :COLS]),
                         "mask": _rows(cap.mask[:4, 0, 0, :COLS])}

        snapshot("captured")  # prefill 不走图，缓冲里还是录图时的数
        table = TableManager(4, engine.page_table)
        cache = CacheManager(engine.num_pages, engine.config.page_size, engine.page_table)
        params = SamplingParams(max_tokens=2)
        reqs = [add_req(engine, table, ids, params, uid) for uid, ids in enumerate(PROMPTS)]
        batch = prepare_batch(engine, table, cache, reqs, "prefill")
        process_output(table, cache, reqs, engine.forward_batch(batch, engine.sampler.prepare(batch)))

        batch = prepare_batch(engine, table, cache, reqs, "decode")
        data["padded"] = [(r.uid, r.table_idx, r.device_len - 1) for r in batch.padded_reqs]
        graph = runner.graph_map[batch.padded_size]
        real_replay = graph.replay

        def replay():  # 重放的那一刻：copy_from 和 prepare_for_replay 刚写完
            snapshot("replayed")
            data["replayed_bs"] = bs_of[id(graph)]
            real_replay()

        graph.replay = replay
        out = engine.forward_batch(batch, engine.sampler.prepare(batch))
        data["graph_argmax"] = _rows(runner.buffer.logits[:batch.padded_size].argmax(-1))
        data["tokens"] = _rows(out.next_tokens_cpu)
        with get_global_ctx().forward_batch(batch):  # 同一个 batch 逐算子再跑一遍：不经过图
            data["eager_tokens"] = _rows(engine.model.forward()[:batch.size].argmax(-1))
        engine.shutdown()
    return data


def _grid(svg: SVG, x: float, y: float, values: list, colors: list, masked: list | None = None,
          cw: float = 34) -> None:
    for i, v in enumerate(values):
        off = masked is not None and not masked[i]
        svg.box(x + i * cw, y, cw - 3, 22, str(v), "#ffffff" if off else colors[i], 11, mono=True,
                dash=off, color=MUTED if off else INK)


def cuda_graph_replay() -> SVG:
    d = run()
    names = ["A", "B", "C", "假"]
    svg = SVG(900, 600, "CUDA 图：录图、补齐、重放前拷进静态缓冲、重放")
    svg.text(450, 28, "一次真实的录图和重放（qwen3-tied 小模型，模拟的 CUDA；max_running_req = 4，page_size = 1）",
             15, bold=True)
    # ① 录图
    svg.text(20, 60, f"① 引擎构造时录图：graph_bs_list = {d['sizes']}，从大到小录，后录的共用第一张的显存池",
             13, anchor="start", bold=True)
    for i, (bs, ops) in enumerate(d["order"]):
        svg.box(40 + i * 200, 72, 170, 30, f"bs = {bs}：录下 {ops} 个算子", PURPLE, 12)
        if i:
            svg.line(40 + i * 200 - 28, 87, 40 + i * 200 - 4, 87, DARK[PURPLE], arrow=True)
    svg.text(640, 84, "没给 cuda_graph_bs：1, 2, 4, 8, …", 11, MUTED, anchor="start")
    svg.text(640, 100, "到第一个 ≥ max_running_req 的为止", 11, MUTED, anchor="start")
    # ② 补齐
    svg.text(20, 136, f"② 一步 decode：3 个请求，pad_batch 补一个假请求到 {len(d['padded'])}，"
             f"重放 graph_map[{d['replayed_bs']}]", 13, anchor="start", bold=True)
    for i, (uid, row, pos) in enumerate(d["padded"]):
        label = f"{names[i]}：uid {uid}，第 {row} 行，位置 {pos}"
        svg.box(40 + i * 210, 148, 195, 28, label, REQ_COLORS[i], 12, dash=uid < 0)
    # ③ 静态缓冲
    svg.text(20, 212, "③ 重放前改写的静态缓冲（前 4 行）：左边是录图后留下的，右边是 buffer.copy_from 刚写进的",
             13, anchor="start", bold=True)
    before, after = d["captured"], d["replayed"]
    y = 222
    for field in ("input_ids", "positions", "out_loc"):
        svg.text(20, y + 16, f"buffer.{field}", 12, anchor="start", mono=True)
        _grid(svg, 200, y, before[field], [GREY] * 4)
        svg.line(345, y + 11, 385, y + 11, DARK[ORANGE], arrow=True)
        _grid(svg, 395, y, after[field], REQ_COLORS)
        y += 28
    svg.text(560, 240, "A、B、C：上一步采出的 token、这一步的位置和槽位", 11, MUTED, anchor="start")
    svg.text(560, 268, f"假请求：token 0、位置 0、槽位 {d['dummy_slot']}（假页）", 11, MUTED, anchor="start")
    y += 14
    svg.text(20, y, f"后端的 capture 数据：slots (max_bs, {d['width']}) 和 mask，画出前 {COLS} 列，"
             "虚线格 = mask 为 False（遮掉）；右边是 prepare_for_replay 写进的", 12, MUTED, anchor="start")
    y += 10
    for i in range(4):
        svg.text(20, y + 16, f"slots[{i}]（{names[i]}）", 12, anchor="start", mono=True)
        _grid(svg, 150, y, before["slots"][i] + ["…"], [GREY] * (COLS + 1), before["mask"][i] + [False], 30)
        svg.line(390, y + 11, 425, y + 11, DARK[ORANGE], arrow=True)
        _grid(svg, 435, y, after["slots"][i] + ["…"], [REQ_COLORS[i]] * (COLS + 1), after["mask"][i] + [False], 30)
        y += 28
    # ④ 重放
    y += 22
    svg.text(20, y, f"④ graph_map[{d['replayed_bs']}].replay()：整段前向一次提交，buffer.logits 的前 "
             f"{len(d['padded'])} 行写好", 13, anchor="start", bold=True)
    y += 12
    svg.text(20, y + 16, "每行 argmax", 12, anchor="start")
    _grid(svg, 150, y, d["graph_argmax"], REQ_COLORS, cw=60)
    svg.text(400, y + 16, f"→ logits[:3] 交给采样器：{d['tokens']}；假请求那一行丢掉", 12, anchor="start")
    same = "相同" if d["eager_tokens"] == d["tokens"] else "不同（！）"
    svg.caption([f"同一个 batch 不经过图、逐个算子再跑一遍，token 是 {d['eager_tokens']}：和重放的{same}。",
                 "录图时三个输入缓冲全是 0、slots 全是 0、mask 只开第 0 列：图记住的是这些格子的地址，不是里面的数，",
                 "所以每步重放前把这一步的数拷进同一批格子；假请求的 KV 写进假页的槽位，logits 那一行不用。"])
    return svg


def main() -> None:
    why = problem()
    if why:
        print(f"跳过 docs/images/{NAME}.svg：{why}")
        return
    cuda_graph_replay().save(OUT)
    print(f"docs/images/{NAME}.svg")


if __name__ == "__main__":
    main()
