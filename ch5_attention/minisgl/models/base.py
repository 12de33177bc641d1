from abc import ABC, abstractmethod
from typing import Dict, Tuple

import torch

from minisgl.layers import BaseOP


class BaseLLMModel(ABC, BaseOP):
    # 检查点里分开存、引擎里合成一块的权重（nano-vllm 的写法）：HF 的模块名 -> (合并后的模块名, 第几块)。
    # 加载器问模型要这张表，自己不记任何名字
    packed_modules_mapping: Dict[str, Tuple[str, int]] = {}

    @abstractmethod
    def forward(self) -> torch.Tensor:
        """不接收参数：从全局 Context 读当前 batch，返回 (bs, vocab) 的 logits。"""
