"""第 5 章：可插拔的注意力后端。

按名字创建后端（"p,d" 是 prefill/decode 混合）；变长 batch、分页 KV（散落的页）、前缀复用（cached_len > 0 的
prefill）和 GQA 的结果，都要和从头算的稠密注意力一致；凑批的假请求不影响真请求；分两段 prefill 一个提示词和
一次 prefill 整个提示词，模型给出同样的 logits。
"""

from __future__ import annotations

import itertools
import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import List, Tuple

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoConfig

from minisgl.attention import (SUPPORTED_ATTENTION_BACKENDS, BaseAttnBackend, HybridBackend, TorchBackend,
                               create_attention_backend)
from minisgl.core import Context, Req, reset_global_ctx, set_global_ctx
from minisgl.distributed import reset_tp_info, set_tp_info
from minisgl.kvcache import create_kvcache_pool
from minisgl.models import ModelConfig, RotaryConfig, create_model, load_weight
from minisgl.utils import torch_dtype
from tests.harness.batch import make_batch, make_req
from tests.harness.errors import expect_error

POISON_PAGE = 0  # 0 号页从不分配：page table 里没用到的位置都指向它，池里没写过的槽位都是 NaN
ATOL = RTOL = 1e-5  # 单层注意力，fp32 对 fp64 参照
MODEL_TOL = dict(atol=1e-4, rtol=1e-4)  # 整个模型（logits 量级 ~10，实测差 ≤ 2e-5）：只是矩阵形状不同带来的舍入


# ---------------------------------------------------------------- 公用的小工具


def make_config(hq: int = 4, hkv: int = 2, d: int = 8, layers: int = 2) -> ModelConfig:
    return ModelConfig(num_layers=layers, num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, hidden_size=hq * d,
                       vocab_size=32, intermediate_size=16, rms_norm_eps=1e-6,
                       rotary_config=RotaryConfig(d, d, 128, 10000.0, None), hidden_act="silu",
                       tie_word_embeddings=False, model_type="qwen3", architectures=["Qwen3ForCausalLM"])


def poison(pool, num_layers: int) -> None:
    for layer in range(num_layers):
        pool.k_cache(layer).fill_(float("nan"))
        pool.v_cache(layer).fill_(float("nan"))


@contextmanager
def global_env(page_size: int):
    """设好 TP（单卡）和一个新的全局 Context；结束时一定清掉全局状态。"""
    reset_global_ctx()
    reset_tp_info()
    set_tp_info(0, 1)
    ctx = Context(page_size=page_size)
    set_global_ctx(ctx)
    try:
        yield ctx
    finally:
        reset_global_ctx()
        reset_tp_info()


def init_kv(ctx: Context, config: ModelConfig, num_pages: int, rows: int, width: int, device: str = "cpu") -> None:
    """给 ctx 配 KV 池（全是 NaN）和 page table（全指向 0 号毒页）。"""
    ctx.kv_cache = create_kvcache_pool(config, num_pages, ctx.page_size, torch.float32, torch.device(device))
    poison(ctx.kv_cache, config.num_layers)
    ctx.page_table = torch.full((rows, width), POISON_PAGE * ctx.page_size, dtype=torch.int32, device=device)


@contextmanager
def attn_env(config: ModelConfig, page_size: int, num_pages: int, rows: int, width: int, device: str = "cpu"):
    """设好 TP、全局 Context、KV 池（全是 NaN）和 page table（全指向 0 号毒页）；结束时一定清掉全局状态。"""
    with global_env(page_size) as ctx:
        init_kv(ctx, config, num_pages, rows, width, device)
        yield ctx


