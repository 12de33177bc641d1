from abc import ABC, abstractmethod

import torch

from minisgl.layers import BaseOP


class BaseLLMModel(ABC, BaseOP):
    @abstractmethod
    def forward(self) -> torch.Tensor:
        """不接收参数：从全局 Context 读当前 batch，返回 (bs, vocab) 的 logits。"""
