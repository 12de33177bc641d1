"""模拟的 CUDA 守的跨设备规则：一张表（rules.toml），一条规则一个测试（tests/repo/test_cuda_emu.py），
每条写着它照抄的 CUDA 行为。

拒绝 CUDA 接受的写法，和接受 CUDA 拒绝的写法一样是错的：所以"哪些算子能跨设备"逐条列出，而不是一刀切。
报错的措辞照抄 PyTorch 在 CUDA 上的原话，再补上算子名：读者在真 GPU 上看到的就是这一句。
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from tools.manifest import tomllib

aten = torch.ops.aten


@dataclass(frozen=True)
class Rule:
    name: str
    what: str  # 这条规则在模拟里做什么
    cuda: str  # 照抄的 CUDA 行为（PyTorch 源码里的出处）


RULES = [Rule(**r) for r in tomllib.loads(Path(__file__).with_name("rules.toml").read_text("utf-8"))["rule"]]

# copy_ / .to：跨设备是合法的（rule copy）
CROSS_DEVICE_COPIES = {aten.copy_.default, aten._to_copy.default, aten._copy_from.default,
                       aten._copy_from_and_resize.default}
# 高级索引：下标张量可以在 CPU 上（rule index-cpu-indices）
ADVANCED_INDEXING = {aten.index.Tensor, aten.index_put_.default, aten.index_put.default, aten._index_put_impl_.default}
# 0 维 CPU 张量也不算标量的算子（rule index-select-same-device）
STRICT_INDEX_OPS = {aten.index_select.default, aten.embedding.default, aten.gather.default, aten.scatter.src,
                    aten.scatter.value, aten.scatter_.src, aten.scatter_.value}
# 输出形状取决于数据：CUDA 上要先把大小读回主存（rule host-sync）
DATA_DEPENDENT = {aten.nonzero.default, aten.masked_select.default, aten._unique2.default, aten.unique_dim.default,
                  aten.unique_consecutive.default, aten.repeat_interleave.Tensor, aten.equal.default,
                  aten.is_nonzero.default}


class CrossDeviceError(RuntimeError):
    """模拟的 CUDA 拒绝了一次真 GPU 也会拒绝的跨设备调用。"""


class CrossDeviceIndexError(IndexError):
    """下标在别的 GPU 上：CUDA 用 TORCH_CHECK_INDEX 报，Python 里是 IndexError。"""


def _where(func) -> str:
    return f"（算子 {func.name()}）"


def check_devices(func, tensors: list[tuple[torch.Tensor, torch.device]], index_devices: list[torch.device]) -> None:
    """tensors：算子的张量参数和各自（模拟后的）设备，不含高级索引的下标；index_devices：高级索引的下标所在设备。
    不合 CUDA 的规矩就抛 CrossDeviceError，一行说出算子和设备。"""
    if func in CROSS_DEVICE_COPIES:
        return
    strict = func in STRICT_INDEX_OPS
    devices = []
    for t, d in tensors:
        if not strict and d.type == "cpu" and t.dim() == 0:
            continue  # rule cpu-scalar
        if d not in devices:
            devices.append(d)
    if len(devices) > 1:
        a, b = sorted(devices, key=lambda d: d.type != "cuda")[:2]
        raise CrossDeviceError(f"Expected all tensors to be on the same device, but found at least two devices, "
                               f"{a} and {b}! {_where(func)}")
    if func in ADVANCED_INDEXING and devices:
        self_device = tensors[0][1]
        for d in index_devices:
            if d.type != "cpu" and d != self_device:
                raise CrossDeviceIndexError("indices should be either on cpu or on the same device as the indexed "
                                            f"tensor ({self_device}) {_where(func)}")

