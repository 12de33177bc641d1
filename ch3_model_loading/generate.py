"""第 3 章的生成入口：模型按 config.json 的 architectures 创建，权重流式加载；Qwen3、Qwen2.5、Llama 3 都能跑。

    python generate.py --model DIR --prompt TEXT [--prompt TEXT ...] --max-new-tokens N [--json]

模型先在 meta 设备上构造（只有形状，不占内存），再把边读边切的真权重换进去。
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
from safetensors.torch import save_file

from minisgl.core import Batch, Context, Req, SamplingParams, get_global_ctx, reset_global_ctx, set_global_ctx
from minisgl.distributed import reset_tp_info, set_tp_info
from minisgl.models import BaseLLMModel, ModelConfig, create_model, load_hf_config, load_weight
from minisgl.naive import NaiveKVCache
from minisgl.utils import load_tokenizer, torch_dtype


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
    if args.page_size < 1 or args.max_new_tokens < 1:
        ap.error("--page-size 和 --max-new-tokens 都必须是正整数")
    if not os.path.isfile(os.path.join(args.model, "config.json")):
        ap.error(f"--model {args.model}：找不到 {os.path.join(args.model, 'config.json')}")
    return args


def load_model(path: str, dtype: torch.dtype = torch.float32) -> tuple[BaseLLMModel, ModelConfig]:
    """先在 meta 设备上"画"出模型（不分配内存），再把流式读出、切好、合并好的权重换进去，边收边转 dtype。"""
    config = ModelConfig.from_hf(load_hf_config(path))
    with torch.device("meta"), torch_dtype(dtype):
        model = create_model(config)
    model.load_state_dict({name: tensor.to(dtype) for name, tensor in load_weight(path, model)})
    return model, config


def forward_batch(model: BaseLLMModel, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """引擎这一边：前向、complete_one、贪心取 token。返回 (next_tokens (bs,) int32, logits (bs, vocab))。"""
    with get_global_ctx().forward_batch(batch):
        logits = model.forward()
    for req in batch.reqs:
        req.complete_one()
    return logits.argmax(dim=-1).int(), logits


def step(model: BaseLLMModel, reqs: list[Req], phase: str) -> tuple[list[int], torch.Tensor]:
    """调用方这一边：把 batch 的字段填好（阶段二由调度器来做），前向，再把新 token 写回每个请求。"""
    batch = Batch(reqs=reqs, phase=phase)
    batch.padded_reqs = reqs
    batch.input_ids = torch.cat([r.input_ids[r.cached_len:r.device_len] for r in reqs])
    batch.positions = torch.cat([torch.arange(r.cached_len, r.device_len) for r in reqs]).int()
    next_tokens, logits = forward_batch(model, batch)
    for i, r in enumerate(reqs):
        r.append_host(next_tokens[i:i + 1])
    return next_tokens.tolist(), logits


def generate(model: BaseLLMModel, prompt_ids: list[list[int]], n: int
             ) -> tuple[list[list[int]], list[torch.Tensor]]:
    """所有请求一起 prefill，再一起 decode n-1 步。返回每个请求的 n 个 token 和每一步的 logits。"""
    reqs = [Req(input_ids=torch.tensor(ids, dtype=torch.int32), table_idx=i, cached_len=0, output_len=n, uid=i,
                sampling_params=SamplingParams(max_tokens=n), cache_handle=None) for i, ids in enumerate(prompt_ids)]
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
    try:
        tok = load_tokenizer(args.model)
    except (OSError, ValueError) as e:  # 缺分词器文件，或者 transformers 不接受 config.json
        sys.exit(f"错误：{e}")
    prompt_ids = [tok(p).input_ids for p in args.prompt]
    empty = [p for p, ids in zip(args.prompt, prompt_ids) if not ids]
    if empty:  # prefill 至少要一个 token；空 prompt 只有带 BOS 的分词器才编码得出东西
        sys.exit(f"错误：--prompt {empty[0]!r} 被分词器编码成了 0 个 token：提示词至少要有一个 token")
    set_tp_info(0, 1)
    ctx = Context(page_size=args.page_size)
    set_global_ctx(ctx)
    try:
        model, config = load_model(args.model)
        need = max(map(len, prompt_ids)) + args.max_new_tokens - 1  # 最后采出的 token 不再前向，不占位置
        if need > config.rotary_config.max_position:  # 否则 RoPE 表查不到这个位置，是一个看不懂的 IndexError
            raise ValueError(f"最长的请求要用到 {need} 个位置，超过了模型的 max_position_embeddings "
                             f"{config.rotary_config.max_position}")
        if bad := sorted({t for ids in prompt_ids for t in ids if t >= config.vocab_size}):
            raise ValueError(f"分词器给出了词表以外的 token id {bad[:5]}："
                             f"config.json 的 vocab_size={config.vocab_size}")
        ctx.kv_cache = NaiveKVCache(config.num_layers)
        with torch.inference_mode():
            t0 = time.perf_counter()
            outs, logits = generate(model, prompt_ids, args.max_new_tokens)
            seconds = time.perf_counter() - t0
    except (ValueError, RuntimeError, OSError) as e:  # 和后面几章一样只说原因，不打印回溯
        sys.exit(f"错误：{e}")
    finally:
        reset_global_ctx()
        reset_tp_info()
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
