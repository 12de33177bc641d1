"""第 2 章（单卡）：BaseOP 的 state_dict 规则，各算子的形状约定，以及 RMSNorm / RoPE / SiLU 和 HF 逐位对齐。"""

from contextlib import contextmanager

import pytest
import torch
import torch.nn.functional as F

from minisgl import core
from minisgl.core import Context
from minisgl.distributed import DistributedCommunicator, DistributedImpl, reset_tp_info, set_tp_info
from minisgl.layers import (BaseOP, LinearColParallelMerged, LinearOProj, LinearQKVMerged, LinearReplicated,
                            LinearRowParallel, OPList, ParallelLMHead, RMSNorm, RMSNormFused, RotaryConfig,
                            RotaryEmbedding, StateLessOP, VocabParallelEmbedding, get_rope, silu_and_mul)
from tests.ch2.common import TIGHT
from tests.harness.batch import make_batch, make_req
from tests.harness.errors import expect_error


@contextmanager
def default_dtype(dtype):
    """引擎按自己的 dtype 构造算子（torch.empty 用默认 dtype）。"""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


class NoComm(DistributedImpl):
    """单卡时算子不许碰通信：一碰就失败。"""

    def all_reduce(self, x):
        raise AssertionError("tp=1 时不应调用 all_reduce")

    def all_gather(self, x):
        raise AssertionError("tp=1 时不应调用 all_gather")


@pytest.fixture(autouse=True)
def single_card(monkeypatch):
    reset_tp_info()
    core.reset_global_ctx()
    monkeypatch.setattr(DistributedCommunicator, "plugins", [NoComm()])
    set_tp_info(0, 1)
    try:
        yield
    finally:
        reset_tp_info()
        core.reset_global_ctx()


def rand_like_params(op, seed=0):
    """按 op 自己的 state_dict 造一份同形状同 dtype 的随机权重。"""
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(v.shape, generator=g).to(v.dtype) for k, v in op.state_dict().items()}


# ---------------------------------------------------------------- task1：state_dict 的规则

class Leaf(BaseOP):
    def __init__(self, n):
        self.weight = torch.randn(n, 2)
        self.bias = torch.randn(n)
        self.eps = 1e-6  # 不是张量：不算参数
        self.nothing = None  # None 也不算
        self._cache = torch.zeros(3)  # 下划线开头：跳过


class Table(StateLessOP):
    def __init__(self):
        self.table = torch.ones(4)  # 无状态算子即使有张量属性也不进 state_dict


class Block(BaseOP):
    def __init__(self):
        self.norm = Leaf(3)
        self.layers = OPList([Leaf(2), Leaf(4)])
        self.rope = Table()
        self.scale = torch.ones(1)
        self._helper = Leaf(5)  # 下划线开头的子算子也跳过


BLOCK_KEYS = ["norm.weight", "norm.bias", "layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias",
              "scale"]


def fresh_block_sd():
    b = Block()
    return {k: torch.randn(v.shape) for k, v in b.state_dict().items()}


def test_task1_state_dict_keys():
    b = Block()
    sd = b.state_dict()
    assert list(sd) == BLOCK_KEYS  # 按属性定义的顺序
    assert sd["scale"] is b.scale  # 不拷贝
    assert sd["layers.1.weight"] is b.layers.op_list[1].weight
    assert list(b.state_dict(prefix="model")) == [f"model.{k}" for k in BLOCK_KEYS]
    assert list(OPList([Leaf(1), Leaf(1)]).state_dict(prefix="layers")) == [
        "layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias"]


def test_task1_load_consumes_and_replaces_without_copy():
    b = Block()
    helper_w, cache = b._helper.weight, b.norm._cache
    sd = fresh_block_sd()
    new = dict(sd)
    b.load_state_dict(sd)
    assert sd == {}  # 全部被取走
    for k, t in new.items():
        obj = b
        for part in k.split(".")[:-1]:
            obj = obj.op_list[int(part)] if isinstance(obj, OPList) else getattr(obj, part)
        assert getattr(obj, k.split(".")[-1]) is t  # 直接换成给的张量对象
    assert b._helper.weight is helper_w  # 下划线的不动
    assert b.norm._cache is cache