def allocate(ctx: Context, row: int, start: int, end: int, free_pages: List[int]) -> None:
    """给 row 的位置 [start, end) 配槽位：按页拿，已经有页的位置不动（接着写同一页的后半）。"""
    ps = ctx.page_size
    for page_idx in range(math.ceil(start / ps), math.ceil(end / ps)):
        page = free_pages.pop()
        ctx.page_table[row, page_idx * ps:(page_idx + 1) * ps] = torch.arange(page * ps, (page + 1) * ps)


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cached_len: int) -> torch.Tensor:
    """一个请求，从头逐个 query 算（fp64）。q: (n_q, H_q, D) 是位置 [cached_len, cached_len + n_q)；
    k, v: (n_k, H_kv, D) 是位置 [0, n_k)。位置 p 的 query 看见 key 0..p；q 头 h 用 kv 头 h // (H_q / H_kv)。"""
    q, k, v = q.double().cpu(), k.double().cpu(), v.double().cpu()
    n_q, hq, d = q.shape
    group = hq // k.shape[1]
    out = torch.empty_like(q)
    for h in range(hq):
        kh = h // group
        for i in range(n_q):
            p = cached_len + i
            scores = (k[:p + 1, kh] @ q[i, h]) / math.sqrt(d)
            out[i, h] = torch.softmax(scores, dim=0) @ v[:p + 1, kh]
    return out


def flat(pool_tensor: torch.Tensor) -> torch.Tensor:
    """(num_pages, page_size, H_kv, D) -> (槽位数, H_kv, D)。"""
    return pool_tensor.reshape(-1, *pool_tensor.shape[2:])


# ---------------------------------------------------------------- 性质测试的核心


@dataclass
class AttnCase:
    page_size: int
    heads: Tuple[int, int]  # (H_q, H_kv)
    head_dim: int
    seqs: List[Tuple[int, int]]  # 每个请求 (总长 device_len, cached_len)
    phase: str
    layer: int
    seed: int


@st.composite
def attn_cases(draw) -> AttnCase:
    page_size = draw(st.sampled_from([1, 2, 4, 16]))
    heads = draw(st.sampled_from([(4, 4), (4, 2), (4, 1), (6, 2), (8, 2), (8, 1)]))  # GQA 组大小 1、2、3、4、8
    head_dim = draw(st.sampled_from([8, 16]))
    decode_like = draw(st.booleans())  # 每个请求都只有 1 个新 token，且前面有缓存
    seqs = []
    for _ in range(draw(st.integers(1, 6))):
        if decode_like:
            total = draw(st.integers(2, 24))
            seqs.append((total, total - 1))
        else:
            total = draw(st.integers(1, 24))
            seqs.append((total, draw(st.integers(0, total - 1))))
    phase = "decode" if decode_like and draw(st.booleans()) else "prefill"
    return AttnCase(page_size, heads, head_dim, seqs, phase, draw(st.integers(0, 1)), draw(st.integers(0, 2**31 - 1)))


