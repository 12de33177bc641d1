"""第 6 章的生成入口：模型、KV 池、page table、注意力后端和采样器都由 Engine 按顺序建好；这里只剩调度器的活。

    python generate.py --model DIR --prompt TEXT [--prompt TEXT ...] --max-new-tokens N [--page-size P] [--json]
                       [--tp N]

每一步调用方手工做阶段二调度器的活：给请求分页、写 page table、算出 out_loc，从 token pool 取 input_ids，
然后 engine.forward_batch(batch, engine.sampler.prepare(batch))。默认贪心；--temperature/--top-k/--top-p 按请求采样。
--tp N 起 N 个进程，每个一个 Engine、一个 rank，一起跑同一个模型；打印的是 rank 0 的结果。
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import sys
import time
from dataclasses import dataclass

import torch
import torch.multiprocessing as mp
from safetensors.torch import save_file

from minisgl.core import Batch, Req, SamplingParams
from minisgl.distributed import DistributedInfo
from minisgl.engine import Engine, EngineConfig
from minisgl.utils import div_ceil, load_tokenizer

PAGED = True  # 从本章起有分页 KV


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="models/Qwen3-0.6B", help="Hugging Face 格式的模型目录")
    ap.add_argument("--prompt", action="append", help="可以给多次；默认一个英文句子")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--page-size", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="最后一行输出 {\"outputs\": [[token id...], ...]}")
    ap.add_argument("--dump-logits", help="把每一步的 logits 存成 safetensors（测试报告不一致时用）")
    ap.add_argument("--num-pages", type=int, help="KV 池的页数；默认正好够用")
    ap.add_argument("--max-seq-len", type=int, help="page table 一行最多几个位置；默认最长提示词 + 生成长度")
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
    if not PAGED and args.page_size != 1:
        ap.error(f"--page-size {args.page_size}：这一章还没有分页 KV，只能是 1（分页 KV 从第 4 章开始）")
    if args.page_size < 1 or args.max_new_tokens < 1 or args.tp < 1:
        ap.error("--page-size、--max-new-tokens 和 --tp 都必须是正整数")
    if any(v is not None and v < 1 for v in (args.num_pages, args.max_seq_len)):
        ap.error("--num-pages 和 --max-seq-len 给了就必须是正整数")
    if not os.path.isfile(os.path.join(args.model, "config.json")):
        ap.error(f"--model {args.model}：找不到 {os.path.join(args.model, 'config.json')}")
    return args


@dataclass
class Slots:
    """阶段二调度器管的两样东西，这里手工管：还没用的 KV 页，以及每个请求每个位置的 token（token pool）。"""

    free_pages: list[int]
    token_pool: torch.Tensor  # 和 page table 同形状：token_pool[行, 位置] = 那个位置的 token id


def allocate(engine: Engine, req: Req, slots: Slots) -> None:
    """给 req 这一步要写 KV 的位置 [cached_len, device_len) 配上槽位：一页用完才拿下一页。
    空闲页从尾部拿，几个请求交替增长，拿到的页自然不连续——page table 才真的有用。"""
    page_table, ps = engine.page_table, engine.config.page_size
    width = engine.max_seq_len
    if req.device_len > width:
        raise ValueError(f"请求 {req.uid} 需要 {req.device_len} 个位置，超过了 Engine 的 max_seq_len={width}"
                         f"（--max-seq-len 和 KV 池的槽位数 --num-pages × --page-size 中较小的那个）")
    for page_idx in range(div_ceil(req.cached_len, ps), div_ceil(req.device_len, ps)):
        if not slots.free_pages:
            raise RuntimeError(f"KV 池的页用完了：请求 {req.uid} 还需要它的第 {page_idx} 页（--num-pages）")
        page = slots.free_pages.pop()
        page_table[req.table_idx, page_idx * ps:(page_idx + 1) * ps] = torch.arange(page * ps, (page + 1) * ps)


def step(engine: Engine, reqs: list[Req], phase: str, slots: Slots) -> list[int]:
    """调用方这一边：把 batch 的字段填好（阶段二由调度器来做），前向 + 采样，再把新 token 写回每个请求。"""
    batch = Batch(reqs=reqs, phase=phase)
    engine.graph_runner.pad_batch(batch)
    for r in reqs:
        allocate(engine, r, slots)
    positions = torch.cat([torch.arange(r.cached_len, r.device_len) for r in batch.padded_reqs])
    rows = torch.cat([torch.full((r.extend_len,), r.table_idx) for r in batch.padded_reqs])
    batch.positions = positions.to(engine.device, torch.int32)
    batch.out_loc = engine.page_table[rows, positions]  # 每个新 token 的 KV 写到哪个槽位
    batch.input_ids = slots.token_pool[rows, positions]
    engine.attn_backend.prepare_metadata(batch)  # 每个 batch 一次，各层共用；要在 page table 写好之后
    out = engine.forward_batch(batch, engine.sampler.prepare(batch))
    out.copy_done_event.synchronize()
    for i, r in enumerate(reqs):
        r.append_host(out.next_tokens_cpu[i:i + 1])
        slots.token_pool[r.table_idx, r.device_len - 1] = out.next_tokens_gpu[i]
    return out.next_tokens_cpu.tolist()


def generate(engine: Engine, prompt_ids: list[list[int]], params: SamplingParams) -> list[list[int]]:
    """所有请求一起 prefill，再一起 decode；每个请求正好 params.max_tokens 个 token。"""
    slots = Slots(free_pages=list(range(engine.num_pages)), token_pool=torch.zeros_like(engine.page_table))
    reqs = [Req(input_ids=torch.tensor(ids, dtype=torch.int32), table_idx=i, cached_len=0,
                output_len=params.max_tokens, uid=i, sampling_params=params, cache_handle=None)
            for i, ids in enumerate(prompt_ids)]
    for r in reqs:
        slots.token_pool[r.table_idx, :r.device_len] = r.input_ids
    outs = [[] for _ in reqs]
    for phase in ["prefill"] + ["decode"] * (params.max_tokens - 1):
        for out, t in zip(outs, step(engine, reqs, phase, slots)):
            out.append(t)
    return outs


def record_logits(engine: Engine) -> list[torch.Tensor]:
    """只给 --dump-logits 用：包一层 sampler.sample，记下每一步交给采样器的 logits。"""
    seen, sample = [], engine.sampler.sample

    def recording_sample(logits: torch.Tensor, args):
        seen.append(logits.float().cpu().clone())
        return sample(logits, args)

    engine.sampler.sample = recording_sample
    return seen


def run_rank(config: EngineConfig, prompt_ids: list[list[int]], args: argparse.Namespace
             ) -> tuple[list[list[int]], float]:
    """一个 rank 的全部工作：建 Engine、生成、shutdown。--dump-logits 只由 rank 0 写。"""
    engine = Engine(config)
    try:
        dump = args.dump_logits and config.tp_info.is_primary()
        logits = record_logits(engine) if dump else []
        params = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                max_tokens=args.max_new_tokens)
        torch.manual_seed(args.seed)  # 每个 rank 同一个种子、同一份（all-gather 后的）logits：采出同样的 token
        with torch.inference_mode():
            t0 = time.perf_counter()
            outs = generate(engine, prompt_ids, params)
            seconds = time.perf_counter() - t0
    finally:
        engine.shutdown()
    if dump:
        save_file({f"p{i}": torch.stack([lg[i] for lg in logits]) for i in range(len(outs))}, args.dump_logits)
    return outs, seconds


# --8<-- [start:launch]
def _worker(rank: int, config: EngineConfig, prompt_ids: list[list[int]], args: argparse.Namespace, results) -> None:
    config = dataclasses.replace(config, tp_info=DistributedInfo(rank, config.tp_info.size))
    results.put((rank, *run_rank(config, prompt_ids, args)))


def launch_tp(config: EngineConfig, prompt_ids: list[list[int]], args: argparse.Namespace
              ) -> tuple[list[list[int]], float]:
    """起 tp 个进程（spawn：CUDA 也能用），收齐各 rank 的结果。某个 rank 出错时 join 抛出它的 traceback，
    并结束其余进程；卡在集合通信上的 rank 最多等 distributed_timeout 秒。"""
    results = mp.get_context("spawn").Queue()
    ctx = mp.start_processes(_worker, args=(config, prompt_ids, args, results), nprocs=config.tp_info.size,
                             join=False, start_method="spawn")
    got = {}
    try:
        while not ctx.join(timeout=0.2):  # 边等边收，免得结果堵在管道里
            while not results.empty():
                rank, outs, seconds = results.get()
                got[rank] = (outs, seconds)
    finally:
        for p in ctx.processes:  # 正常结束时它们都已退出；出错或 Ctrl-C 时不留下孤儿
            if p.is_alive():
                p.terminate()
            p.join()
    while len(got) < config.tp_info.size:
        rank, outs, seconds = results.get(timeout=config.distributed_timeout)
        got[rank] = (outs, seconds)
    results.close()
    if any(got[r][0] != got[0][0] for r in got):  # 各 rank 的 token 应逐个相同，否则 KV 已经各走各的
        raise RuntimeError(f"各 rank 采出的 token 不一致：{ {r: got[r][0] for r in sorted(got)} }")
    return got[0]
# --8<-- [end:launch]


def free_addr() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        tok = load_tokenizer(args.model)
    except FileNotFoundError as e:
        sys.exit(f"错误：{e}")
    empty = [p for p in args.prompt if not tok(p).input_ids]
    if empty:  # prefill 至少要一个 token；空 prompt 只有带 BOS 的分词器才编码得出东西
        sys.exit(f"错误：--prompt {empty[0]!r} 编码后一个 token 也没有：给一个非空的 prompt")
    prompt_ids, n, ps = [tok(p).input_ids for p in args.prompt], args.max_new_tokens, args.page_size
    # 每个请求最多写 len + n - 1 个位置的 KV（最后采出的那个 token 不再前向），按页向上取整
    if args.num_pages is None:
        args.num_pages = sum(div_ceil(len(ids) + n - 1, ps) for ids in prompt_ids)
    if args.num_pages < len(prompt_ids):  # Engine 也会拒绝；这里先说出是哪个命令行参数
        sys.exit(f"错误：--num-pages {args.num_pages} 少于请求数 {len(prompt_ids)}：每个请求至少要一页")
    need = max(map(len, prompt_ids)) + n
    max_seq_len = args.max_seq_len or need
    if need > max_seq_len:  # 请求进来之前就拒绝：它的槽位会超出 page table 的一行
        sys.exit(f"错误：最长的请求要 {need} 个位置（提示词 + --max-new-tokens），超过了 --max-seq-len {max_seq_len}")
    config = EngineConfig(model_path=args.model, tp_info=DistributedInfo(0, args.tp), dtype=torch.float32,
                          max_running_req=len(prompt_ids), attention_backend=args.attention_backend,
                          page_size=ps, num_page_override=args.num_pages, max_seq_len_override=max_seq_len,
                          distributed_timeout=args.dist_timeout, distributed_addr=args.dist_addr or free_addr())
    if args.tp == 1:
        outs, seconds = run_rank(config, prompt_ids, args)
    else:
        try:
            config.check_tp()  # 起进程之前就拒绝切不开的 --tp
            if torch.cuda.is_available() and args.tp > torch.cuda.device_count():  # 每个 rank 一块卡：cuda:{rank}
                raise ValueError(f"每个 rank 要一块 GPU，这台机器只有 {torch.cuda.device_count()} 块")
            outs, seconds = launch_tp(config, prompt_ids, args)
        except (ValueError, RuntimeError, mp.ProcessRaisedException, mp.ProcessExitedException) as e:
            sys.exit(f"错误：--tp {args.tp}：{e}")
    if args.json:
        print(json.dumps({"outputs": outs}))
        return
    for p, out in zip(args.prompt, outs):
        print(f"{p!r} -> {tok.decode(out)!r}")
    total = sum(len(o) for o in outs)
    print(f"{total} tokens，{total / seconds:.1f} tokens/s（{len(outs)} 个请求一个 batch，含 prefill，tp={args.tp}）")


if __name__ == "__main__":
    main()
