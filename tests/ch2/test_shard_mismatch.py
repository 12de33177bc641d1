"""第 2 章起：config 和检查点的形状对不上时，shard() 在切之前就拒绝（HF 也拒绝），而不是悄悄截掉多出来的行或列。

性质测试：随机生成一份 config，再让检查点在某一个字段上和它不同，tp = 1、2、4 的每个 rank 都按 config 建层、
对检查点里的完整张量调用 shard()。完整形状不符的张量必须报错并说出两个形状；相符的切出来正好是本地参数的形状。
"""

from contextlib import contextmanager

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minisgl.distributed import reset_tp_info, set_tp_info
from minisgl.layers import (LinearColParallelMerged, LinearOProj, LinearQKVMerged, LinearReplicated,
                            LinearRowParallel, ParallelLMHead, VocabParallelEmbedding)
from tests.harness.errors import expect_error

FIELDS = ["hidden", "inter", "heads", "kv_heads", "head_dim", "vocab"]


@contextmanager
def as_rank(rank, size):
    reset_tp_info()
    set_tp_info(rank, size)
    try:
        yield
    finally:
        reset_tp_info()


def full_tensors(c):
    """按一份"config"生成检查点里的完整张量（HF 的名字）：(张量, 切它的层的名字, part)。"""
    hid, q, kv = c["hidden"], c["heads"] * c["head_dim"], c["kv_heads"] * c["head_dim"]
    shapes = {"q_proj.weight": ((q, hid), "qkv", 0), "k_proj.weight": ((kv, hid), "qkv", 1),
              "v_proj.weight": ((kv, hid), "qkv", 2), "q_proj.bias": ((q,), "qkv", 0),
              "k_proj.bias": ((kv,), "qkv", 1), "v_proj.bias": ((kv,), "qkv", 2),
              "o_proj.weight": ((hid, q), "o_proj", 0), "gate_proj.weight": ((c["inter"], hid), "gate_up", 0),
              "up_proj.weight": ((c["inter"], hid), "gate_up", 1), "down_proj.weight": ((hid, c["inter"]), "down", 0),
              "embed_tokens.weight": ((c["vocab"], hid), "embed", 0), "lm_head.weight": ((c["vocab"], hid), "head", 0),
              "router.weight": ((c["inter"], hid), "replicated", 0)}
    return {name: (torch.zeros(shape), op, part) for name, (shape, op, part) in shapes.items()}


def build_layers(c):
    q_heads, hid = c["heads"], c["hidden"]
    return {"qkv": LinearQKVMerged(hid, c["head_dim"], q_heads, c["kv_heads"], has_bias=True),
            "o_proj": LinearOProj(q_heads * c["head_dim"], hid, has_bias=False),
            "gate_up": LinearColParallelMerged(hid, [c["inter"], c["inter"]], has_bias=False),
            "down": LinearRowParallel(c["inter"], hid, has_bias=False),
            "embed": VocabParallelEmbedding(c["vocab"], hid), "head": ParallelLMHead(c["vocab"], hid),
            "replicated": LinearReplicated(hid, c["inter"], has_bias=False)}


def local_rows(op, part, full):
    """shard 切出来的那份应有的行数（weight 和 bias 一样）。"""
    if isinstance(op, LinearQKVMerged):
        return (op.local_qo_heads if part == 0 else op.local_kv_heads) * op.head_dim
    if isinstance(op, LinearColParallelMerged):
        return op.output_sizes[part]
    return op.weight.shape[0]


@st.composite
def config_and_checkpoint(draw):
    tp = draw(st.sampled_from([1, 2, 4]))
    config = {"hidden": draw(st.sampled_from([4, 8, 12])), "inter": tp * draw(st.integers(1, 3)),
              "heads": tp * draw(st.integers(1, 2)), "kv_heads": draw(st.sampled_from([1, 2, 4])),
              "head_dim": draw(st.sampled_from([2, 4])), "vocab": draw(st.integers(3, 17))}
    ckpt = dict(config)
    field = draw(st.sampled_from(FIELDS + [None]))  # None：两边一致，什么都不该拒绝
    if field is not None:
        ckpt[field] = draw(st.integers(1, 2 * config[field] + 3).filter(lambda v: v != config[field]))
    return tp, config, ckpt


@settings(max_examples=120, deadline=None)
@given(config_and_checkpoint())
def test_task3_shard_refuses_config_that_disagrees_with_checkpoint(case):
    tp, config, ckpt = case
    tensors, expected = full_tensors(ckpt), full_tensors(config)
    assert any(t.shape != expected[n][0].shape for n, (t, _, _) in tensors.items()) == (config != ckpt)
    for rank in range(tp):
        with as_rank(rank, tp):
            layers = build_layers(config)
        for name, (full, op_name, part) in tensors.items():
            op, want = layers[op_name], tuple(expected[name][0].shape)
            if tuple(full.shape) != want:
                with expect_error("ch2/shard_shape", full=tuple(full.shape), expected=want):
                    op.shard(full, part)
            else:
                local = op.shard(full, part)
                assert local.shape[0] == local_rows(op, part, full), name
                assert local.shape[1:] == (op.weight.shape[1:] if full.dim() == 2 else ()), name