def run_case(case: AttnCase, device: str = "cpu", backend_name: str = "torch") -> None:
    hq, hkv = case.heads
    d, ps, n = case.head_dim, case.page_size, len(case.seqs)
    g = torch.Generator().manual_seed(case.seed)
    config = make_config(hq, hkv, d)
    num_pages = 2 + sum(math.ceil(total / ps) for total, _ in case.seqs)  # 0 号毒页 + 多一页空闲
    width = (math.ceil(max(t for t, _ in case.seqs) / ps) + 1) * ps
    rows = n + 2
    with attn_env(config, ps, num_pages, rows, width, device) as ctx:
        pool = ctx.kv_cache
        free = [p for p in torch.randperm(num_pages, generator=g).tolist() if p != POISON_PAGE]  # 页是散的
        table_idx = torch.randperm(rows, generator=g)[:n].tolist()  # 行号也不按顺序
        reqs, k_fulls, v_fulls = [], [], []
        for i, ((total, cached), row) in enumerate(zip(case.seqs, table_idx)):
            allocate(ctx, row, 0, total, free)
            k_full, v_full = torch.randn(2, total, hkv, d, generator=g)
            if cached:  # 前缀的 K/V 早先已经写进池（上一段 prefill 或前面的 decode）
                pool.store_kv(k_full[:cached].reshape(cached, -1).to(device),
                              v_full[:cached].reshape(cached, -1).to(device),
                              ctx.page_table[row, :cached], case.layer)
            reqs.append(make_req(total, cached, row, uid=i))
            k_fulls.append(k_full)
            v_fulls.append(v_full)
        extend = [r.extend_len for r in reqs]
        num_tokens = sum(extend)
        q = torch.randn(num_tokens, hq, d, generator=g)
        k_new = torch.cat([k[r.cached_len:] for k, r in zip(k_fulls, reqs)]).reshape(num_tokens, hkv * d)
        v_new = torch.cat([v[r.cached_len:] for v, r in zip(v_fulls, reqs)]).reshape(num_tokens, hkv * d)

        backend = create_attention_backend(backend_name, config)
        batch = make_batch(reqs, case.phase, page_table=ctx.page_table)
        backend.prepare_metadata(batch)
        out = backend.forward(q.to(device), k_new.to(device), v_new.to(device), case.layer, batch)

        assert out.shape == (num_tokens, hq, d)
        bounds = [0] + torch.tensor(extend).cumsum(0).tolist()
        for i, r in enumerate(reqs):
            expected = dense_attention(q[bounds[i]:bounds[i + 1]], k_fulls[i], v_fulls[i], r.cached_len)
            torch.testing.assert_close(out[bounds[i]:bounds[i + 1]].cpu(), expected.float(), atol=ATOL, rtol=RTOL,
                                       msg=lambda m, i=i: f"请求 {i}（{case}）：{m}")

        # 新 token 的 K/V 写在 out_loc；每个请求的整段历史都能按 page table 读回来；别的槽位、别的层一个没碰
        k_pool, v_pool = flat(pool.k_cache(case.layer)).cpu(), flat(pool.v_cache(case.layer)).cpu()
        out_loc = batch.out_loc.long().cpu()
        assert torch.equal(k_pool[out_loc], k_new.view(-1, hkv, d))
        assert torch.equal(v_pool[out_loc], v_new.view(-1, hkv, d))
        used = torch.zeros(len(k_pool), dtype=torch.bool)
        for r, k_full, v_full in zip(reqs, k_fulls, v_fulls):
            slots = ctx.page_table[r.table_idx, :r.device_len].long().cpu()
            assert torch.equal(k_pool[slots], k_full)
            assert torch.equal(v_pool[slots], v_full)
            used[slots] = True
        assert k_pool[~used].isnan().all()
        assert v_pool[~used].isnan().all()
        other = 1 - case.layer
        assert pool.k_cache(other).isnan().all()
        assert pool.v_cache(other).isnan().all()

        last = batch.attn_metadata.get_last_indices(n)
        assert last.tolist() == [b - 1 for b in bounds[1:]]  # 每个请求最后一个新 token 的行号
        assert batch.positions[last.long()].tolist() == [r.device_len - 1 for r in reqs]


# ---------------------------------------------------------------- 任务 1：按名字创建后端


def spy_class(log: list, tag: str):
    class Spy(TorchBackend):
        def __init__(self, config):
            log.append((tag, "init", None))
            super().__init__(config)

        def prepare_metadata(self, batch):
            log.append((tag, "prepare", batch.phase))
            super().prepare_metadata(batch)

        def forward(self, q, k, v, layer_id, batch):
            log.append((tag, "forward", batch.phase))
            return super().forward(q, k, v, layer_id, batch)

    return Spy


@pytest.fixture
def small_env():
    with attn_env(make_config(), page_size=4, num_pages=4, rows=2, width=8) as ctx:
        yield ctx


def test_task1_torch_backend_by_name(small_env):
    """"torch" 建出纯 PyTorch 后端；"torch,torch" 两个名字相同，也只是一个 TorchBackend，不套 HybridBackend。"""
    b = create_attention_backend("torch", make_config())
    assert type(b) is TorchBackend
    assert isinstance(b, BaseAttnBackend)
    b2 = create_attention_backend("torch,torch", make_config())
    assert type(b2) is TorchBackend
    assert not isinstance(b2, HybridBackend)