@pytest.mark.parametrize("key", ["norm.bias", "layers.1.weight", "scale"])
def test_task1_shape_mismatch_names_key(key):
    sd = fresh_block_sd()
    want = tuple(sd[key].shape)
    sd[key] = torch.randn(*sd[key].shape[:-1], sd[key].shape[-1] + 1)
    with expect_error("ch2/state_mismatch", key=key, want=want, got=tuple(sd[key].shape)):
        Block().load_state_dict(sd)


@pytest.mark.parametrize("key", ["norm.weight", "layers.0.bias"])
def test_task1_dtype_mismatch_names_key(key):
    sd = fresh_block_sd()
    sd[key] = sd[key].double()
    with expect_error("ch2/state_mismatch", key=key, want=torch.float32, got=torch.float64):
        Block().load_state_dict(sd)


@pytest.mark.parametrize("key", ["norm.weight", "layers.1.bias", "scale"])
def test_task1_missing_key_raises_key_error(key):
    sd = fresh_block_sd()
    del sd[key]
    with expect_error("ch2/state_missing", key=key):
        Block().load_state_dict(sd)


def test_task1_leftover_keys_are_listed():
    sd = fresh_block_sd()
    sd["layers.2.weight"] = torch.randn(1)
    sd["rope.table"] = torch.ones(4)
    with expect_error("ch2/state_leftover", keys=["layers.2.weight", "rope.table"]):
        Block().load_state_dict(sd)
    assert sorted(sd) == ["layers.2.weight", "rope.table"]  # 用得上的都已取走，只剩多余的
    ops = OPList([Leaf(2)])
    with expect_error("ch2/state_leftover", keys=["1.bias"]):
        ops.load_state_dict({"0.weight": torch.randn(2, 2), "0.bias": torch.randn(2), "1.bias": torch.randn(2)})


def test_task1_stateless_op():
    t = Table()
    assert t.state_dict() == {}
    t.load_state_dict({})
    with expect_error("ch2/state_leftover", keys=["table"]):
        t.load_state_dict({"table": torch.ones(4)})
    rope = RotaryEmbedding(8, 8, 16, 10000.0)
    assert rope.state_dict() == {}
    with expect_error("ch2/state_leftover", keys=["extra"]):
        rope.load_state_dict({"extra": torch.ones(1)})


# ---------------------------------------------------------------- task2：单卡的形状约定和算术

def test_task2_linear_shapes():
    x = torch.randn(5, 16)
    cases = [
        (LinearReplicated(16, 6, has_bias=True), (6, 16), 6),
        (LinearColParallelMerged(16, [12, 20], has_bias=False), (32, 16), 32),
        (LinearQKVMerged(16, head_dim=4, num_qo_heads=4, num_kv_heads=2, has_bias=True), ((4 + 2 * 2) * 4, 16), 32),
        (LinearRowParallel(16, 8, has_bias=True), (8, 16), 8),
        (LinearOProj(16, 8, has_bias=False), (8, 16), 8),
    ]
    for op, wshape, out in cases:
        sd = op.state_dict()
        assert tuple(sd["weight"].shape) == wshape, type(op).__name__
        assert ("bias" in sd) == (op.bias is not None)
        if "bias" in sd:
            assert tuple(sd["bias"].shape) == (wshape[0],)
        w = rand_like_params(op)
        op.load_state_dict(dict(w))
        y = op.forward(x)
        assert y.shape == (5, out), type(op).__name__
        torch.testing.assert_close(y, F.linear(x, w["weight"], w.get("bias")), **TIGHT)


