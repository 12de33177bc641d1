"""第 2 章两个测试文件共用的小工具。按完整的点分名字导入：from tests.ch2.common import ...
（各章目录没有 __init__.py，pytest 会把它们放上 sys.path，只写 common 会和别章的同名模块撞上）。"""

import torch

from minisgl.core import Batch, Req, SamplingParams

TIGHT = dict(rtol=1e-5, atol=1e-5)


def make_req(prompt_len, cached_len=0, uid=0):
    return Req(input_ids=torch.arange(prompt_len, dtype=torch.int32), table_idx=uid, cached_len=cached_len,
               output_len=4, uid=uid, sampling_params=SamplingParams(), cache_handle=None)


class LastTokenMetadata:
    """第 5 章起 LM head 从注意力元数据取每个请求最后一个 token 的行号；这里给一个最小的替身（之前各章不读它）。"""

    def __init__(self, reqs):
        self.extend_lens = [r.extend_len for r in reqs]

    def get_last_indices(self, bs):
        return (torch.tensor(self.extend_lens[:bs]).cumsum(0) - 1).to(torch.int32)


def make_batch(reqs, phase):
    b = Batch(reqs=reqs, phase=phase)
    b.input_ids = torch.cat([r.input_ids[r.cached_len:r.device_len] for r in reqs])
    b.positions = torch.cat([torch.arange(r.cached_len, r.device_len, dtype=torch.int32) for r in reqs])
    b.padded_reqs = list(reqs)
    b.attn_metadata = LastTokenMetadata(reqs)
    return b