def test_task1_same_name_twice_builds_one_backend(small_env, monkeypatch):
    """"x,x" 只构造一个 x，不是两个套成混合后端。"""
    log = []
    monkeypatch.setitem(SUPPORTED_ATTENTION_BACKENDS, "spy", spy_class(log, "spy"))
    b = create_attention_backend("spy,spy", make_config())
    assert not isinstance(b, HybridBackend)
    assert log == [("spy", "init", None)]


def test_task1_two_names_make_a_hybrid(small_env, monkeypatch):
    """"p,d" 两个名字不同：HybridBackend。"""
    monkeypatch.setitem(SUPPORTED_ATTENTION_BACKENDS, "torch2", TorchBackend)
    assert isinstance(create_attention_backend("torch,torch2", make_config()), HybridBackend)


def test_task1_hybrid_dispatches_on_phase(monkeypatch):
    """混合后端：prefill 的 batch（prepare_metadata 和 forward）只走第一个，decode 的只走第二个，结果照样对。"""
    log = []
    monkeypatch.setitem(SUPPORTED_ATTENTION_BACKENDS, "spy_p", spy_class(log, "P"))
    monkeypatch.setitem(SUPPORTED_ATTENTION_BACKENDS, "spy_d", spy_class(log, "D"))
    prefill = AttnCase(4, (4, 2), 8, [(7, 0), (5, 3)], "prefill", layer=1, seed=1)
    run_case(prefill, backend_name="spy_p,spy_d")
    assert sorted(log[:2]) == [("D", "init", None), ("P", "init", None)]  # 两个都建了（先后不限）
    assert log[2:] == [("P", "prepare", "prefill"), ("P", "forward", "prefill")]
    log.clear()
    decode = AttnCase(4, (4, 2), 8, [(7, 6), (5, 4)], "decode", layer=0, seed=2)
    run_case(decode, backend_name="spy_p,spy_d")
    assert sorted(log[:2]) == [("D", "init", None), ("P", "init", None)]
    assert log[2:] == [("D", "prepare", "decode"), ("D", "forward", "decode")]


@pytest.mark.parametrize("name", ["a,b,c", "torch,torch,torch", "nope", "torch,nope", "nope,torch", "", "torch,"])
def test_task1_bad_names_list_the_choices(small_env, name):
    """多于一个逗号、不认识的名字（包括空名字）：ValueError，并且列出可选的名字。"""
    with expect_error("ch5/unknown_backend", name=repr(name)):
        create_attention_backend(name, make_config())


@pytest.mark.parametrize("name, culprit", [("fi", "fi"), ("fa", "fa"), ("torch,fi", "fi"), ("fa,torch", "fa")])
def test_task1_gpu_backends_fail_clearly(small_env, monkeypatch, name, culprit):
    """"fi"/"fa" 已登记（不是 ValueError）；假装这台机器没有 GPU（有 GPU 的机器上也一样测）：
    建后端时给出清楚的错误，说出是哪个后端、要 GPU，并指向 'torch'。"""
    assert culprit in SUPPORTED_ATTENTION_BACKENDS
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with expect_error("ch5/gpu_backend_without_gpu", backend=repr(culprit)):
        create_attention_backend(name, make_config())


# ---------------------------------------------------------------- 任务 2：和稠密注意力逐请求对齐


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(case=attn_cases())
def test_task2_matches_dense_reference(case):
    """随机的变长 batch、散落的页、前缀复用、decode、GQA：每个请求的输出都等于从头算的稠密因果注意力；
    新 K/V 写在 out_loc，别的槽位和别的层不动；get_last_indices 指向每个请求最后一个新 token。"""
    run_case(case)


@pytest.mark.parametrize("case", [
    AttnCase(1, (4, 4), 8, [(1, 0)], "prefill", 0, 0),  # 只有一个 token
    AttnCase(16, (6, 2), 16, [(24, 0), (24, 23), (17, 9), (3, 0)], "prefill", 1, 1),  # 满的 4 个请求，前缀跨页
    AttnCase(2, (4, 1), 8, [(9, 8), (2, 1), (24, 23)], "decode", 0, 2),  # MQA decode
    AttnCase(4, (4, 2), 16, [(13, 5), (8, 4)], "prefill", 1, 3),  # 前缀结束在页中间 / 页边界
])
def test_task2_hand_picked_cases(case):
    """几个挑出来的边界情况（性质测试之外再固定跑一遍）。"""
    run_case(case)


