"""请求、批次和全局上下文：引擎里每个模块都从这里读"当前在算什么"。

字段名和含义与官方 mini-sglang 的 core.py 一致。后面几章才用到的字段（out_loc、page_table、
attn_backend、attn_metadata …）在这里先声明；KV 池和注意力后端的类型，等第 4、5 章有了它们再写上。
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, List, Literal

import torch

if TYPE_CHECKING:  # 只给类型检查器看：运行时不导入，import core 照样很轻
    from minisgl.attention import BaseAttnBackend, BaseAttnMetadata
    from minisgl.kvcache import BaseKVCachePool


@dataclass
class SamplingParams:
    temperature: float = 0.0
    top_k: int = -1
    top_p: float = 1.0
    ignore_eos: bool = False
    max_tokens: int = 1024

    def __post_init__(self) -> None:
        """越界的参数在这里就拒绝：到了采样器里它们只会变成 NaN，或者被悄悄截断。"""
        t, k, p, n = self.temperature, self.top_k, self.top_p, self.max_tokens
        number = (int, float)
        rules = [("temperature", isinstance(t, number) and math.isfinite(t) and t >= 0, "有限且 >= 0（0 是贪心）"),
                 ("top_k", isinstance(k, int) and (k == -1 or k >= 1), "-1（不截断）或 >= 1 的整数"),
                 ("top_p", isinstance(p, number) and 0.0 <= p <= 1.0, "在 [0, 1] 里"),
                 ("max_tokens", isinstance(n, int) and n >= 1, ">= 1 的整数")]
        for name, ok, want in rules:
            if not ok:
                raise ValueError(f"SamplingParams.{name}={getattr(self, name)!r} 越界：应当{want}")

    @property
    def is_greedy(self) -> bool:
        """(temperature 为 0 或 top_k 为 1) 且 top_p 为 1：采样器直接取 argmax。"""
        return (self.temperature <= 0.0 or self.top_k == 1) and self.top_p == 1.0


@dataclass(eq=False)  # 按对象身份哈希：调度器会把请求放进 set
class Req:
    """一个请求。三个长度字段描述它的 KV 走到了哪里：

    - cached_len：位置 [0, cached_len) 的 KV 已经在缓存里；
    - device_len：已经存在的 token 数；这次前向要为 [cached_len, device_len) 写 KV；
    - max_device_len：提示词长度 + 最多生成的 token 数，device_len 的上限。

    device_len、max_device_len 不是构造参数（不是 dataclass 字段）：__post_init__ 里由 len(input_ids) 和
    len(input_ids) + output_len 算出来，存成普通属性。
    """

    input_ids: torch.Tensor  # CPU 上的 int32 一维张量，随 append_host 变长
    table_idx: int  # 在 page table（以及 token pool）里的行号
    cached_len: int
    output_len: int
    uid: int
    sampling_params: SamplingParams | None
    cache_handle: Any  # 前缀缓存的句柄：阶段二才用，引擎不碰它

    def __post_init__(self) -> None:
        if not (isinstance(self.input_ids, torch.Tensor) and self.input_ids.dim() == 1 and self.input_ids.is_cpu):
            raise ValueError(f"Req(uid={self.uid}): input_ids 必须是 CPU 上的一维张量")
        self.device_len = len(self.input_ids)
        self.max_device_len = len(self.input_ids) + self.output_len
        if not 0 <= self.cached_len < self.device_len <= self.max_device_len:
            raise ValueError(f"Req(uid={self.uid}): 需要 0 <= cached_len({self.cached_len}) < "
                             f"device_len({self.device_len}) <= max_device_len({self.max_device_len})")

    @property
    def extend_len(self) -> int:
        """这次前向要喂进去的 token 数：prefill 时是整段提示词，decode 时是 1。"""
        return self.device_len - self.cached_len

    @property
    def remain_len(self) -> int:
        """还能再生成几个 token：max_device_len - device_len。"""
        return self.max_device_len - self.device_len

    @property
    def can_decode(self) -> bool:
        """remain_len > 0：还能再前向一次。"""
        return self.remain_len > 0

    def complete_one(self) -> None:
        """引擎在一次前向之后调用：这次的 KV 已写好，并且又采样出了一个 token（还不在 input_ids 里）。"""
        self.cached_len = self.device_len
        self.device_len += 1

    def append_host(self, next_token: torch.Tensor) -> None:
        """调用方（阶段二是调度器）把采样出的 token 接到 input_ids 后面，形状 (1,)。"""
        self.input_ids = torch.cat([self.input_ids, next_token.to(self.input_ids.dtype)])

    def __repr__(self) -> str:
        return (f"Req(uid={self.uid}, table_idx={self.table_idx}, cached_len={self.cached_len}, "
                f"device_len={self.device_len}, max_device_len={self.max_device_len})")


@dataclass
class Batch:
    reqs: List[Req]
    phase: Literal["prefill", "decode"]
    # 以下由调用方在前向之前填好（阶段二由调度器填）；N = 各请求 extend_len 之和
    input_ids: torch.Tensor = field(init=False)  # (N,) int32
    positions: torch.Tensor = field(init=False)  # (N,) int32
    out_loc: torch.Tensor = field(init=False)  # (N,) int32，每个新 token 的 KV 写到哪个槽位（第 4 章起）
    padded_reqs: List[Req] = field(init=False)  # reqs + 凑批用的假请求（第 6 章的 pad_batch）
    attn_metadata: BaseAttnMetadata = field(init=False)  # 注意力后端的元数据（第 5 章起）

    @property
    def is_prefill(self) -> bool:
        """phase == "prefill"。"""
        return self.phase == "prefill"

    @property
    def is_decode(self) -> bool:
        """phase == "decode"。"""
        return self.phase == "decode"

    @property
    def size(self) -> int:
        """真实请求数 len(reqs)，不含凑批的假请求。"""
        return len(self.reqs)

    @property
    def padded_size(self) -> int:
        """len(padded_reqs)：凑批之后的请求数（第 6 章起可能比 size 大）。"""
        return len(self.padded_reqs)


@dataclass
class Context:
    page_size: int
    page_table: torch.Tensor = field(init=False)  # (请求行数, 最大长度) int32，存的是原始 token 槽位（第 4 章起）
    attn_backend: BaseAttnBackend = field(init=False)  # 第 5 章起
    kv_cache: BaseKVCachePool = field(init=False)  # 第 4 章起是预分配的 KV 池（第 1~3 章是朴素的 NaiveKVCache）
    _batch: Batch | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if isinstance(self.page_size, bool) or not isinstance(self.page_size, int) or self.page_size < 1:
            raise ValueError(f"Context.page_size={self.page_size!r}：页大小必须是正整数")

    @property
    def batch(self) -> Batch:
        """当前正在前向的 batch：只在 with forward_batch(batch) 里面能读，别处读抛 RuntimeError。"""
        if self._batch is None:
            raise RuntimeError("当前没有正在前向的 batch：只能在 ctx.forward_batch(batch) 里面读 ctx.batch")
        return self._batch

    @contextmanager
    def forward_batch(self, batch: Batch) -> Iterator[None]:
        """with 块里 ctx.batch 就是 batch；不能嵌套（RuntimeError），出块时哪怕抛了异常也把它清掉。"""
        if self._batch is not None:
            raise RuntimeError("ctx.forward_batch 不能嵌套：上一个 batch 的前向还没结束")
        self._batch = batch
        try:
            yield
        finally:
            self._batch = None


_GLOBAL_CTX: Context | None = None


def set_global_ctx(ctx: Context) -> None:
    """设置全局 Context；只能设一次（要换先 reset_global_ctx()），再设抛 RuntimeError。"""
    global _GLOBAL_CTX
    if _GLOBAL_CTX is not None:
        raise RuntimeError("全局 Context 已经设置过了；要换一个先调用 reset_global_ctx()")
    _GLOBAL_CTX = ctx


def get_global_ctx() -> Context:
    """取全局 Context；还没设置（或已 reset）时抛 RuntimeError。"""
    if _GLOBAL_CTX is None:
        raise RuntimeError("全局 Context 还没有设置：先 set_global_ctx(Context(page_size))")
    return _GLOBAL_CTX


def reset_global_ctx() -> None:
    """测试要在一个进程里反复建 Context。"""
    global _GLOBAL_CTX
    _GLOBAL_CTX = None
