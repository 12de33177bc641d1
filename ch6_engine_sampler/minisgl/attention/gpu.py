"""官方在 GPU 上用的后端：FlashInfer（"fi"）和 FlashAttention 3/4（"fa"，来自 sgl_kernel）。

阶段一的课程只实现纯 PyTorch 的参照后端；这里把官方的名字登记上，在没有它们的机器上要求它们时，
给出清楚的错误，而不是 ImportError 的回溯。
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

import torch

from .base import BaseAttnBackend

if TYPE_CHECKING:
    from minisgl.models import ModelConfig

_NEEDS = {"fi": ("flashinfer", "FlashInfer"), "fa": ("sgl_kernel", "FlashAttention（sgl_kernel）")}


def require_gpu(name: str) -> None:
    """name 是 GPU 后端时，查这台机器有没有 GPU 和对应的包；'torch' 什么都不查。"""
    if name not in _NEEDS:
        return
    module, title = _NEEDS[name]
    if not torch.cuda.is_available():
        raise RuntimeError(f"注意力后端 {name!r} 是 {title}，需要 CUDA GPU；这台机器没有 GPU，请用 'torch'")
    if importlib.util.find_spec(module) is None:
        raise RuntimeError(f"注意力后端 {name!r} 需要 Python 包 {module}，没有安装；请安装它或改用 'torch'")


def create_gpu_backend(name: str, config: ModelConfig) -> BaseAttnBackend:
    """"fi" / "fa" 后端：阶段一没有实现，有 GPU 时也只抛一句 NotImplementedError，指向官方的实现。"""
    title = _NEEDS[name][1]
    raise NotImplementedError(f"阶段一只实现了 'torch' 后端；{title} 后端见官方 mini-sglang 的 "
                              f"python/minisgl/attention/{name}.py")
