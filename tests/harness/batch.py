"""各章测试共用的请求和 batch：像调用方（阶段二的调度器）那样把字段填好。按完整的点分名字导入：
from tests.harness.batch import make_batch, make_req（要先让 import minisgl 得到被测的检查点）。"""

from __future__ import annotations

from typing import Sequence

import torch

from minisgl.core import Batch, Req, SamplingParams


def make_req(prompt_len: int = 5, cached_len: int = 0, table_idx: int | None = None, uid: int | None = None,
             ids: torch.Tensor | Sequence[int] | None = None, *, output_len: int = 4,
             sampling_params: SamplingParams | None = None) -> Req:
    """一个请求：提示词是 ids（默认 0, 1, …, prompt_len-1，int32）；table_idx 和 uid 只给一个时两者相同，都不给是 0。
    sampling_params 默认是生成 output_len 个 token 的贪心。"""
    ids = torch.arange(prompt_len, dtype=torch.int32) if ids is None else torch.as_tensor(ids, dtype=torch.int32)
    if len(ids) != prompt_len:
        raise ValueError(f"make_req：给了 {len(ids)} 个 ids，prompt_len 却是 {prompt_len}")
    row = table_idx if table_idx is not None else uid if uid is not None else 0
    return Req(input_ids=ids, table_idx=row, cached_len=cached_len, output_len=output_len,
               uid=row if uid is None else uid, cache_handle=None,
               sampling_params=SamplingParams(max_tokens=output_len) if sampling_params is None else sampling_params)


class LastTokenMetadata:
    """第 5 章起 LM head 从注意力元数据取每个请求最后一个 token 的行号；这里给一个最小的替身（之前各章不读它，
    第 5 章起注意力后端的 prepare_metadata 会换成真的）。"""

    def __init__(self, reqs: Sequence[Req]) -> None:
        self.extend_lens = [r.extend_len for r in reqs]

    def get_last_indices(self, bs: int) -> torch.Tensor:
        return (torch.tensor(self.extend_lens[:bs]).cumsum(0) - 1).to(torch.int32)


def make_batch(reqs: list[Req], phase: str = "prefill", padded: list[Req] | None = None, *,
               page_table: torch.Tensor | None = None) -> Batch:
    """填好 padded_reqs（默认就是 reqs）、input_ids、positions 和 LM head 要的 attn_metadata 替身；
    给了 page_table（第 4 章起）再按它查出 out_loc，positions 和 out_loc 放在 page_table 所在的设备上。"""
    batch = Batch(reqs=reqs, phase=phase)
    batch.padded_reqs = list(reqs) if padded is None else padded
    batch.input_ids = torch.cat([r.input_ids[r.cached_len:r.device_len] for r in batch.padded_reqs])
    batch.positions = torch.cat([torch.arange(r.cached_len, r.device_len, dtype=torch.int32)
                                 for r in batch.padded_reqs])
    batch.attn_metadata = LastTokenMetadata(batch.padded_reqs)
    if page_table is not None:
        rows = torch.cat([torch.full((r.extend_len,), r.table_idx) for r in batch.padded_reqs]).to(page_table.device)
        batch.positions = batch.positions.to(page_table.device)
        batch.out_loc = page_table[rows, batch.positions.long()]
    return batch
