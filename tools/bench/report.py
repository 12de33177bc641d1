"""结果写成 markdown：抬头（命令、日期、机器、版本）、时间表、比值表（带目标）、两个下限的表、内存那一行。
表的列和行都在这里定义；tests/repo/test_bench_snippet.py 用它们核对 docs/snippets/ 里写出来的文件。"""

from __future__ import annotations

import statistics

from tools.bench.timing import Timing
from tools.manifest import ROOT

SNIPPET = ROOT / "docs" / "snippets" / "bench_cpu.md"
COMMAND = ".venv/bin/python -m tools.bench --random-qwen3-0.6b"  # 文档里写的那一条命令
SNIPPET_SMOLLM2 = ROOT / "docs" / "snippets" / "bench_smollm2.md"
COMMAND_SMOLLM2 = ".venv/bin/python -m tools.bench --smollm2"
SNIPPETS = {SNIPPET: COMMAND, SNIPPET_SMOLLM2: COMMAND_SMOLLM2}  # 生成的片段 -> 生成它的命令（测试核对）

BATCH_SIZES = (1, 4)
FLOOR_BATCHES = (1, 2, 3, 4)  # 两个下限的表：Engine 的 decode 在这几个 batch 上都量
FLOOR_COLUMNS = ["batch", "乘加 (G 次/步)", "算的下限 (ms)", "读的下限 (ms)", "两者大的 (ms)", "第 6 章 Engine (ms/步)",
                 "Engine / 大的"]
FLOOR_TARGET = 1.15  # bs=4 的一步不超过两个下限里大的那个的几倍
COLUMNS = ["", "decode bs=1 (ms/步)", "decode bs=4 (ms/步)", "prefill 1×32 (ms)", "prefill 4×32 (ms)",
           "bs=1 tokens/s", "bs=4 tokens/s"]  # prefill：1 个、4 个 32 token 的提示词（llama.cpp 是 -p 32、-p 128）
ROWS = {"floor": "内存带宽下限", "skeleton": "第 0 步骨架", "hf": "HF transformers", "engine": "第 6 章 Engine",
        "llama": "llama.cpp（F32）"}  # llama.cpp 一行只在给了 --llama-bench 时才有
RATIO_COLUMNS = ["比值", "bs=1", "bs=4", "目标"]
RATIOS = {"engine/floor": "Engine / 下限", "hf/engine": "HF / Engine", "skeleton/engine": "骨架 / Engine",
          "engine bs4/bs1": "Engine 的 bs=4 步 / bs=1 步", "engine/llama": "Engine / llama.cpp",
          "hf/engine prefill": "prefill：HF / Engine", "engine/llama prefill": "prefill：Engine / llama.cpp"}
TARGETS = {"hf/engine": "bs=1 ≥ 1.0，bs=4 ≥ 1.3", "engine bs4/bs1": "≤ 1.15",
           "engine/llama": "bs=1 ≤ 1.00（SmolLM2 ≤ 1.15）", "hf/engine prefill": "≥ 1.0",
           "engine/llama prefill": "≤ 1.25（4×32 比 pp128）"}


PAIRS = {"engine bs4/bs1": "Engine 的 bs=4 步 / bs=1 步", "engine/llama": "Engine / llama.cpp（decode bs=1）"}
FLOOR_PAIRS = {"engine bs4/floor": "Engine 的 bs=4 步 / 同一轮量的两个下限里大的"}  # 两个下限的表下面那一句


def pairs_line(pairs: dict[str, list[float]], labels: dict[str, str] = PAIRS, table: str = "比值表") -> str:
    """表里用的是各自最快的一轮；机器在几轮之间忽快忽慢时，两个最快可能不在同一轮。这里是每轮里紧挨着量的那一对。
    labels 里有的键才写（比值表下面写 PAIRS，两个下限的表下面写 FLOOR_PAIRS）。"""
    parts = [f"{labels[k]}各轮是 {'、'.join(f'{x:.2f}' for x in v)}，中位数 {statistics.median(v):.2f}"
             for k, v in pairs.items() if v and k in labels]
    return (f"同一轮里紧挨着量的一对（上面的{table}用的是各自最快的一轮，不一定在同一轮）：" + "；".join(parts) + "。"
            if parts else "")


def fmt(x: float | None, digits: int = 1) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def _ms(t: dict[int, float | None], bs: int) -> float | None:
    return None if t.get(bs) is None else t[bs] * 1e3


def time_rows(results: dict[str, Timing]) -> list[str]:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for key, label in ROWS.items():
        if key in results:
            t = results[key]
            cells = [fmt(_ms(t.decode, bs)) for bs in BATCH_SIZES] + [fmt(_ms(t.prefill, bs)) for bs in BATCH_SIZES]
            cells += [fmt(None if t.decode.get(bs) is None else bs / t.decode[bs]) for bs in BATCH_SIZES]
            lines.append("| " + " | ".join([label, *cells]) + " |")
    return lines


