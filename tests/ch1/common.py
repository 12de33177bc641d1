"""第 1 章测试共用的小工具。按完整的点分名字导入：from tests.ch1.common import ...（理由见 tests/ch3/common.py）。"""

import torch

from minisgl.core import Batch


def ready_batch(reqs, phase="prefill"):
    """字段都填好的 batch：ctx.forward_batch 会先检查它。"""
    b = Batch(reqs=reqs, phase=phase)
    b.padded_reqs = reqs
    b.input_ids = torch.cat([r.input_ids[r.cached_len:r.device_len] for r in reqs])
    b.positions = torch.cat([torch.arange(r.cached_len, r.device_len, dtype=torch.int32) for r in reqs])
    return b
