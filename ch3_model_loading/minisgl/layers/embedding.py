"""词嵌入和 LM head，按词表切（词表并行）。

形状约定（tp 份中的一份，V_tp = ceil(V / tp)，E = embedding_dim）：
- VocabParallelEmbedding: weight (V_tp, E)；ids (N,) -> (N, E)。不归自己管的 id 查出 0，各份求和。
- ParallelLMHead:         weight (V_tp, E)；x (N, E) -> logits (bs, V)。prefill 时只有每个请求的最后一个 token
  进 LM head（其余位置的 logits 没人要）；各份的 logits 沿词表拼接（all-gather）。
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minisgl.core import get_global_ctx
from minisgl.distributed import DistributedCommunicator, get_tp_info
from minisgl.utils import div_ceil

from .base import _STATE_DICT, BaseOP, _check_full_shape, _check_leftovers


class VocabParallelEmbedding(BaseOP):
    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        tp = get_tp_info()
        self.tp_size = tp.size
        self.num_embeddings = num_embeddings
        self.num_embeddings_tp = div_ceil(num_embeddings, tp.size)
        start = self.num_embeddings_tp * tp.rank
        length = max(0, min(start + self.num_embeddings_tp, num_embeddings) - start)  # 靠后的 rank 可能一行都分不到
        self.vocab_range = (start, length)  # (起点, 长度)
        self.weight = torch.empty(self.num_embeddings_tp, embedding_dim)
        self._comm = DistributedCommunicator()

    def shard(self, full: torch.Tensor, part: int = 0) -> torch.Tensor:
        """按行切词表；词表不能整除时最后一份用 0 补齐到 V_tp 行。"""
        expected = (self.num_embeddings, self.weight.shape[1]) if full.dim() == 2 else (self.num_embeddings,)
        _check_full_shape(full, *expected)
        start, length = self.vocab_range
        local = full[start:start + length]
        if length < self.num_embeddings_tp:
            pad = local.new_zeros(self.num_embeddings_tp - length, *local.shape[1:])
            local = torch.cat([local, pad])
        return local

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(x, self.weight)
        start, length = self.vocab_range
        mine = (x >= start) & (x < start + length)
        y = F.embedding(torch.where(mine, x - start, 0), self.weight) * mine[:, None]
        return self._comm.all_reduce(y)


class ParallelLMHead(VocabParallelEmbedding):
    def __init__(self, num_embeddings: int, embedding_dim: int, bias: bool = False, tie_word_embeddings: bool = False,
                 tied_embedding: VocabParallelEmbedding | None = None) -> None:
        if (tied_embedding is not None) != tie_word_embeddings:
            raise ValueError("ParallelLMHead: tie_word_embeddings=True 时必须给 tied_embedding，反之不能给")
        super().__init__(num_embeddings, embedding_dim)
        self.bias = torch.empty(self.num_embeddings_tp) if bias else None
        self.tied_embedding = tied_embedding  # 绑定时权重归词嵌入所有：下面两个方法不把它算进自己的 state_dict

    def state_dict(self, *, prefix: str = "", result: _STATE_DICT | None = None) -> _STATE_DICT:
        if self.tied_embedding is None:
            return super().state_dict(prefix=prefix, result=result)
        return {} if result is None else result

    def load_state_dict(self, state_dict: _STATE_DICT, *, prefix: str = "", _internal: bool = False) -> None:
        if self.tied_embedding is None:
            return super().load_state_dict(state_dict, prefix=prefix, _internal=_internal)
        for name in ("weight", "bias"):  # 有的绑定检查点也存了一份 lm_head.weight：和 HF 一样忽略它
            state_dict.pop(f"{prefix}.{name}" if prefix else name, None)
        _check_leftovers(state_dict, _internal)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch = get_global_ctx().batch
        if batch.is_prefill:  # 只留每个请求的最后一个 token：(N, E) -> (bs, E)
            x = x[torch.tensor([r.extend_len for r in batch.reqs]).cumsum(0) - 1]
        weight = self.weight if self.tied_embedding is None else self.tied_embedding.weight
        logits = F.linear(x, weight, self.bias)
        if self.tp_size == 1:
            return logits
        bs = logits.shape[0]
        gathered = self._comm.all_gather(logits)  # (tp * bs, V_tp)，按 rank 排
        return gathered.view(self.tp_size, bs, -1).permute(1, 0, 2).reshape(bs, -1)[:, :self.num_embeddings]
