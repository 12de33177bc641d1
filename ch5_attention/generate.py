"""第 5 章的生成入口：注意力换成可插拔的后端（CPU 上是纯 PyTorch 的 "torch"），每个 batch 先准备元数据。

    python generate.py --model DIR --prompt TEXT [--prompt TEXT ...] --max-new-tokens N [--page-size P] [--json]

每一步调用方手工做阶段二调度器的活：给请求分页、写 page table、算出 out_loc，从 token pool 取 input_ids。
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import dataclass

import torch
from safetensors.torch import save_file

from minisgl.attention import create_attention_backend
from minisgl.core import Batch, Context, Req, SamplingParams, get_global_ctx, reset_global_ctx, set_global_ctx
from minisgl.distributed import reset_tp_info, set_tp_info
from minisgl.kvcache import create_kvcache_pool
from minisgl.models import BaseLLMModel, ModelConfig, create_model, load_hf_config, load_weight
from minisgl.utils import div_ceil, load_tokenizer, torch_dtype


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
    ap.add_argument("--attention-backend", default="torch", help="注意力后端：torch、fi、fa，或 预填充,解码 两个名字")
    args = ap.parse_args(argv)
    args.prompt = args.prompt or ["The capital of France is"]
    if args.page_size < 1 or args.max_new_tokens < 1:
        ap.error("--page-size 和 --max-new-tokens 都必须是正整数")
    if any(v is not None and v < 1 for v in (args.num_pages, args.max_seq_len)):
        ap.error("--num-pages 和 --max-seq-len 给了就必须是正整数")
    if not os.path.isfile(os.path.join(args.model, "config.json")):
        ap.error(f"--model {args.model}：找不到 {os.path.join(args.model, 'config.json')}")
    if args.dump_logits and os.path.isdir(args.dump_logits):  # 生成完才发现就晚了
        ap.error(f"--dump-logits {args.dump_logits}：这是一个目录，要给文件路径")
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


@dataclass
class Slots:
    """阶段二调度器管的两样东西，这里手工管：还没用的 KV 页，以及每个请求每个位置的 token（token pool）。"""

    free_pages: list[int]
    token_pool: torch.Tensor  # 和 page table 同形状：token_pool[行, 位置] = 那个位置的 token id


def allocate(req: Req, slots: Slots) -> None:
    """给 req 这一步要写 KV 的位置 [cached_len, device_len) 配上槽位：一页用完才拿下一页。
    空闲页从尾部拿，几个请求交替增长，拿到的页自然不连续——page table 才真的有用。"""
    ctx = get_global_ctx()
    ps = ctx.page_size
    for page_idx in range(div_ceil(req.cached_len, ps), div_ceil(req.device_len, ps)):
        if not slots.free_pages:
            raise RuntimeError(f"KV 池的页用完了：请求 {req.uid} 还需要它的第 {page_idx} 页（--num-pages）")
        page = slots.free_pages.pop()
        ctx.page_table[req.table_idx, page_idx * ps:(page_idx + 1) * ps] = torch.arange(page * ps, (page + 1) * ps)


def step(model: BaseLLMModel, reqs: list[Req], phase: str, slots: Slots) -> tuple[list[int], torch.Tensor]:
    """调用方这一边（阶段二由调度器来做）：先给每个请求 allocate(req, slots) 配页，再填 batch：positions、
    out_loc = page_table[行, positions]、input_ids = slots.token_pool[行, positions]（不读 Req.input_ids），
    页表写好之后 prepare_metadata 一次；前向之后把新 token 接到每个请求后面，并写进
    slots.token_pool[table_idx, device_len - 1]。返回 (token 列表, logits)。"""
    ctx = get_global_ctx()
    batch = Batch(reqs=reqs, phase=phase)
    batch.padded_reqs = reqs
    for r in reqs:
        allocate(r, slots)
    batch.positions = torch.cat([torch.arange(r.cached_len, r.device_len) for r in reqs]).int()
    rows = torch.cat([torch.full((r.extend_len,), r.table_idx) for r in reqs])
    batch.out_loc = ctx.page_table[rows, batch.positions.long()]  # 每个新 token 的 KV 写到哪个槽位
    batch.input_ids = slots.token_pool[rows, batch.positions.long()]
    ctx.attn_backend.prepare_metadata(batch)  # 每个 batch 一次，各层共用；要在 page table 写好之后
    next_tokens, logits = forward_batch(model, batch)
    for i, r in enumerate(reqs):
        r.append_host(next_tokens[i:i + 1])
        slots.token_pool[r.table_idx, r.device_len - 1] = next_tokens[i]
    return next_tokens.tolist(), logits


def generate(model: BaseLLMModel, prompt_ids: list[list[int]], n: int, slots: Slots
             ) -> tuple[list[list[int]], list[torch.Tensor]]:
    """建 Req（table_idx = uid = 提示词下标），先把每个提示词写进 slots.token_pool[table_idx, :len(提示词)]，
    再所有请求一起 prefill、一起 decode n-1 步（每一步是 step）。返回每个请求的 n 个 token 和每一步的 logits。"""
    reqs = [Req(input_ids=torch.tensor(ids, dtype=torch.int32), table_idx=i, cached_len=0, output_len=n, uid=i,
                sampling_params=SamplingParams(max_tokens=n), cache_handle=None) for i, ids in enumerate(prompt_ids)]
    for r in reqs:
        slots.token_pool[r.table_idx, :r.device_len] = r.input_ids
    outs, logits_seen = [[] for _ in reqs], []
    for phase in ["prefill"] + ["decode"] * (n - 1):
        tokens, logits = step(model, reqs, phase, slots)
        for out, t in zip(outs, tokens):
            out.append(t)
        logits_seen.append(logits)
    return outs, [torch.stack([lg[i] for lg in logits_seen]) for i in range(len(reqs))]


def check_request_sizes(args: argparse.Namespace, prompt_ids: list[list[int]]) -> int:
    """请求进来之前查一次（主存里的整数）：空提示词、放不下的长度、用不满的页。返回 max_seq_len。"""
    n, ps = args.max_new_tokens, args.page_size
    if empty := [p for p, ids in zip(args.prompt, prompt_ids) if not ids]:
        sys.exit(f"错误：--prompt {empty[0]!r} 被分词器编码成了 0 个 token：提示词至少要有一个 token")
    need = max(map(len, prompt_ids)) + n
    max_seq_len = args.max_seq_len or need
    if need > max_seq_len:  # 否则它的槽位会超出 page table 的一行
        sys.exit(f"错误：最长的提示词 {need - n} 个 token + --max-new-tokens {n} = {need}，"
                 f"超过了 --max-seq-len {max_seq_len}（规则：提示词 token 数 + --max-new-tokens <= --max-seq-len）")
    if ps > max_seq_len:
        sys.exit(f"错误：--page-size {ps} 大于 --max-seq-len {max_seq_len}：一页里多出来的槽位没有请求用得到")
    return max_seq_len


def main(argv: list[str] | None = None) -> None:
    """命令行入口（契约见"怎么跑测试"）：不带 --json 时每个提示词一行 repr(提示词) -> repr(生成的文本)，
    最后一行是 tokens/s；
    --json 时最后一行是 {"outputs": [[token id, ...], ...]}（按提示词顺序）；--dump-logits FILE 把每个提示词每一步的
    logits 存成 safetensors，键 p0、p1 …，形状 (生成的 token 数, vocab)。
    用错的参数：argparse 的 error: …（第 6 章起是一行 错误：…），其余的错也只说一行，都非 0 退出。"""
    args = parse_args(argv)
    try:
        tok = load_tokenizer(args.model)
    except (OSError, ValueError) as e:  # 缺分词器文件是 FileNotFoundError，也是 OSError
        sys.exit(f"错误：--model {args.model}：读不了分词器：{e}")
    prompt_ids, n, ps = [tok(p).input_ids for p in args.prompt], args.max_new_tokens, args.page_size
    max_seq_len = check_request_sizes(args, prompt_ids)
    set_tp_info(0, 1)
    ctx = Context(page_size=args.page_size)
    set_global_ctx(ctx)
    try:
        model, config = load_model(args.model)
        if max_seq_len > config.rotary_config.max_position:
            raise ValueError(f"最长序列 {max_seq_len} 超过了模型的 max_position_embeddings "
                             f"{config.rotary_config.max_position}")
        if bad := sorted({t for ids in prompt_ids for t in ids if t >= config.vocab_size}):
            raise ValueError(f"分词器给出了词表以外的 token id {bad[:5]}："
                             f"config.json 的 vocab_size={config.vocab_size}")
        # 每个请求最多写 len + n - 1 个位置的 KV（最后采出的那个 token 不再前向），按页向上取整
        num_pages = args.num_pages
        if num_pages is None:
            num_pages = sum(div_ceil(len(ids) + n - 1, ps) for ids in prompt_ids)
        ctx.kv_cache = create_kvcache_pool(config, num_pages, ps, torch.float32, torch.device("cpu"))
        width = div_ceil(max_seq_len, math.lcm(32, ps)) * math.lcm(32, ps)  # 对齐，且是整页
        ctx.page_table = torch.zeros((len(prompt_ids), width), dtype=torch.int32)
        ctx.attn_backend = create_attention_backend(args.attention_backend, config)  # 要在 ctx.kv_cache 之后
        slots = Slots(free_pages=list(range(num_pages)), token_pool=torch.zeros_like(ctx.page_table))
        with torch.inference_mode():
            t0 = time.perf_counter()
            outs, logits = generate(model, prompt_ids, n, slots)
            seconds = time.perf_counter() - t0
    except (ValueError, RuntimeError, OSError) as e:  # 和 --tp N 一样只说原因，不打印回溯
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
