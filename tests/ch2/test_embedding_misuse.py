"""第 2 章起：词嵌入在每次前向时查一次 token id 是否在词表里。
（张量并行时越界的 id 会被当成别的 rank 的词，悄悄查出 0。）"""

import pytest
import torch

from minisgl.distributed import reset_tp_info, set_tp_info
from minisgl.layers import VocabParallelEmbedding


def embedding(vocab, dim, rank, tp):
    reset_tp_info()
    set_tp_info(rank, tp)
    try:
        emb = VocabParallelEmbedding(vocab, dim)
    finally:
        reset_tp_info()
    emb.weight = torch.randn(emb.num_embeddings_tp, dim)
    return emb


@pytest.mark.parametrize("tp, rank", [(1, 0), (2, 0), (2, 1)])
@pytest.mark.parametrize("ids", [[0, 10], [-1, 2], [3, 4, 99]])
def test_embedding_refuses_ids_outside_vocab(tp, rank, ids):
    emb = embedding(10, 4, rank, tp)
    with pytest.raises(ValueError) as e:
        emb.forward(torch.tensor(ids, dtype=torch.int32))
    msg = str(e.value)
    assert "vocab_size=10" in msg and f"[{min(ids)}, {max(ids)}]" in msg, msg


def test_embedding_accepts_the_whole_vocab():
    emb = embedding(10, 4, 0, 1)
    ids = torch.arange(10, dtype=torch.int32)
    assert torch.equal(emb.forward(ids), emb.weight[ids.long()])