def test_task2_reference_is_not_trivial():
    """自检：如果后端忽略已缓存的前缀（只看新 token），结果和参照不同——说明性质测试真能抓到这类错误。"""
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(3, 4, 8, generator=g), torch.randn(7, 2, 8, generator=g), torch.randn(7, 2, 8, generator=g)
    with_prefix = dense_attention(q, k, v, cached_len=4)
    without = dense_attention(q, k[4:], v[4:], cached_len=0)
    assert not torch.allclose(with_prefix, without, atol=1e-3)


@pytest.mark.parametrize("phase, seqs", [("prefill", [(7, 0), (5, 3)]), ("decode", [(6, 5), (3, 2)])])
def test_task2_prepare_metadata_reads_nothing_back(monkeypatch, phase, seqs):
    """prepare_metadata 每个 batch 跑一次：边界用主存里的整数算，不从张量读回（GPU 上那是一次同步）。"""
    config = make_config()
    with attn_env(config, page_size=1, num_pages=16, rows=2, width=8) as ctx:
        free = [p for p in range(16) if p != POISON_PAGE]
        reqs = []
        for i, (total, cached) in enumerate(seqs):
            allocate(ctx, i, 0, total, free)
            reqs.append(make_req(total, cached, i, uid=i))
        batch = make_batch(reqs, phase, page_table=ctx.page_table)
        backend = create_attention_backend("torch", config)
        _prepare_refusing_reads(monkeypatch, backend, batch)
    bounds = [0, *itertools.accumulate(r.extend_len for r in reqs)]
    assert batch.attn_metadata.cu_seqlens_q.tolist() == bounds
    assert [s[:2] for s in batch.attn_metadata.seqs] == list(zip(bounds, bounds[1:]))


def _prepare_refusing_reads(monkeypatch, backend, batch) -> None:

    def refuse(self, *args, **kwargs):
        raise AssertionError("prepare_metadata 从张量读回了主存")

    monkeypatch.setattr(torch.Tensor, "tolist", refuse)
    monkeypatch.setattr(torch.Tensor, "item", refuse)
    backend.prepare_metadata(batch)
    monkeypatch.undo()


# ---------------------------------------------------------------- 任务 3：凑批的假请求


