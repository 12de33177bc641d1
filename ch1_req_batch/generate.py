"""第 1 章的生成入口：所有提示词变成 Req，放进同一个 Batch，一步一起算。

    python generate.py --model DIR --prompt TEXT [--prompt TEXT ...] --max-new-tokens N [--json]

模型不再接收 ids 和 pos：调用方把 Batch 的字段填好，放进全局 Context，模型自己去读。
"""

from __future__ import annotations

import argparse
import json
import os
import time
from types import ModuleType

import torch
from safetensors.torch import save_file
from transformers import AutoTokenizer

from minisgl import model
from minisgl.core import Batch, Context, Req, SamplingParams, get_global_ctx, reset_global_ctx, set_global_ctx
from minisgl.naive import NaiveKVCache

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")  # 有其中一个，AutoTokenizer 才读得出词表


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="models/Qwen3-0.6B", help="Hugging Face 格式的模型目录")
    ap.add_argument("--prompt", action="append", help="可以给多次；默认一个英文句子")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--page-size", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="最后一行输出 {\"outputs\": [[token id...], ...]}")
    ap.add_argument("--dump-logits", help="把每一步的 logits 存成 safetensors（测试报告不一致时用）")
    args = ap.parse_args(argv)
    args.prompt = args.prompt or ["The capital of France is"]
    if args.page_size != 1:
        ap.error(f"--page-size {args.page_size}：这一章还没有分页 KV，只能是 1（分页 KV 从第 4 章开始）")
    if args.max_new_tokens < 1:
        ap.error(f"--max-new-tokens {args.max_new_tokens}：必须是正整数")
    if not os.path.isfile(os.path.join(args.model, "config.json")):
        ap.error(f"--model {args.model}：找不到 {os.path.join(args.model, 'config.json')}")
    if not any(os.path.isfile(os.path.join(args.model, f)) for f in TOKENIZER_FILES):
        ap.error(f"--model {args.model}：找不到分词器文件（{' / '.join(TOKENIZER_FILES)} 一个都没有）")
    return args


def forward_batch(model: ModuleType, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """引擎这一边：前向、complete_one、贪心取 token。返回 (next_tokens (bs,) int32, logits (bs, vocab))。"""
    with get_global_ctx().forward_batch(batch):
        logits = model.forward()
    for req in batch.reqs:
        req.complete_one()
    return logits.argmax(dim=-1).int(), logits


def step(model: ModuleType, reqs: list[Req], phase: str) -> tuple[list[int], torch.Tensor]:
    """调用方这一边：把 batch 的字段填好（阶段二由调度器来做），前向，再把新 token 写回每个请求。"""
    batch = Batch(reqs=reqs, phase=phase)
    batch.padded_reqs = reqs
    batch.input_ids = torch.cat([r.input_ids[r.cached_len:r.device_len] for r in reqs])
    batch.positions = torch.cat([torch.arange(r.cached_len, r.device_len) for r in reqs]).int()
    next_tokens, logits = forward_batch(model, batch)
    for i, r in enumerate(reqs):
        r.append_host(next_tokens[i:i + 1])
    return next_tokens.tolist(), logits


def make_req(ids: list[int], n: int, uid: int, vocab_size: int) -> Req:
    """token id 在建 Req 时用主机上的整数查一次：前向里越界的 id 是看不懂的 IndexError，负数会悄悄从词表末尾取。"""
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"请求 {uid} 的 token id {bad[0]} 在词表之外：vocab_size={vocab_size}")
    return Req(input_ids=torch.tensor(ids, dtype=torch.int32), table_idx=uid, cached_len=0, output_len=n, uid=uid,
               sampling_params=SamplingParams(max_tokens=n), cache_handle=None)


def generate(model: ModuleType, prompt_ids: list[list[int]], n: int
             ) -> tuple[list[list[int]], list[torch.Tensor]]:
    """所有请求一起 prefill，再一起 decode n-1 步。返回每个请求的 n 个 token 和每一步的 logits。"""
    reqs = [make_req(ids, n, i, model.cfg["vocab_size"]) for i, ids in enumerate(prompt_ids)]
    outs, logits_seen = [[] for _ in reqs], []
    for phase in ["prefill"] + ["decode"] * (n - 1):
        tokens, logits = step(model, reqs, phase)
        for out, t in zip(outs, tokens):
            out.append(t)
        logits_seen.append(logits)
    return outs, [torch.stack([lg[i] for lg in logits_seen]) for i in range(len(reqs))]


def main(argv: list[str] | None = None) -> None:
    """命令行入口（契约见"怎么跑测试"）：不带 --json 时每个提示词一行 repr(提示词) -> repr(生成的文本)，
    最后一行是 tokens/s；
    --json 时最后一行是 {"outputs": [[token id, ...], ...]}（按提示词顺序）；--dump-logits FILE 把每个提示词每一步的
    logits 存成 safetensors，键 p0、p1 …，形状 (生成的 token 数, vocab)。
    用错的参数：argparse 的 error: …（第 6 章起是一行 错误：…），其余的错也只说一行，都非 0 退出。"""
    args = parse_args(argv)
    tok = AutoTokenizer.from_pretrained(args.model)
    prompt_ids = [tok(p).input_ids for p in args.prompt]
    for p, ids in zip(args.prompt, prompt_ids):
        if not ids:
            raise SystemExit(f"错误：--prompt {p!r} 被分词器编码成了 0 个 token：提示词至少要有一个 token")
    try:
        model.load(args.model)
    except ValueError as e:  # 坏权重（比如整数张量）：一行说清楚是哪个张量，不打印回溯
        raise SystemExit(f"错误：{e}") from None
    ctx = Context(page_size=args.page_size)
    set_global_ctx(ctx)
    ctx.kv_cache = NaiveKVCache(model.cfg["num_hidden_layers"])
    try:
        with torch.inference_mode():
            t0 = time.perf_counter()
            outs, logits = generate(model, prompt_ids, args.max_new_tokens)
            seconds = time.perf_counter() - t0
    finally:
        reset_global_ctx()
    if args.dump_logits:
        save_file({f"p{i}": lg.contiguous() for i, lg in enumerate(logits)}, args.dump_logits)
    if args.json:
        print(json.dumps({"outputs": outs}))
        return
    for p, out in zip(args.prompt, outs):
        print(f"{p!r} -> {tok.decode(out)!r}")
    total = sum(len(o) for o in outs)
    print(f"{total} tokens，{total / seconds:.1f} tokens/s（{len(outs)} 个请求一个 batch，含 prefill）")


if __name__ == "__main__":
    main()