def test_task2_tp1_shard_is_identity():
    full = torch.randn(8, 16)
    assert torch.equal(LinearRowParallel(16, 8, True).shard(full), full)
    assert torch.equal(LinearRowParallel(16, 8, True).shard(full[:, 0]), full[:, 0])  # bias
    assert torch.equal(LinearColParallelMerged(16, [8, 8], False).shard(full, 1), full)
    qkv = LinearQKVMerged(16, head_dim=4, num_qo_heads=2, num_kv_heads=2, has_bias=False)
    assert all(torch.equal(qkv.shard(full, p), full) for p in range(3))
    assert torch.equal(VocabParallelEmbedding(8, 16).shard(full), full)


def test_task2_embedding_lookup():
    emb = VocabParallelEmbedding(10, 8)
    assert tuple(emb.state_dict()["weight"].shape) == (10, 8)
    w = torch.randn(10, 8)
    emb.load_state_dict({"weight": w})
    ids = torch.tensor([3, 0, 9, 3, 7], dtype=torch.int32)
    torch.testing.assert_close(emb.forward(ids), w[ids.long()], rtol=0, atol=0)


@pytest.fixture
def ctx():
    c = Context(page_size=1)
    core.set_global_ctx(c)
    return c


def test_task2_lm_head_untied_prefill_takes_last_token(ctx):
    lm = ParallelLMHead(11, 8)
    assert list(lm.state_dict()) == ["weight"]
    assert tuple(lm.weight.shape) == (11, 8)
    w = torch.randn(11, 8)
    lm.load_state_dict({"weight": w})
    reqs = [make_req(3), make_req(6, cached_len=4, uid=1), make_req(1, uid=2)]  # extend_len = 3, 2, 1
    x = torch.randn(6, 8)
    with ctx.forward_batch(make_batch(reqs, "prefill")):
        logits = lm.forward(x)
    assert logits.shape == (3, 11)
    torch.testing.assert_close(logits, x[[2, 4, 5]] @ w.T, **TIGHT)


def test_task2_lm_head_decode(ctx):
    lm = ParallelLMHead(11, 8)
    w = torch.randn(11, 8)
    lm.load_state_dict({"weight": w})
    reqs = [make_req(5, cached_len=4, uid=i) for i in range(3)]
    x = torch.randn(3, 8)
    with ctx.forward_batch(make_batch(reqs, "decode")):
        logits = lm.forward(x)
    assert logits.shape == (3, 11)
    torch.testing.assert_close(logits, x @ w.T, **TIGHT)


class TiedModel(BaseOP):
    def __init__(self, tie):
        self.embed = VocabParallelEmbedding(11, 8)
        self.lm_head = ParallelLMHead(11, 8, tie_word_embeddings=tie, tied_embedding=self.embed if tie else None)


