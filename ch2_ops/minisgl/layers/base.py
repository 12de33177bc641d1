"""算子层的基类：不用 nn.Module，参数就是普通的 torch.Tensor 属性。

为什么不用 nn.Module：推理不需要 autograd、hooks 和参数注册；模型先在 meta 设备上"画"出形状，
再由 load_state_dict 把真张量换进来，这样加载时不会先分配一份没用的随机权重。
"""

from __future__ import annotations

from typing import Any, Dict, Generic, List, TypeVar

import torch

_STATE_DICT = Dict[str, torch.Tensor]


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _check_leftovers(state_dict: _STATE_DICT, internal: bool) -> None:
    """最外层的 load_state_dict 结束时还剩键：多出来的权重说明模型和检查点对不上。"""
    if not internal and state_dict:
        raise RuntimeError(f"state_dict 里有模型用不到的键：{sorted(state_dict)}")


def _check_full_shape(full: torch.Tensor, *expected: int) -> torch.Tensor:
    """切之前先核对完整形状：config 比权重小时，切片会悄悄截掉多出来的行或列，跑得通但 token 是错的。"""
    if tuple(full.shape) != expected:
        raise ValueError(f"检查点里的形状是 {tuple(full.shape)}，按 config 应当是 {expected}")
    return full


class BaseOP:
    """遍历 self.__dict__（按属性定义的顺序）：张量是参数，BaseOP 是子算子，
    名字以 _ 开头的和其他东西（数字、函数、None）都不算。
    子类用 torch.empty(...) 建参数、不写 dtype：跟着 torch 的默认 dtype，
    引擎才能按自己的 dtype（和 meta 设备）建模型。"""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def shard(self, full: torch.Tensor, part: int = 0) -> torch.Tensor:
        """完整的检查点张量 -> 本 rank 的那一份。默认不切（每个 rank 一份完整的，比如 norm 的权重）。
        合并的层（qkv、gate_up）由 part 指明是第几块。"""
        return full

    def state_dict(self, *, prefix: str = "", result: _STATE_DICT | None = None) -> _STATE_DICT:
        result = {} if result is None else result
        for name, value in self.__dict__.items():
            if name.startswith("_"):
                continue
            if isinstance(value, torch.Tensor):
                result[_join(prefix, name)] = value
            elif isinstance(value, BaseOP):
                value.state_dict(prefix=_join(prefix, name), result=result)
        return result

    def load_state_dict(self, state_dict: _STATE_DICT, *, prefix: str = "", _internal: bool = False) -> None:
        """从 state_dict 里取走（pop）自己的键，核对形状和 dtype，再把张量直接设成参数（不拷贝）。"""
        for name, param in self.__dict__.items():
            if name.startswith("_"):
                continue
            key = _join(prefix, name)
            if isinstance(param, torch.Tensor):
                if key not in state_dict:
                    raise KeyError(f"state_dict 里缺少 {key}（形状 {tuple(param.shape)}）")
                item = state_dict.pop(key)
                if item.shape != param.shape or item.dtype != param.dtype:
                    raise ValueError(f"{key}: 期望 {tuple(param.shape)} {param.dtype}，"
                                     f"得到 {tuple(item.shape)} {item.dtype}")
                setattr(self, name, item)
            elif isinstance(param, BaseOP):
                param.load_state_dict(state_dict, prefix=key, _internal=True)
        _check_leftovers(state_dict, _internal)


class StateLessOP(BaseOP):
    """没有参数的算子（比如 RoPE、注意力）：state_dict 为空，load 时只检查有没有多余的键。"""

    def state_dict(self, *, prefix: str = "", result: _STATE_DICT | None = None) -> _STATE_DICT:
        return {} if result is None else result

    def load_state_dict(self, state_dict: _STATE_DICT, *, prefix: str = "", _internal: bool = False) -> None:
        _check_leftovers(state_dict, _internal)


T = TypeVar("T", bound=BaseOP)


class OPList(BaseOP, Generic[T]):
    """一串同类算子（比如各个 decoder 层），键名是 {prefix}.{i}.…"""

    def __init__(self, ops: List[T]) -> None:
        self.op_list = ops

    def state_dict(self, *, prefix: str = "", result: _STATE_DICT | None = None) -> _STATE_DICT:
        result = {} if result is None else result
        for i, op in enumerate(self.op_list):
            op.state_dict(prefix=_join(prefix, str(i)), result=result)
        return result

    def load_state_dict(self, state_dict: _STATE_DICT, *, prefix: str = "", _internal: bool = False) -> None:
        for i, op in enumerate(self.op_list):
            op.load_state_dict(state_dict, prefix=_join(prefix, str(i)), _internal=True)
        _check_leftovers(state_dict, _internal)
