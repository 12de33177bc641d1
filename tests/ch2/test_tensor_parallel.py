"""第 2 章：张量并行。一个进程里轮流扮演每个 rank，通信换成记录调用的假插件，再把各 rank 的结果合起来和不切的算一遍比。

约定：all_reduce 原样返回（各 rank 的部分和由测试来加），
all_gather 按 rank 顺序沿第 0 维拼接（测试先收集各 rank 的本地结果）。
"""

from contextlib import contextmanager

import pytest
import torch
import torch.nn.functional as F

from minisgl import core
from minisgl.core import Context
from minisgl.distributed import (DistributedCommunicator, DistributedImpl, DistributedInfo, get_tp_info,
                                 reset_tp_info, set_tp_info)
from minisgl.layers import (AttentionLayer, LinearColParallelMerged, LinearOProj, LinearQKVMerged,
                            LinearRowParallel, ParallelLMHead, RotaryConfig, VocabParallelEmbedding)
from minisgl.utils import div_ceil, div_even
from tests.ch2.common import TIGHT
from tests.harness.batch import make_batch, make_req
from tests.harness.errors import expect_error


class FakeComm(DistributedImpl):
    """记录每次调用。all_reduce 原样返回；all_gather 返回 self.gathered（测试预先放好的各 rank 拼接结果）。"""

    def __init__(self):
        self.calls = []  # (名字, 输入的拷贝)
        self.gathered = None

    def all_reduce(self, x):
        self.calls.append(("all_reduce", x.clone()))
        return x

    def all_gather(self, x):
        self.calls.append(("all_gather", x.clone()))
        if self.gathered is None:  # 第一遍只收集本地结果：返回一个形状对、内容无关的张量
            return x.new_zeros(get_tp_info().size * x.shape[0], *x.shape[1:])
        return self.gathered

    def names(self):
        return [c[0] for c in self.calls]


@pytest.fixture(autouse=True)
def comm(monkeypatch):
    reset_tp_info()
    core.reset_global_ctx()
    fake = FakeComm()
    monkeypatch.setattr(DistributedCommunicator, "plugins", [fake])
    try:
        yield fake
    finally:
        reset_tp_info()
        core.reset_global_ctx()


@contextmanager
def as_rank(rank, size):
    set_tp_info(rank, size)
    try:
        yield
    finally:
        reset_tp_info()


def build(tp, factory):
    ops = []
    for r in range(tp):
        with as_rank(r, tp):
            ops.append(factory())
    return ops


def run(ops, inputs):
    """每个 rank 在自己的身份下做前向；inputs 是一个张量（各 rank 相同）或按 rank 的列表。"""
    tp, outs = len(ops), []
    for r, op in enumerate(ops):
        with as_rank(r, tp):
            outs.append(op.forward(inputs[r] if isinstance(inputs, list) else inputs))
    return outs


def gen(seed):
    return torch.Generator().manual_seed(seed)


def randn(*shape, g):
    return torch.randn(*shape, generator=g)


# ---------------------------------------------------------------- task3：TP 身份

def test_task3_tp_info_rules():
    with expect_error("ch2/tp_info_unset"):
        get_tp_info()
    set_tp_info(1, 4)
    try:
        assert get_tp_info() == DistributedInfo(1, 4)
        assert not get_tp_info().is_primary()
        with expect_error("ch2/tp_info_twice"):
            set_tp_info(0, 4)  # 不许悄悄覆盖
    finally:
        reset_tp_info()
    for bad in [(4, 4), (-1, 2)]:
        with expect_error("ch2/tp_info_rank"):
            DistributedInfo(*bad)


# ---------------------------------------------------------------- task3：列并行