def test_task2_lm_head_tied(ctx):
    m = TiedModel(tie=True)
    assert list(m.state_dict()) == ["embed.weight"]  # 权重只属于词嵌入
    assert list(TiedModel(tie=False).state_dict()) == ["embed.weight", "lm_head.weight"]
    w = torch.randn(11, 8)
    sd = {"embed.weight": w, "lm_head.weight": torch.zeros(11, 8)}  # 有的检查点多存一份：悄悄忽略
    m.load_state_dict(sd)
    assert sd == {}
    assert m.embed.weight is w
    m.lm_head.weight = torch.zeros(11, 8)  # 就算 lm_head 自己有个 weight 属性，也不该用它
    reqs = [make_req(4), make_req(2, uid=1)]
    x = torch.randn(6, 8)
    with ctx.forward_batch(make_batch(reqs, "prefill")):
        logits = m.lm_head.forward(x)
    torch.testing.assert_close(logits, x[[3, 5]] @ w.T, **TIGHT)
    lm = ParallelLMHead(11, 8, tie_word_embeddings=True, tied_embedding=VocabParallelEmbedding(11, 8))
    sd = {"weight": torch.randn(11, 8)}
    lm.load_state_dict(sd)
    assert sd == {}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_task2_rmsnorm_matches_hf(dtype):
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    torch.manual_seed(0)
    eps = 1e-6
    w = torch.randn(16).to(dtype)
    hf = Qwen3RMSNorm(16, eps=eps).to(dtype)
    hf.weight.data.copy_(w)
    with default_dtype(dtype):
        norm = RMSNorm(16, eps)
    assert tuple(norm.state_dict()["weight"].shape) == (16,)
    norm.load_state_dict({"weight": w})
    tol = TIGHT if dtype == torch.float32 else dict(rtol=0, atol=0)
    for shape in [(5, 16), (5, 3, 16)]:  # 3 维就是 q/k norm：每个头单独归一化
        x = (torch.randn(shape) * 3).to(dtype)
        y = norm.forward(x)
        assert y.shape == x.shape
        assert y.dtype == dtype
        with torch.no_grad():
            torch.testing.assert_close(y, hf(x), **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_task2_rmsnorm_fused_matches_hf(dtype):
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    torch.manual_seed(1)
    w = torch.randn(16).to(dtype)
    hf = Qwen3RMSNorm(16, eps=1e-5).to(dtype)
    hf.weight.data.copy_(w)
    with default_dtype(dtype):
        norm = RMSNormFused(16, 1e-5)
    norm.load_state_dict({"weight": w})
    x, r = torch.randn(4, 16).to(dtype), torch.randn(4, 16).to(dtype)
    tol = TIGHT if dtype == torch.float32 else dict(rtol=0, atol=0)
    with torch.no_grad():
        y, res = norm.forward(x, None)
        torch.testing.assert_close(res, x, rtol=0, atol=0)
        torch.testing.assert_close(y, hf(x), **tol)
        y, res = norm.forward(x, r)
        torch.testing.assert_close(res, x + r, rtol=0, atol=0)
        torch.testing.assert_close(y, hf(x + r), **tol)


def test_task2_silu_and_mul():
    x = torch.randn(5, 12)
    y = silu_and_mul(x)
    gate, up = x[:, :6], x[:, 6:]
    assert y.shape == (5, 6)
    torch.testing.assert_close(y, gate * torch.sigmoid(gate) * up, **TIGHT)


LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}


def hf_rope(q, k, positions, head_dim, base, max_pos, scaling):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    n_q, n_k = q.shape[1] // head_dim, k.shape[1] // head_dim
    cfg = LlamaConfig(hidden_size=n_q * head_dim, num_attention_heads=n_q, num_key_value_heads=n_k,
                      head_dim=head_dim, max_position_embeddings=max_pos, rope_theta=base,
                      rope_scaling=dict(scaling) if scaling else None)  # HF 会往 dict 里写 rope_theta：给它一份拷贝
    rot = LlamaRotaryEmbedding(cfg)
    with torch.no_grad():
        cos, sin = rot(q, positions.long()[None])  # (1, N, D)
        qh, kh = apply_rotary_pos_emb(q.view(len(q), n_q, head_dim), k.view(len(k), n_k, head_dim),
                                      cos[0], sin[0], unsqueeze_dim=1)
    return qh.reshape(q.shape), kh.reshape(k.shape)


@pytest.mark.parametrize("scaling", [None, LLAMA3], ids=["default", "llama3"])
@pytest.mark.parametrize("base", [10000.0, 500000.0])
def test_task2_rope_matches_hf(scaling, base):
    torch.manual_seed(2)
    head_dim, max_pos = 32, 128
    positions = torch.tensor([0, 1, 5, 63, 64, 100, 127, 3], dtype=torch.int32)  # 乱序也行
    q, k = torch.randn(8, 4 * head_dim), torch.randn(8, 2 * head_dim)
    rope = RotaryEmbedding(head_dim, head_dim, max_pos, base, scaling)
    q2, k2 = rope.forward(positions, q, k)
    assert q2.shape == q.shape
    assert k2.shape == k.shape
    hq, hk = hf_rope(q, k, positions, head_dim, base, max_pos, scaling)
    torch.testing.assert_close(q2, hq, **TIGHT)
    torch.testing.assert_close(k2, hk, **TIGHT)
    cached = get_rope(RotaryConfig(head_dim, head_dim, max_pos, base, dict(scaling) if scaling else None))
    q3, k3 = cached.forward(positions, q, k)
    torch.testing.assert_close(q3, hq, **TIGHT)
    torch.testing.assert_close(k3, hk, **TIGHT)


