"""第 6 章的生成入口：模型、KV 池、page table、注意力后端和采样器都由 Engine 按顺序建好；这里只剩调度器的活。

    python generate.py --model DIR --prompt TEXT [--prompt TEXT ...] --max-new-tokens N [--page-size P] [--json]
                       [--tp N]

每一步就是阶段二调度器的那几行：prepare_batch（补齐、分页、positions、out_loc、input_ids、元数据）→
engine.forward_batch → process_output（新 token 写回 token pool 和请求）。默认贪心；--temperature/--top-k/--top-p
按请求采样。--tp N 起 N 个进程，每个一个 Engine、一个 rank，一起跑同一个模型；打印的是 rank 0 的结果。
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.multiprocessing as mp
from safetensors.torch import save_file

from minisgl.core import Req, SamplingParams
from minisgl.distributed import DistributedInfo
from minisgl.engine import Engine, EngineConfig
from minisgl.scheduler import CacheManager, TableManager, add_req, prepare_batch, process_output
from minisgl.server import free_addr, launch_tp
from minisgl.utils import div_ceil, load_tokenizer


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="models/Qwen3-0.6B", help="Hugging Face 格式的模型目录")
    ap.add_argument("--prompt", action="append", help="可以给多次；默认一个英文句子")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--page-size", type=int, default=1, help="一页几个槽位；不超过 --max-seq-len")
    ap.add_argument("--json", action="store_true", help="最后一行输出 {\"outputs\": [[token id...], ...]}")
    ap.add_argument("--dump-logits", help="把每一步的 logits 存成 safetensors（测试报告不一致时用）")
    ap.add_argument("--num-pages", type=int, help="KV 池的页数；默认正好够用")
    ap.add_argument("--max-seq-len", type=int, help="一个请求最多几个位置；默认最长提示词 + 生成长度")
    ap.add_argument("--attention-backend", default="auto", help="注意力后端：torch、fi、fa，或 预填充,解码 两个名字")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 表示贪心")
    ap.add_argument("--top-k", type=int, default=-1)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0, help="采样的随机种子：同一个种子，同样的输出")
    ap.add_argument("--tp", type=int, default=1, help="张量并行的份数：起这么多个进程（CPU 上 gloo，GPU 上 NCCL）")
    ap.add_argument("--dist-addr", help="各进程会合的地址（tcp://HOST:PORT 或 file://PATH）；默认找一个空闲端口")
    ap.add_argument("--dist-timeout", type=float, default=60.0, help="会合和每次集合通信最多等几秒，超时报错而不是挂着")
    args = ap.parse_args(argv)
    args.prompt = args.prompt or ["The capital of France is"]
    if args.page_size < 1 or args.max_new_tokens < 1 or args.tp < 1:
        ap.error("--page-size、--max-new-tokens 和 --tp 都必须是正整数")
    if any(v is not None and v < 1 for v in (args.num_pages, args.max_seq_len)):
        ap.error("--num-pages 和 --max-seq-len 给了就必须是正整数")
    if not os.path.isfile(os.path.join(args.model, "config.json")):
        ap.error(f"--model {args.model}：找不到 {os.path.join(args.model, 'config.json')}")
    if args.dump_logits and os.path.isdir(args.dump_logits):  # 生成完才发现就晚了
        ap.error(f"--dump-logits {args.dump_logits}：这是一个目录，要给文件路径")
    return args


def step(engine: Engine, table: TableManager, cache: CacheManager, reqs: list[Req], phase: str
         ) -> tuple[list[int], torch.Tensor]:
    """阶段二调度器的一步，手工做：填 batch → 前向 + 采样 → 新 token 写回。返回这一步的 token 和 logits。"""
    batch = prepare_batch(engine, table, cache, reqs, phase)
    out = engine.forward_batch(batch, engine.sampler.prepare(batch))
    return process_output(table, cache, reqs, out), out.logits


def generate(engine: Engine, prompt_ids: list[list[int]], params: SamplingParams
             ) -> tuple[list[list[int]], list[torch.Tensor]]:
    """所有请求一起 prefill，再一起 decode；每个请求正好 params.max_tokens 个 token。另返回每一步的 logits。"""
    table = TableManager(engine.config.max_running_req, engine.page_table)
    cache = CacheManager(engine.num_pages, engine.config.page_size, engine.page_table)
    reqs = [add_req(engine, table, ids, params, uid) for uid, ids in enumerate(prompt_ids)]
    outs, logits = [[] for _ in reqs], []
    for phase in ["prefill"] + ["decode"] * (params.max_tokens - 1):
        tokens, step_logits = step(engine, table, cache, reqs, phase)
        for out, t in zip(outs, tokens):
            out.append(t)
        logits.append(step_logits)
    return outs, logits


def run_rank(config: EngineConfig, prompt_ids: list[list[int]], params: SamplingParams, args: argparse.Namespace
             ) -> tuple[list[list[int]], float]:
    """一个 rank 的全部工作：建 Engine、生成、shutdown。--dump-logits 只由 rank 0 写。"""
    engine = Engine(config)
    try:
        torch.manual_seed(args.seed)  # 每个 rank 同一个种子、同一份（all-gather 后的）logits：采出同样的 token
        with torch.inference_mode():
            t0 = time.perf_counter()
            outs, logits = generate(engine, prompt_ids, params)
            seconds = time.perf_counter() - t0
    finally:
        engine.shutdown()
    if args.dump_logits and config.tp_info.is_primary():
        save_file({f"p{i}": torch.stack([lg[i].float().cpu() for lg in logits]) for i in range(len(outs))},
                  args.dump_logits)
    return outs, seconds


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        tok = load_tokenizer(args.model)
    except (OSError, ValueError) as e:  # 缺分词器文件是 FileNotFoundError，也是 OSError
        sys.exit(f"错误：--model {args.model}：读不了分词器：{e}")
    prompt_ids, n, ps = [tok(p).input_ids for p in args.prompt], args.max_new_tokens, args.page_size
    if empty := [p for p, ids in zip(args.prompt, prompt_ids) if not ids]:
        sys.exit(f"错误：--prompt {empty[0]!r} 被分词器编码成了 0 个 token：提示词至少要有一个 token")
    need = max(map(len, prompt_ids)) + n
    max_seq_len = args.max_seq_len or need
    if need > max_seq_len:
        sys.exit(f"错误：最长的提示词 {need - n} 个 token + --max-new-tokens {n} = {need}，"
                 f"超过了 --max-seq-len {max_seq_len}（规则：提示词 token 数 + --max-new-tokens <= --max-seq-len）")
    if ps > max_seq_len:
        sys.exit(f"错误：--page-size {ps} 大于 --max-seq-len {max_seq_len}：一页里多出来的槽位没有请求用得到")
    # 每个请求最多写 len + n - 1 个位置的 KV（最后采出的那个 token 不再前向），按页向上取整
    num_pages = args.num_pages or sum(div_ceil(len(ids) + n - 1, ps) for ids in prompt_ids)
    try:
        params = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, max_tokens=n)
        config = EngineConfig(model_path=args.model, tp_info=DistributedInfo(0, args.tp), dtype=torch.float32,
                              max_running_req=len(prompt_ids), attention_backend=args.attention_backend,
                              page_size=ps, num_page_override=num_pages, max_seq_len_override=max_seq_len,
                              distributed_timeout=args.dist_timeout, distributed_addr=args.dist_addr or free_addr())
        if args.tp == 1:
            outs, seconds = run_rank(config, prompt_ids, params, args)
        else:
            config.check_tp()  # 起进程之前就拒绝切不开的 --tp
            results = launch_tp(config, run_rank, prompt_ids, params, args)
            if any(r[0] != results[0][0] for r in results):  # 各 rank 的 token 应逐个相同，否则 KV 已经各走各的
                raise RuntimeError(f"各 rank 采出的 token 不一致：{[r[0] for r in results]}")
            outs, seconds = results[0]
    except (ValueError, RuntimeError, OSError, ArithmeticError, mp.ProcessRaisedException,
            mp.ProcessExitedException) as e:
        sys.exit(f"错误：--tp {args.tp}：{e}" if args.tp > 1 else f"错误：{e}")
    if args.json:
        print(json.dumps({"outputs": outs}))
        return
    for p, out in zip(args.prompt, outs):
        print(f"{p!r} -> {tok.decode(out)!r}")
    total = sum(len(o) for o in outs)
    print(f"{total} tokens，{total / seconds:.1f} tokens/s（{len(outs)} 个请求一个 batch，含 prefill，tp={args.tp}）")


if __name__ == "__main__":
    main()
