"""可插拔的注意力后端：按名字登记，"p,d" 形式表示 prefill 和 decode 各用一个。"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Callable, Dict

from .base import BaseAttnBackend, BaseAttnMetadata, HybridBackend
from .gpu import create_gpu_backend, require_gpu
from .torch_backend import TorchAttnMetadata, TorchBackend

if TYPE_CHECKING:
    from minisgl.models import ModelConfig

BackendCreator = Callable[["ModelConfig"], BaseAttnBackend]
SUPPORTED_ATTENTION_BACKENDS: Dict[str, BackendCreator] = {
    "torch": TorchBackend,
    "fi": partial(create_gpu_backend, "fi"),
    "fa": partial(create_gpu_backend, "fa"),
}


def validate_attn_backend(backend: str, allow_auto: bool = True) -> str:
    """名字认识、要 GPU 的后端确实有 GPU。和官方一样由 create_attention_backend 在建后端之前调用，只查这一次。
    allow_auto=True 时 "auto" 原样放行（还没定下来，留给引擎定）；False 时它和不认识的名字一样抛 ValueError。"""
    names = backend.split(",")
    if backend == "auto" and allow_auto:
        return backend
    unknown = [n for n in names if n not in SUPPORTED_ATTENTION_BACKENDS]
    if len(names) > 2 or unknown or not all(names):
        raise ValueError(f"不认识的注意力后端 {backend!r}：可选 {', '.join(SUPPORTED_ATTENTION_BACKENDS)}，"
                         f"或者 \"prefill,decode\" 两个名字用一个逗号连起来")
    for name in names:  # 没有 GPU 却要 GPU 后端：说清楚是哪个、改用什么，而不是 ImportError 的回溯
        require_gpu(name)
    return backend


def create_attention_backend(backend: str, config: ModelConfig) -> BaseAttnBackend:
    """创建前要先设好 ctx.kv_cache：后端在构造时拿到 KV 池。"""
    names = validate_attn_backend(backend, allow_auto=False).split(",")
    if len(names) == 2 and names[0] != names[1]:
        prefill, decode = (SUPPORTED_ATTENTION_BACKENDS[n](config) for n in names)
        return HybridBackend(prefill, decode)
    return SUPPORTED_ATTENTION_BACKENDS[names[0]](config)


__all__ = ["BaseAttnBackend", "BaseAttnMetadata", "HybridBackend", "TorchBackend", "TorchAttnMetadata",
           "SUPPORTED_ATTENTION_BACKENDS", "validate_attn_backend", "create_attention_backend"]