def test_task2_rope_table_follows_positions():
    """同一个 RotaryEmbedding 连着用（所有层共用一个）：换一个 positions、或者原地改了 positions，都要按新的位置转。"""
    torch.manual_seed(5)
    rope = RotaryEmbedding(16, 16, 64, 10000.0)
    q, k = torch.randn(3, 32), torch.randn(3, 16)
    first = torch.tensor([0, 1, 2], dtype=torch.int32)
    second = torch.tensor([9, 30, 63], dtype=torch.int32)
    for positions, change in [(first, None), (first, None), (second, None), (second, (1, 5))]:
        if change is not None:
            positions[change[0]] = change[1]  # 原地改（GPU 上重放 CUDA 图就是这样喂新位置的）
        q2, k2 = rope.forward(positions, q, k)
        hq, hk = hf_rope(q, k, positions, 16, 10000.0, 64, None)
        torch.testing.assert_close(q2, hq, **TIGHT)
        torch.testing.assert_close(k2, hk, **TIGHT)


def test_task2_rope_llama3_scaling_is_applied():
    torch.manual_seed(3)
    positions = torch.arange(100, 128, dtype=torch.int32)
    q, k = torch.randn(28, 64), torch.randn(28, 32)
    plain = RotaryEmbedding(32, 32, 128, 10000.0).forward(positions, q, k)[0]
    scaled = RotaryEmbedding(32, 32, 128, 10000.0, dict(LLAMA3)).forward(positions, q, k)[0]
    assert not torch.allclose(plain, scaled, atol=1e-3)  # 缩放确实改了低频部分
    d = 16  # 最高频的一对（短波）不缩放，两者应该一样
    torch.testing.assert_close(scaled.view(28, 2, 32)[..., [0, d]], plain.view(28, 2, 32)[..., [0, d]], **TIGHT)


def test_task2_rope_keeps_dtype_and_accepts_heads_dim():
    torch.manual_seed(4)
    rope = RotaryEmbedding(16, 16, 64, 10000.0)
    positions = torch.tensor([7, 0, 63], dtype=torch.int32)
    q, k = torch.randn(3, 2, 16), torch.randn(3, 1, 16)  # q_norm 之后是 (N, H, D)
    q2, k2 = rope.forward(positions, q, k)
    qf, kf = rope.forward(positions, q.reshape(3, 32), k.reshape(3, 16))
    torch.testing.assert_close(q2.reshape(3, 32), qf, **TIGHT)
    torch.testing.assert_close(k2.reshape(3, 16), kf, **TIGHT)
    qb, kb = rope.forward(positions, q.bfloat16(), k.bfloat16())
    assert qb.dtype == kb.dtype == torch.bfloat16
    assert qb.shape == q.shape
    torch.testing.assert_close(qb.float(), q2, rtol=2e-2, atol=2e-2)


def test_task2_get_rope_shares_table_and_rejects_unknown_type():
    cfg = RotaryConfig(16, 16, 64, 10000.0, dict(LLAMA3))
    a = get_rope(cfg)
    assert get_rope(RotaryConfig(16, 16, 64, 10000.0, dict(LLAMA3))) is a  # 相同配置共用一张表
    assert get_rope(RotaryConfig(16, 16, 64, 10000.0, None)) is not a
    assert get_rope(RotaryConfig(16, 16, 64, 20000.0, dict(LLAMA3))) is not a
    with expect_error("ch2/rope_type", rope_type="no_such_rope"):
        RotaryEmbedding(16, 16, 64, 10000.0, {"rope_type": "no_such_rope", "factor": 2.0})
    with expect_error("ch2/rope_type", rope_type="no_such_rope"):
        get_rope(RotaryConfig(16, 16, 64, 10000.0, {"rope_type": "no_such_rope", "factor": 2.0}))