@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("sizes", [[24, 24], [8, 24]])  # 两块不一样大：part 用错就切错
def test_task3_col_parallel_merged(tp, sizes, comm):
    g = gen(10)
    x = randn(5, 16, g=g)
    full_w = [randn(n, 16, g=g) for n in sizes]
    full_b = [randn(n, g=g) for n in sizes]
    ops = build(tp, lambda: LinearColParallelMerged(16, sizes, has_bias=True))
    for op in ops:
        op.load_state_dict({"weight": torch.cat([op.shard(w, i) for i, w in enumerate(full_w)]),
                            "bias": torch.cat([op.shard(b, i) for i, b in enumerate(full_b)])})
    outs = run(ops, x)
    local = [n // tp for n in sizes]
    for y in outs:
        assert y.shape == (5, sum(local))
    for i, (w, b) in enumerate(zip(full_w, full_b)):
        start = sum(local[:i])
        got = torch.cat([y[:, start:start + local[i]] for y in outs], dim=1)  # 第 i 块：各 rank 的那份拼回去
        torch.testing.assert_close(got, F.linear(x, w, b), **TIGHT)
    assert comm.calls == []  # 列并行不通信


def kv_heads_for_rank(r, tp, n_q, n_kv, local_q, local_kv):
    """按 GQA 的分组推出 rank r 上每个 q 头要用的完整 KV 头，并检查本地分组一致，返回本地 KV 头对应的完整头号。"""
    heads = [None] * local_kv
    for i in range(local_q):
        full_q = r * local_q + i
        full_kv = full_q // (n_q // n_kv)  # 完整模型里这个 q 头用哪个 KV 头
        slot = i // (local_q // local_kv)  # 本地注意力里它用哪个本地 KV 头
        assert heads[slot] in (None, full_kv), "同一个本地 KV 头服务了完整模型里不同 KV 头的 q 头"
        heads[slot] = full_kv
    return heads


@pytest.mark.parametrize("tp,n_kv", [(2, 2), (2, 4), (4, 4), (2, 1), (4, 2), (4, 1)])
def test_task3_qkv_merged(tp, n_kv, comm):
    g = gen(11)
    D, n_q, H = 4, 8, 16
    x = randn(5, H, g=g)
    wq, wk, wv = randn(n_q * D, H, g=g), randn(n_kv * D, H, g=g), randn(n_kv * D, H, g=g)
    bq, bk, bv = randn(n_q * D, g=g), randn(n_kv * D, g=g), randn(n_kv * D, g=g)
    ops = build(tp, lambda: LinearQKVMerged(H, D, n_q, n_kv, has_bias=True))
    for op in ops:
        op.load_state_dict({"weight": torch.cat([op.shard(wq, 0), op.shard(wk, 1), op.shard(wv, 2)]),
                            "bias": torch.cat([op.shard(bq, 0), op.shard(bk, 1), op.shard(bv, 2)])})
    outs = run(ops, x)
    local_q, local_kv = n_q // tp, max(n_kv // tp, 1)  # KV 头比 tp 少时每个 rank 复制一个
    q_full, k_full, v_full = F.linear(x, wq, bq), F.linear(x, wk, bk), F.linear(x, wv, bv)
    q_parts = []
    for r, y in enumerate(outs):
        assert y.shape == (5, (local_q + 2 * local_kv) * D)  # 本地输出是 [q_r | k_r | v_r]
        q, k, v = y.split([local_q * D, local_kv * D, local_kv * D], dim=1)
        q_parts.append(q)
        for slot, h in enumerate(kv_heads_for_rank(r, tp, n_q, n_kv, local_q, local_kv)):
            cols = slice(h * D, (h + 1) * D)
            torch.testing.assert_close(k[:, slot * D:(slot + 1) * D], k_full[:, cols], **TIGHT)
            torch.testing.assert_close(v[:, slot * D:(slot + 1) * D], v_full[:, cols], **TIGHT)
    torch.testing.assert_close(torch.cat(q_parts, dim=1), q_full, **TIGHT)
    assert comm.calls == []


def test_task3_kv_replication_copies():
    wk = torch.arange(2 * 4, dtype=torch.float32)[:, None].expand(8, 3)  # 第 h 个头的行是 4h..4h+3
    got = [op.shard(wk, 1) for op in build(4, lambda: LinearQKVMerged(3, 4, 8, 2, has_bias=False))]
    assert [int(s[0, 0]) // 4 for s in got] == [0, 0, 1, 1]  # rank r 拿头 r*2//4
    assert all(s.shape == (4, 3) for s in got)


def test_task3_attention_split_matches_qkv():
    rot = RotaryConfig(4, 4, 32, 10000.0, None)
    for tp, n_kv in [(1, 2), (2, 2), (4, 2), (4, 1)]:
        for r in range(tp):
            with as_rank(r, tp):
                qkv = LinearQKVMerged(16, 4, 8, n_kv, has_bias=False)
                attn = AttentionLayer(0, 8, n_kv, 4, rot)
            assert (attn.num_qo_heads, attn.num_kv_heads) == (8 // tp, max(n_kv // tp, 1))
            assert attn.qo_attn_dim + 2 * attn.kv_attn_dim == qkv.weight.shape[0]


# ---------------------------------------------------------------- task3：行并行

@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("cls", [LinearRowParallel, LinearOProj])
def test_task3_row_parallel_bias_added_once(tp, cls, comm):
    g = gen(12)
    x = randn(5, 16, g=g)
    w, b = randn(12, 16, g=g), randn(12, g=g)
    ops = build(tp, lambda: cls(16, 12, has_bias=True))
    for op in ops:
        op.load_state_dict({"weight": op.shard(w), "bias": op.shard(b)})
        assert op.weight.shape == (12, 16 // tp)
    n = 16 // tp
    outs = run(ops, [x[:, r * n:(r + 1) * n] for r in range(tp)])  # 每个 rank 只有输入的一段
    assert comm.names() == ["all_reduce"] * tp
    for (_, sent), y in zip(comm.calls, outs):
        torch.testing.assert_close(sent, y, rtol=0, atol=0)  # 送去求和的就是本地部分和
    torch.testing.assert_close(sum(outs), F.linear(x, w, b), **TIGHT)


# ---------------------------------------------------------------- task3：词表并行

@pytest.mark.parametrize("V,tp", [(12, 2), (12, 4), (10, 2), (10, 4), (9, 4), (5, 4)])  # (5, 4)：rank 3 一行都分不到
def test_task3_vocab_parallel_embedding(V, tp, comm):
    g = gen(13)
    D = 6
    w = randn(V, D, g=g)
    ids = torch.cat([torch.arange(V), torch.randint(0, V, (7,), generator=g)]).to(torch.int32)
    ops = build(tp, lambda: VocabParallelEmbedding(V, D))
    V_tp = div_ceil(V, tp)
    shards = [op.shard(w) for op in ops]
    for r, (op, s) in enumerate(zip(ops, shards)):
        assert s.shape == (V_tp, D)
        real = max(0, min(V - r * V_tp, V_tp))
        torch.testing.assert_close(s[:real], w[r * V_tp:r * V_tp + real], rtol=0, atol=0)
        assert torch.count_nonzero(s[real:]) == 0  # 最后一份用 0 补齐
        op.load_state_dict({"weight": s})
    outs = run(ops, ids)
    assert comm.names() == ["all_reduce"] * tp
    for r, y in enumerate(outs):  # 每个 rank 只查自己那段，别人的 id 查出 0
        mine = (ids >= r * V_tp) & (ids < (r + 1) * V_tp)
        assert torch.count_nonzero(y[~mine]) == 0
    torch.testing.assert_close(sum(outs), w[ids.long()], **TIGHT)


BATCHES = {  # (请求的 (提示词长度, cached_len), 阶段, 进 LM head 的行)
    "prefill": ([(3, 0), (6, 4), (1, 0)], "prefill", [2, 4, 5]),
    "decode": ([(5, 4), (2, 1), (7, 6)], "decode", [0, 1, 2]),
    "decode_bs1": ([(5, 4)], "decode", [0]),
}


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize("V,tp", [(12, 2), (12, 4), (10, 4), (11, 2)])
def test_task3_parallel_lm_head(V, tp, batch, tied, comm):
    g = gen(14)
    D = 8
    spec, phase, rows = BATCHES[batch]
    reqs = [make_req(n, c, uid=i) for i, (n, c) in enumerate(spec)]
    x = randn(sum(n - c for n, c in spec), D, g=g)
    w = randn(V, D, g=g)
    heads = []
    for r in range(tp):
        with as_rank(r, tp):
            emb = VocabParallelEmbedding(V, D)
            lm = ParallelLMHead(V, D, tie_word_embeddings=tied, tied_embedding=emb if tied else None)
        (emb if tied else lm).load_state_dict({"weight": (emb if tied else lm).shard(w)})
        heads.append(lm)
    expected = x[rows] @ w.T
    ctx = Context(page_size=1)
    core.set_global_ctx(ctx)
    with ctx.forward_batch(make_batch(reqs, phase)):
        run(heads, x)  # 第一遍：收集各 rank 的本地 logits
        local = [sent for _, sent in comm.calls]
        assert comm.names() == ["all_gather"] * tp
        V_tp = div_ceil(V, tp)
        padded = F.pad(expected, (0, V_tp * tp - V))  # 补齐的词表行权重为 0，logits 也是 0
        for r, lg in enumerate(local):
            torch.testing.assert_close(lg, padded[:, r * V_tp:(r + 1) * V_tp], **TIGHT)
        comm.gathered = torch.cat(local, dim=0)  # 真 all_gather 的结果：按 rank 沿第 0 维拼
        outs = run(heads, x)  # 第二遍：走完 all_gather 之后的整理和截断
    for y in outs:
        assert y.shape == (len(rows), V)
        torch.testing.assert_close(y, expected, **TIGHT)


# ---------------------------------------------------------------- task4：整除的规则

def test_task4_div_even():
    assert div_even(12, 4) == 3
    assert div_even(7, 1) == 7
    assert div_even(4, 4) == 1
    with expect_error("ch2/div_even", a=22, b=7):
        div_even(22, 7)
    with expect_error("ch2/div_even", a=2, b=4):
        div_even(2, 4)  # 不许复制时，份数多于个数也是不整除


def test_task4_div_even_allow_replicate():
    assert div_even(2, 4, allow_replicate=True) == 1
    assert div_even(1, 8, allow_replicate=True) == 1
    assert div_even(8, 4, allow_replicate=True) == 2  # 够分时照常平分
    assert div_even(4, 4, allow_replicate=True) == 1
    with expect_error("ch2/div_even", a=3, b=4):
        div_even(3, 4, allow_replicate=True)  # 4 份没法均匀复制 3 个头
    with expect_error("ch2/div_even", a=6, b=4):
        div_even(6, 4, allow_replicate=True)


def test_task4_div_ceil():
    assert [div_ceil(a, 4) for a in (0, 1, 4, 5, 8, 10, 12)] == [0, 1, 1, 2, 2, 3, 3]


@pytest.mark.parametrize("factory", [
    lambda: LinearColParallelMerged(16, [8, 10], has_bias=False),
    lambda: LinearQKVMerged(16, 4, num_qo_heads=6, num_kv_heads=2, has_bias=False),
    lambda: LinearQKVMerged(16, 4, num_qo_heads=8, num_kv_heads=3, has_bias=False),
    lambda: LinearRowParallel(10, 8, has_bias=False),
    lambda: LinearOProj(18, 8, has_bias=False),
], ids=["gate_up", "q_heads", "kv_heads", "row", "o_proj"])
def test_task4_layers_refuse_uneven_split(factory):
    with as_rank(1, 4):
        with expect_error("ch2/layer_uneven"):
            factory()