@pytest.mark.parametrize("phase, seqs", [("prefill", [(7, 0), (5, 3), (9, 8)]), ("decode", [(6, 5), (3, 2)])])
@pytest.mark.parametrize("num_dummies", [1, 3])
def test_task3_padding_requests_do_not_change_real_ones(phase, seqs, num_dummies):
    """padded_reqs 在真请求后面接几个假请求（table_idx 指向专用的一行，那一行全是假槽位，extend_len=1）：
    真请求的输出不变；get_last_indices(真请求数) 不含假请求。"""
    hq, hkv, d, ps = 4, 2, 8, 4
    g = torch.Generator().manual_seed(7)
    config = make_config(hq, hkv, d)
    n = len(seqs)
    num_pages = 3 + sum(math.ceil(t / ps) for t, _ in seqs)
    with attn_env(config, ps, num_pages, rows=n + 1, width=12) as ctx:
        free = [p for p in torch.randperm(num_pages, generator=g).tolist() if p != POISON_PAGE]
        dummy_row, dummy_slot = n, free.pop() * ps  # 假请求专用的一页
        ctx.page_table[dummy_row, :] = dummy_slot
        reqs, k_fulls, v_fulls = [], [], []
        for i, (total, cached) in enumerate(seqs):
            allocate(ctx, i, 0, total, free)
            k_full, v_full = torch.randn(2, total, hkv, d, generator=g)
            if cached:
                ctx.kv_cache.store_kv(k_full[:cached].reshape(cached, -1), v_full[:cached].reshape(cached, -1),
                                      ctx.page_table[i, :cached], 0)
            reqs.append(make_req(total, cached, i, uid=i))
            k_fulls.append(k_full)
            v_fulls.append(v_full)
        dummies = [make_req(1, 0, dummy_row, uid=100 + j) for j in range(num_dummies)]
        n_real = sum(r.extend_len for r in reqs)
        q = torch.randn(n_real + num_dummies, hq, d, generator=g)
        k_new = torch.cat([k[r.cached_len:] for k, r in zip(k_fulls, reqs)]).reshape(n_real, -1)
        v_new = torch.cat([v[r.cached_len:] for v, r in zip(v_fulls, reqs)]).reshape(n_real, -1)
        k_pad = torch.cat([k_new, torch.randn(num_dummies, hkv * d, generator=g)])
        v_pad = torch.cat([v_new, torch.randn(num_dummies, hkv * d, generator=g)])
        backend = create_attention_backend("torch", config)

        plain = make_batch(reqs, phase, page_table=ctx.page_table)
        backend.prepare_metadata(plain)
        out_plain = backend.forward(q[:n_real], k_new, v_new, 0, plain)

        padded = make_batch(reqs, phase, reqs + dummies, page_table=ctx.page_table)
        assert padded.out_loc[n_real:].tolist() == [dummy_slot] * num_dummies
        backend.prepare_metadata(padded)
        out_pad = backend.forward(q, k_pad, v_pad, 0, padded)

        assert out_pad.shape == (n_real + num_dummies, hq, d)
        torch.testing.assert_close(out_pad[:n_real], out_plain, atol=ATOL, rtol=RTOL)
        bounds = [0] + torch.tensor([r.extend_len for r in reqs]).cumsum(0).tolist()
        for i, r in enumerate(reqs):
            expected = dense_attention(q[bounds[i]:bounds[i + 1]], k_fulls[i], v_fulls[i], r.cached_len)
            torch.testing.assert_close(out_pad[bounds[i]:bounds[i + 1]], expected.float(), atol=ATOL, rtol=RTOL)
        meta = padded.attn_metadata
        assert meta.get_last_indices(n).tolist() == [b - 1 for b in bounds[1:]]
        assert meta.get_last_indices(padded.padded_size).tolist() == (
            [b - 1 for b in bounds[1:]] + list(range(n_real, n_real + num_dummies)))
        # 真请求的历史没被假请求写坏
        k_pool = flat(ctx.kv_cache.k_cache(0))
        for r, k_full in zip(reqs, k_fulls):
            assert torch.equal(k_pool[ctx.page_table[r.table_idx, :r.device_len].long()], k_full)


# ---------------------------------------------------------------- 任务 4：模型上的前缀复用


@contextmanager
def model_env(path, page_size: int, num_pages: int, rows: int, width: int):
    with global_env(page_size) as ctx:
        config = ModelConfig.from_hf(AutoConfig.from_pretrained(path))
        with torch.device("meta"), torch_dtype(torch.float32):
            model = create_model(config)
        model.load_state_dict({name: t.to(torch.float32) for name, t in load_weight(str(path), model)})
        init_kv(ctx, config, num_pages, rows, width)
        ctx.attn_backend = create_attention_backend("torch", config)
        yield ctx, model, config


def model_step(ctx, model, reqs: List[Req], phase: str, free: List[int], dummies: List[Req] = ()) -> torch.Tensor:
    """dummies：接在 reqs 后面凑批的假请求，它们的行在 page table 里事先填好，不分配。"""
    for r in reqs:
        allocate(ctx, r.table_idx, r.cached_len, r.device_len, free)
    batch = make_batch(reqs, phase, reqs + list(dummies), page_table=ctx.page_table)
    batch.input_ids = torch.cat([r.input_ids[r.cached_len:] for r in batch.padded_reqs])
    ctx.attn_backend.prepare_metadata(batch)
    with ctx.forward_batch(batch):
        return model.forward()