def ratio_rows(results: dict[str, Timing]) -> list[str]:
    e, f, h, s = (results[k].decode for k in ("engine", "floor", "hf", "skeleton"))
    lc = results["llama"].decode if "llama" in results else {}
    ep, hp, lp = (results[k].prefill if k in results else {} for k in ("engine", "hf", "llama"))

    def ratio(a: float | None, b: float | None) -> str:  # 用表里显示的（取整到 0.1 ms 的）数算：读者能照表核对
        shown = [None if t is None else round(t * 1e3, 1) for t in (a, b)]
        return fmt(None if None in shown or shown[1] == 0 else shown[0] / shown[1], 2)

    ratios = {"engine/floor": (ratio(e[1], f[1]), ratio(e[4], f[4])),
              "hf/engine": (ratio(h[1], e[1]), ratio(h[4], e[4])),
              "skeleton/engine": (ratio(s.get(1), e[1]), ratio(s.get(4), e[4])),
              "engine bs4/bs1": (ratio(e[4], e[1]), ""),
              "engine/llama": (ratio(e[1], lc.get(1)), ""),
              "hf/engine prefill": (ratio(hp.get(1), ep.get(1)), ratio(hp.get(4), ep.get(4))),
              "engine/llama prefill": (ratio(ep.get(1), lp.get(1)), ratio(ep.get(4), lp.get(4)))}
    if "llama" not in results:
        del ratios["engine/llama"], ratios["engine/llama prefill"]
    lines = ["| " + " | ".join(RATIO_COLUMNS) + " |", "|" + "---|" * len(RATIO_COLUMNS)]
    return lines + [f"| {RATIOS[k]} | {a} | {b} | {TARGETS.get(k, '')} |" for k, (a, b) in ratios.items()]


def floor_rows(results: dict[str, Timing], macs: int, rate: float) -> list[str]:
    """每个 batch 一行：乘加次数、算的下限（乘加 / 峰值）、读的下限（和时间表的下限一行同一个数）、两者大的、
    Engine 的一步、Engine / 大的。比值用表里显示的（取整到 0.1 ms 的）数算，读者能照表核对。"""
    lines = ["| " + " | ".join(FLOOR_COLUMNS) + " |", "|" + "---|" * len(FLOOR_COLUMNS)]
    for bs in FLOOR_BATCHES:
        fma = round(bs * macs / rate * 1e3, 1)
        read = round(results["floor"].decode[bs] * 1e3, 1)
        engine = _ms(results["engine"].decode, bs)
        top = max(fma, read)
        ratio = None if engine is None or top == 0 else round(engine, 1) / top
        lines.append(f"| {bs} | {bs * macs / 1e9:.2f} | {fma:.1f} | {read:.1f} | {top:.1f} | {fmt(engine)} | "
                     f"{fmt(ratio, 2)} |")
    return lines


def render(results: dict[str, Timing], meta: dict[str, str]) -> str:
    """results：ROWS 的键 -> Timing；meta：抬头和内存那一行要填的字符串（键见下面用到的）。"""
    lines = [f"<!-- 由 tools/bench 生成，不要手改；重新生成：{meta['command']} -->", "",
             f"命令：`{meta['command']}`<br>",
             f"日期：{meta['date']}；{meta['machine']}；transformers {meta['transformers']}<br>",
             f"模型：{meta['model']}，fp32 权重 {meta['weights_mib']} MiB；内存读带宽 {meta['bandwidth']}<br>",
             f"线性层的核：{meta['kernels']}<br>",
             f"一步 decode（bs=1，torch.profiler）：{meta['profile']}<br>",
             (f"以下数字来自**一次运行**（decode 取 {meta['steps']} 步的平均，几个实现轮流测，"
              f"每项 {meta['repeat']} 轮取最快），换个时间、换台机器都会有起伏；比的是同一次运行里的相对快慢。"
              + (f"{meta['steal']}。" if meta.get("steal") else "")), ""]
    lines += time_rows(results) + [""] + ratio_rows(results)
    if meta.get("pairs"):  # 每轮紧挨着量的一对之比：各轮的数和中位数
        lines += ["", meta["pairs"]]
    lines += ["", "<!-- --8<-- [start:floors] -->", ""]  # 附录单独引用这一段
    if meta.get("fma_rate"):  # 两个下限：C++ 核用不了时量不到乘加的峰值，只写一句为什么
        lines += [f'两个下限（见附录"两个下限"一节）：乘加的峰值 {float(meta["fma_rate"]) / 1e9:.0f} G 次/秒'
                  f'（{meta["fma_how"]}）；读带宽同上。目标：bs=4 的一步 ≤ {FLOOR_TARGET} × 两者大的。', ""]
        lines += floor_rows(results, int(meta["macs"]), float(meta["fma_rate"]))
        if meta.get("floor_pairs"):  # 每轮：Engine bs=4 和同一轮量的带宽、乘加峰值算出的两个下限
            lines += ["", meta["floor_pairs"]]
    else:
        lines.append("两个下限：C++ 核用不了（线性层走 F.linear），量不到核的乘加峰值，这张表空着。")
    lines += ["", "<!-- --8<-- [end:floors] -->"]
    if meta.get("peer"):  # llama.cpp 的 decode 折合成读权重的带宽，和下限并排
        lines += ["", meta["peer"]]
    lines += ["", (f"加载 Engine 时常驻内存的峰值增量：{meta['peak_rss']}；权重 + KV 池 = {meta['weights_kv']}"
                   f"（差 {meta['rss_over']}）。")]
    return "\n".join(lines) + "\n"
