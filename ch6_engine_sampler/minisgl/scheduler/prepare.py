"""官方 Scheduler._prepare_batch / _forward / _process_last_data 里和引擎打交道的那几行，手工版。"""

from __future__ import annotations

from typing import TYPE_CHECKING, List

import torch

from minisgl.core import Batch, Req, SamplingParams
from minisgl.engine.sample import NAN_TOKEN

from .cache import CacheManager
from .table import TableManager

if TYPE_CHECKING:
    from minisgl.engine import Engine, ForwardOutput


def add_req(engine: Engine, table: TableManager, input_ids: List[int], params: SamplingParams, uid: int) -> Req:
    """请求进来时查一次（主存里的整数，不在每步前向里查）：空提示词、词表外的 id、放不下的长度。
    一个请求前向时最多有 提示词 + max_tokens - 1 个位置（引擎逐步查 device_len <= max_seq_len）。"""
    vocab = engine.sampler.vocab_size
    if not input_ids:
        raise ValueError(f"请求 {uid} 的提示词编码后是空的：至少要有一个 token")
    if bad := sorted({t for t in input_ids if not 0 <= t < vocab}):
        raise ValueError(f"请求 {uid} 有词表以外的 token id {bad[:5]}：词表大小 vocab_size={vocab}")
    if len(input_ids) + params.max_tokens - 1 > engine.max_seq_len:  # 最后采出的 token 不再前向，不占 KV 的位置
        raise ValueError(f"请求 {uid} 放不下：提示词 {len(input_ids)} 个 token + max_tokens={params.max_tokens} - 1 "
                         f"= {len(input_ids) + params.max_tokens - 1} 个位置要写 KV，规则是它 <= 引擎的 "
                         f"max_seq_len={engine.max_seq_len}（EngineConfig.max_seq_len 和 KV 池槽位数 "
                         f"--num-pages × --page-size 中较小的那个）")
    req = Req(input_ids=torch.tensor(input_ids, dtype=torch.int32), table_idx=table.allocate(), cached_len=0,
              output_len=params.max_tokens, uid=uid, sampling_params=params, cache_handle=None)
    table.token_pool[req.table_idx, :req.device_len] = req.input_ids.to(table.token_pool.device)
    return req


def prepare_batch(engine: Engine, table: TableManager, cache: CacheManager, reqs: List[Req], phase: str) -> Batch:
    """填好一步的 batch：补齐、分页、positions、out_loc、input_ids、注意力元数据。顺序和官方一致。
    batch 本身对不对由 engine.forward_batch 查一次（Engine.check_batch），这里不再查第二遍。"""
    batch = Batch(reqs=reqs, phase=phase)
    engine.graph_runner.pad_batch(batch)
    cache.allocate_paged(batch.reqs)
    padded = batch.padded_reqs  # 假请求也要有 positions / out_loc / input_ids
    positions = torch.cat([torch.arange(r.cached_len, r.device_len) for r in padded])
    rows = torch.cat([torch.full((r.extend_len,), r.table_idx) for r in padded])
    batch.positions = positions.to(engine.device, torch.int32)
    mapping = (rows.to(engine.device), batch.positions.long())
    batch.out_loc = engine.page_table[mapping]  # 每个新 token 的 KV 写到哪个槽位
    batch.input_ids = table.token_pool[mapping]
    engine.attn_backend.prepare_metadata(batch)  # 要在 padded_reqs 和 page table 都写好之后
    return batch


def process_output(table: TableManager, cache: CacheManager, reqs: List[Req], out: ForwardOutput) -> List[int]:
    """顺序：① 新 token 写进 token pool（还能 decode 的请求；下一步的 input_ids 从这里取）；② 等拷贝完成；
    ③ 有 NAN_TOKEN 就报错（这时还没接、没交还）；④ 接到每个请求后面，生成完的请求交还页和行。返回 token 列表。"""
    live = [i for i, r in enumerate(reqs) if r.can_decode]
    if live:  # 一次写，不按请求各写一次
        device = table.token_pool.device
        rows, cols = zip(*((reqs[i].table_idx, reqs[i].device_len - 1) for i in live))
        table.token_pool[torch.tensor(rows, device=device), torch.tensor(cols, device=device)] = \
            out.next_tokens_gpu[torch.tensor(live, device=device)]
    out.copy_done_event.synchronize()
    tokens = out.next_tokens_cpu.tolist()  # 本来就要读回 token：顺带查 NaN，不多一次同步
    if NAN_TOKEN in tokens:
        bad = [r.uid for r, t in zip(reqs, tokens) if t == NAN_TOKEN]
        raise FloatingPointError(f"请求 {bad} 这一步的 logits 里有 NaN（权重或输入坏了），采不出 token")
    for i, r in enumerate(reqs):
        r.append_host(out.next_tokens_cpu[i:i + 1])
        if not r.can_decode:
            cache.free(r.table_idx)
            table.free(r.table_idx)
    return tokens