@pytest.mark.parametrize("split", [1, 6, 12])
def test_task4_chunked_prefill_reuses_prefix(tiny_models, family, page_size, split):
    """同一个提示词：一次 prefill 整段，和先 prefill 前 split 个 token、再以 cached_len=split prefill 剩下的
    （同一 batch 里还有一个全新请求），最后一个 token 的 logits 相同；之后各走一步 decode 也相同。"""
    length = 13
    g = torch.Generator().manual_seed(split)
    rows, pages_per_row = 3, math.ceil((length + 1) / page_size)
    num_pages = 1 + rows * pages_per_row
    width = pages_per_row * page_size
    with torch.inference_mode(), model_env(tiny_models[family], page_size, num_pages, rows, width) as (ctx, model, cfg):
        free = [p for p in torch.randperm(num_pages, generator=g).tolist() if p != POISON_PAGE]
        prompt = torch.randint(3, cfg.vocab_size, (length,), generator=g, dtype=torch.int32)

        whole = model_step(ctx, model, [make_req(length, 0, 0, 0, prompt)], "prefill", free)
        assert whole.shape == (1, cfg.vocab_size)

        first = model_step(ctx, model, [make_req(split, 0, 1, 1, prompt[:split])], "prefill", free)
        assert first.shape == (1, cfg.vocab_size)
        rest, fresh = make_req(length, split, 1, 1, prompt), make_req(length, 0, 2, 2, prompt)
        chunked = model_step(ctx, model, [rest, fresh], "prefill", free)
        assert chunked.shape == (2, cfg.vocab_size)
        torch.testing.assert_close(chunked[0], whole[0], **MODEL_TOL)  # 前缀复用
        torch.testing.assert_close(chunked[1], whole[0], **MODEL_TOL)  # 同 batch 的全新请求

        nxt = whole[0].argmax().reshape(1).int()
        ids = torch.cat([prompt, nxt])
        decoded = model_step(ctx, model, [make_req(length + 1, length, row, row, ids) for row in range(rows)],
                             "decode", free)
        assert decoded.shape == (rows, cfg.vocab_size)
        for row in (1, 2):
            torch.testing.assert_close(decoded[row], decoded[0], **MODEL_TOL)


def test_task4_padded_prefill_keeps_only_real_logits(tiny_models):
    """prefill 的 batch 后面接了假请求：LM head 只取前 batch.size 个请求的最后一个 token，logits 是 (bs, V)，
    和不凑批时相同。"""
    length, ps, rows = 9, 4, 4
    num_pages = 2 + 2 * math.ceil(length / ps)
    g = torch.Generator().manual_seed(5)
    with torch.inference_mode(), model_env(tiny_models["qwen2"], ps, num_pages, rows, 12) as (ctx, model, cfg):
        free = [p for p in torch.randperm(num_pages, generator=g).tolist() if p != POISON_PAGE]
        dummy_row = rows - 1
        ctx.page_table[dummy_row, :] = free.pop() * ps
        prompt = torch.randint(3, cfg.vocab_size, (length,), generator=g, dtype=torch.int32)
        plain = model_step(ctx, model, [make_req(length, 0, 0, 0, prompt)], "prefill", free)
        dummies = [make_req(1, 0, dummy_row, 100 + j) for j in range(2)]
        padded = model_step(ctx, model, [make_req(length, 0, 1, 1, prompt)], "prefill", free, dummies)
        assert padded.shape == plain.shape == (1, cfg.vocab_size)
        torch.testing.assert_close(padded, plain, **MODEL_TOL)


# ---------------------------------------------------------------- 任务 5：CUDA 上也对


@pytest.mark.gpu
@settings(max_examples=15, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # gpu 整个函数一档，各个例子共用
@given(case=attn_cases())
def test_task5_matches_dense_reference_on_cuda(gpu, case):
    """和任务 2 一样的性质，KV 池、page table 和输入都在 cuda 上（没有 GPU 的机器上是模拟的 CUDA）。"""
    run_case(case, device=gpu.device)
