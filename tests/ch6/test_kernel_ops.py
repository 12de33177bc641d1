"""minisgl.kernel 里矩阵乘之外的小算子（csrc/decode_ops.cpp）：每个都和它的 PyTorch 退路核对。

退路就是各层里前几章的算式（F.rms_norm、查表旋转、按槽位赋值、index_select + SDPA、F.silu）：测试在扩展"用不了"时
建出这些层，拿它们的结果和 C++ 版比，所以"C++ 版 = 退路"就是"C++ 版 = 前几章"。数据不是 CPU 上 fp32 的层一次也不调 C++。
形状挑不好对齐的：d 不是向量宽度的倍数、GQA 的组、补齐的槽位、行间有间隔的 view。输入一律不许被改；
越界的槽位和位置报一行错，不去读写别人的内存。只核对数值，从不断言耗时。"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tests.ch6.test_kernel import _ext_or_skip

RTOL = 1e-5  # 相对误差：只差 fp32 的累加顺序


@pytest.fixture
def ext():
    return _ext_or_skip()


@pytest.fixture
def fallback(monkeypatch):
    """在扩展"用不了"时建层（和编译失败时一样）：fallback(建层的函数) 返回的层用前几章的 PyTorch 写法。"""
    from minisgl.distributed import set_tp_info
    from minisgl.kernel import utils

    set_tp_info(0, 1)

    def build(make):
        with monkeypatch.context() as m:
            m.setattr(utils, "extension", lambda: None)
            return make()

    return build


def _norm(cls, w: torch.Tensor, eps: float):
    op = cls(w.shape[-1], eps)
    op.load_state_dict({"weight": w})
    return op


def _rope(d: int, max_pos: int = 64):
    from minisgl.layers import RotaryEmbedding

    return RotaryEmbedding(d, d, max_pos, 10000.0)


def _close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, (what, got.shape, want.shape)
    err = ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item() if want.numel() else 0.0
    assert err <= RTOL, f"{what}：C++ 和 PyTorch 退路差了 {err:.2e}（相对最大值），超过 {RTOL}"


@pytest.mark.parametrize("shape", [(1, 576), (4, 576), (3, 7), (2, 3, 128), (5, 17)])
def test_rms_norm_and_add_rms_norm_match_the_fallback(ext, fallback, shape):
    from minisgl.layers import RMSNorm, RMSNormFused

    g = torch.Generator().manual_seed(shape[-1])
    x, res, w = torch.randn(shape, generator=g), torch.randn(shape, generator=g), torch.randn(shape[-1], generator=g)
    x0, res0 = x.clone(), res.clone()
    _close(ext.rms_norm(x, w, 1e-6), fallback(lambda: _norm(RMSNorm, w, 1e-6)).forward(x), "rms_norm")
    y, s = ext.add_rms_norm(x, res, w, 1e-5)
    y_ref, s_ref = fallback(lambda: _norm(RMSNormFused, w, 1e-5)).forward(x, res)
    assert torch.equal(s, s_ref), "x + residual 是逐元素的一次加法，必须逐位相同"
    _close(y, y_ref, "add_rms_norm")
    assert torch.equal(x, x0) and torch.equal(res, res0), "输入不许被改"


def test_rms_norm_reads_eps(ext):
    """eps 真的传进了 C++：eps 大到和 mean(x²) 同量级时结果明显不同。"""
    x, w = torch.full((1, 8), 0.01), torch.ones(8)
    assert not torch.allclose(ext.rms_norm(x, w, 1e-6), ext.rms_norm(x, w, 1e-2), rtol=1e-2)


def test_rms_norm_takes_a_strided_view(ext, fallback):
    """Qwen3 的 q/k norm：从 qkv 切出来的 (N, H, D) 行间有间隔。"""
    from minisgl.layers import RMSNorm

    qkv = torch.randn(3, 5 * 16)
    q = qkv[:, :3 * 16].reshape(3, 3, 16)
    assert not q.is_contiguous()
    w = torch.randn(16)
    _close(ext.rms_norm(q, w, 1e-6), fallback(lambda: _norm(RMSNorm, w, 1e-6)).forward(q), "rms_norm（view）")


@pytest.mark.parametrize("heads,kv_heads,d", [(9, 3, 64), (16, 8, 128), (2, 1, 6), (4, 4, 8)])
@pytest.mark.parametrize("pos_dtype", [torch.int32, torch.int64])
def test_apply_rope_matches_the_fallback(ext, fallback, heads, kv_heads, d, pos_dtype):
    g = torch.Generator().manual_seed(d)
    n = 5
    qkv = torch.randn(n, (heads + 2 * kv_heads) * d, generator=g)
    q, k, _ = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)  # 行间有间隔的 view，和注意力层一样
    rope, pos = fallback(lambda: _rope(d)), torch.tensor([0, 1, 63, 7, 30], dtype=pos_dtype)
    table = rope._cos_sin_cache
    before = qkv.clone()
    got, want = ext.apply_rope(pos, q, k, table, d), rope.forward(pos, q, k)
    for a, b, name in zip(got, want, ["query", "key"]):
        _close(a, b, f"apply_rope 的 {name}")
    assert torch.equal(qkv, before), "输入不许被改"
    q3 = q.reshape(n, heads, d)  # Qwen3：q_norm 之后是 (N, H, D)
    _close(ext.apply_rope(pos, q3, k, table, d)[0], want[0].reshape(n, heads, d), "apply_rope（三维）")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_apply_rope_takes_other_dtypes_like_the_fallback(ext, fallback, dtype):
    """表是 fp32，q、k 是别的浮点 dtype（所有层共用一个 RoPE，它不知道调用方的 dtype）：和退路一样在 fp32 里转，
    写回原来的 dtype；和退路的差不超过最大值的两个舍入单位（这个 dtype 的，fp64 是算的时候用的 fp32 的）。"""
    g = torch.Generator().manual_seed(7)
    rope, pos = fallback(lambda: _rope(16)), torch.tensor([3, 0, 63])
    q, k = (torch.randn(3, n * 16, generator=g).to(dtype) for n in (4, 2))
    for a, b in zip(ext.apply_rope(pos, q, k, rope._cos_sin_cache, 16), rope.forward(pos, q, k)):
        assert a.dtype == b.dtype == dtype and a.shape == b.shape
        eps = max(torch.finfo(dtype).eps, torch.finfo(torch.float32).eps)
        err = ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()
        assert err <= 2 * eps, f"{dtype}：C++ 和退路差了 {err:.2e}（相对最大值），超过两个舍入单位"


def test_apply_rope_refuses_a_position_past_the_table(ext):
    with pytest.raises(RuntimeError) as e:
        ext.apply_rope(torch.tensor([64]), torch.randn(1, 8), torch.randn(1, 8), _rope(8)._cos_sin_cache, 8)
    assert str(e.value).splitlines()[0] == "apply_rope: position 64 is out of range [0, 64)"


@pytest.mark.parametrize("loc_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("layout", ["flat", "heads", "qkv_rows", "qkv_heads"])
def test_store_cache_writes_only_the_given_slots(ext, fallback, loc_dtype, layout):
    """k、v 可以是 (N, H·D)、(N, H, D)，也可以是从 qkv 切出来、行间有间隔的 view（decode 时的 v 就是）。"""
    from minisgl.kvcache import MHAKVCache

    g = torch.Generator().manual_seed(0)
    caches = [torch.full((24, 2, 8), float("nan")) for _ in range(2)]
    pool = fallback(lambda: MHAKVCache(2, 1, 8, num_pages=24, page_size=1, dtype=torch.float32,
                                       device=torch.device("cpu")))
    for layer in (pool.k_cache(0), pool.v_cache(0)):
        layer.fill_(float("nan"))
    qkv = torch.randn(5, 3 * 16, generator=g)
    _, k, v = qkv.split([16, 16, 16], dim=-1)  # 行间隔着 48 个数
    if layout in ("flat", "heads"):
        k, v = k.contiguous(), v.contiguous()
    if layout in ("heads", "qkv_heads"):
        k, v = k.view(5, 2, 8), v.view(5, 2, 8)
    before = qkv.clone()
    loc = torch.tensor([21, 2, 9, 14, 3], dtype=loc_dtype)
    ext.store_cache(caches[0], caches[1], loc, k, v)
    pool.store_kv(k, v, loc, 0)
    assert torch.equal(caches[0].nan_to_num(), pool.k_cache(0).view(24, 2, 8).nan_to_num())
    assert torch.equal(caches[1].nan_to_num(), pool.v_cache(0).view(24, 2, 8).nan_to_num())
    assert torch.equal(caches[0][loc.long()], k.reshape(5, 2, 8)) and caches[0].isnan().sum() == (24 - 5) * 16
    assert torch.equal(caches[1][loc.long()], v.reshape(5, 2, 8))
    assert torch.equal(qkv, before), "输入不许被改"


def test_store_cache_refuses_a_slot_outside_the_pool(ext):
    kc, vc = torch.zeros(4, 2, 8), torch.zeros(4, 2, 8)
    with pytest.raises(RuntimeError) as e:
        ext.store_cache(kc, vc, torch.tensor([1, 4]), torch.ones(2, 16), torch.ones(2, 16))
    assert str(e.value).splitlines()[0] == "store_cache: slot 4 is out of range [0, 4)"


def _decode_case(bs: int, heads: int, kv_heads: int, d: int, lens: list[int], seed: int):
    g = torch.Generator().manual_seed(seed)
    slots_total = sum(lens) + 3
    kc, vc = torch.randn(2, slots_total, kv_heads, d, generator=g)
    perm = torch.randperm(slots_total, generator=g)  # 历史散在池子里，不连续
    L = max(lens)
    slots, mask, at = torch.zeros(bs, L, dtype=torch.long), torch.zeros(bs, 1, 1, L, dtype=torch.bool), 0
    for b, n in enumerate(lens):
        slots[b, :n], mask[b, ..., :n] = perm[at:at + n], True
        slots[b, n:] = perm[at]  # 补的位置指向自己的第 0 个槽位（和 torch 后端一样）
        at += n
    return torch.randn(bs, heads, d, generator=g), kc, vc, slots, mask


def _torch_backend(kc: torch.Tensor, vc: torch.Tensor, heads: int):
    """第 5 章的 torch 后端，池子换成 (槽位数, H_kv, D) 的这两块；decode(q, slots, mask) 走它的 decode 快路。"""
    from types import SimpleNamespace

    from minisgl.attention import TorchBackend
    from minisgl.attention.torch_backend import TorchAttnMetadata
    from minisgl.core import Batch, Context, set_global_ctx

    ctx = Context(page_size=1)
    ctx.kv_cache = SimpleNamespace(k_cache=lambda layer: kc, v_cache=lambda layer: vc,
                                   store_kv=lambda *args: None)  # 池子里已经是全部历史：这一步不写
    set_global_ctx(ctx)
    backend = TorchBackend(SimpleNamespace(num_qo_heads=heads, num_kv_heads=kc.shape[1], head_dim=kc.shape[2]))

    def decode(q: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        batch = Batch(reqs=[], phase="decode")
        batch.out_loc = torch.empty(0, dtype=torch.int32)
        empty = torch.empty(0, dtype=torch.int32)
        batch.attn_metadata = TorchAttnMetadata(empty, empty, empty.long(), [], decode_slots=slots, decode_mask=mask)
        return backend.forward(q, q.new_empty(0), q.new_empty(0), 0, batch)

    return decode


@pytest.mark.parametrize("shape", [(1, 2 * 1536), (4, 2 * 1536), (3, 2 * 7), (2, 5, 18)])
def test_silu_and_mul_matches_the_fallback(ext, shape):
    from minisgl.layers import silu_and_mul

    x = torch.randn(shape, generator=torch.Generator().manual_seed(shape[-1])) * 4  # 两头的饱和区也覆盖到
    before = x.clone()
    got = ext.silu_and_mul(x)
    # 逐个元素比：exp 是 decode_ops.cpp 自己算的（exp_vec），每个值都要和 ATen 的 F.silu(x1) * x2 差在几个 ulp 以内
    torch.testing.assert_close(got, silu_and_mul(x), rtol=1e-6, atol=1e-30)
    assert got.shape == (*shape[:-1], shape[-1] // 2) and got.is_contiguous()
    assert torch.equal(x, before), "输入不许被改"


def test_silu_and_mul_edges(ext):
    """exp 的两头：很负的 x 得 0（差不到 1e-30），很大的 x 得 x 本身，inf、NaN 和 F.silu 一样。
    放在向量宽度的整数倍里，走的是向量化的那段。"""
    from minisgl.layers import silu_and_mul

    gate = torch.tensor([-1e4, -100., -88.5, -87.5, -20., -1., -0., 0., 1., 20., 87.5, 88.5, 100., 1e4,
                         float("inf"), float("-inf"), float("nan")] * 2)[:32]
    x = torch.cat([gate, torch.linspace(-3, 3, 32)])[None]
    torch.testing.assert_close(ext.silu_and_mul(x), silu_and_mul(x), rtol=1e-6, atol=1e-30,
                               equal_nan=True)


@pytest.mark.parametrize("bs,heads,kv_heads,d,lens", [(1, 9, 3, 64, [1]), (4, 9, 3, 64, [30, 1, 7, 256]),
                                                        (3, 16, 8, 128, [5, 40, 12]), (2, 2, 2, 6, [3, 9]),
                                                        (8, 4, 1, 17, [1, 2, 3, 4, 5, 6, 7, 8])])
def test_decode_attention_matches_the_fallback(ext, fallback, bs, heads, kv_heads, d, lens):
    q, kc, vc, slots, mask = _decode_case(bs, heads, kv_heads, d, lens, seed=bs * d)
    before = [t.clone() for t in (q, kc, vc)]
    got = ext.decode_attention(q, kc, vc, slots, mask, d ** -0.5)  # torch 后端的 scale 就是 head_dim ** -0.5
    _close(got, fallback(lambda: _torch_backend(kc, vc, heads))(q, slots, mask), "decode_attention")
    assert all(torch.equal(a, b) for a, b in zip((q, kc, vc), before)), "输入不许被改"


@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
def test_decode_attention_takes_int32_and_int64_slots(ext, slot_dtype):
    q, kc, vc, slots, mask = _decode_case(3, 4, 2, 8, [3, 9, 1], seed=5)
    assert torch.equal(ext.decode_attention(q, kc, vc, slots.to(slot_dtype), mask, 0.3),
                       ext.decode_attention(q, kc, vc, slots, mask, 0.3))


def test_float_indices_are_refused_in_one_line(ext):
    with pytest.raises(RuntimeError) as e:
        ext.store_cache(torch.zeros(4, 8), torch.zeros(4, 8), torch.tensor([1.0]), torch.ones(1, 8),
                           torch.ones(1, 8))
    assert str(e.value).splitlines()[0] == "store_cache: indices must be CPU int32 or int64, got Float"


def test_decode_attention_ignores_what_the_mask_hides(ext):
    """补齐的位置不管指向哪个槽位，结果都一样：它们的权重是 0。"""
    q, kc, vc, slots, mask = _decode_case(2, 4, 2, 8, [3, 9], seed=1)
    other = slots.clone()
    other[0, 3:] = slots[1, 0]  # 第 0 个请求补的位置改指向别的请求的槽位
    assert torch.equal(ext.decode_attention(q, kc, vc, slots, mask, 0.3),
                       ext.decode_attention(q, kc, vc, other, mask, 0.3))


def test_decode_attention_result_does_not_depend_on_thread_count(ext):
    q, kc, vc, slots, mask = _decode_case(4, 16, 8, 128, [200, 1, 50, 256], seed=2)
    before, outs = torch.get_num_threads(), []
    try:
        for t in (1, 2, 3):
            torch.set_num_threads(t)
            outs.append(ext.decode_attention(q, kc, vc, slots, mask, 0.1))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_decode_attention_refuses_a_slot_outside_the_pool(ext):
    q, kc, vc, slots, mask = _decode_case(1, 2, 1, 8, [4], seed=3)
    slots[0, 2] = kc.shape[0]
    with pytest.raises(RuntimeError) as e:
        ext.decode_attention(q, kc, vc, slots, mask, 0.3)
    assert str(e.value).splitlines()[0] == f"decode_attention: slot {kc.shape[0]} is out of range [0, {kc.shape[0]})"


@pytest.mark.parametrize("layer", ["RMSNorm", "RMSNormFused", "LinearReplicated", "GatedMLP", "MHAKVCache",
                                   "TorchBackend", "RotaryEmbedding 换到别的设备"])
def test_layers_whose_data_is_not_cpu_fp32_take_the_pytorch_path(layer, monkeypatch):
    """C++ 版只收 CPU 上的 fp32：数据是 bf16 的层（和表搬到别的设备上的 RoPE）在构造、加载时就选 PyTorch 的写法，
    之后一次也不调 C++。"""
    from minisgl.distributed import set_tp_info
    from minisgl.kernel import utils
    from minisgl.layers import LinearReplicated, RMSNorm, RMSNormFused
    from minisgl.utils import torch_dtype

    class Refuse:  # 选到了也不要紧（RoPE 建表时在 CPU 上），只是一次也不许调
        def __getattr__(self, name):
            def call(*args):
                raise AssertionError(f"{layer} 的 {name} 不该走 C++")
            return call

    monkeypatch.setattr(utils, "extension", lambda: Refuse())
    set_tp_info(0, 1)
    bf = torch.bfloat16
    with torch_dtype(bf):
        if layer in ("RMSNorm", "RMSNormFused"):
            op = _norm({"RMSNorm": RMSNorm, "RMSNormFused": RMSNormFused}[layer], torch.ones(8, dtype=bf), 1e-6)
            op.forward(*[torch.randn(2, 8, dtype=bf)] * (1 if layer == "RMSNorm" else 2))
        elif layer == "LinearReplicated":
            op = LinearReplicated(8, 4, has_bias=False)
            op.load_state_dict({"weight": torch.randn(4, 8, dtype=bf)})
            op.forward(torch.randn(2, 8, dtype=bf))
        elif layer == "GatedMLP":
            from minisgl.models.utils import GatedMLP

            op = GatedMLP(SimpleNamespace(hidden_act="silu", intermediate_size=6, hidden_size=8))
            op.load_state_dict({k: torch.randn(v.shape, dtype=bf) for k, v in op.state_dict().items()})
            op.forward(torch.randn(2, 8, dtype=bf))
        elif layer == "MHAKVCache":
            from minisgl.kvcache import MHAKVCache

            pool = MHAKVCache(1, 1, 8, num_pages=4, page_size=1, dtype=bf, device=torch.device("cpu"))
            pool.store_kv(torch.ones(2, 8, dtype=bf), torch.ones(2, 8, dtype=bf), torch.tensor([2, 0]), 0)
        elif layer == "TorchBackend":
            q, kc, vc, slots, mask = _decode_case(1, 2, 1, 8, [3], seed=4)
            _torch_backend(kc.to(bf), vc.to(bf), 2)(q.to(bf), slots, mask)
        else:
            rope = _rope(8)
            positions = torch.tensor([0, 3], device="meta")
            q, k = rope.forward(positions, torch.empty(2, 16, device="meta"), torch.empty(2, 8, device="meta"))
            assert q.device.type == k.device.type == "meta"


# ---------------------------------------------------------------- to_huge_pages：把大权重放进 2 MB 大页


def _advised_vma(ptr: int) -> tuple[int, int] | None:
    """/proc/self/smaps 里装着 ptr、VmFlags 带 hg（madvise(MADV_HUGEPAGE) 过）的映射的 (起, 止)；没有就是 None。"""
    vma = None
    for line in open("/proc/self/smaps").read().splitlines():
        head = line.split(" ", 1)[0]
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            start, end = (int(a, 16) for a in head.split("-"))
            vma = (start, end) if start <= ptr < end else None
        elif line.startswith("VmFlags:") and vma is not None:
            return vma if " hg" in line else None
    return None


@pytest.fixture
def thp():
    from minisgl.kernel import huge_pages

    if not huge_pages._thp_enabled():
        pytest.skip("这台机器没有透明大页（不是 Linux，或 THP 是 [never]）：to_huge_pages 原样返回，没有可查的")
    return huge_pages.HUGE_PAGE


@pytest.mark.parametrize("make", [lambda: torch.randn(1024, 1024), lambda: torch.randn(2048, 1024).t(),
                                  lambda: torch.randn(1024, 2048, dtype=torch.bfloat16),
                                  lambda: torch.randn((2 << 20) // 4 + 1)],
                         ids=["4MiB", "transposed-view", "bf16", "2MiB-plus-one-float"])
def test_to_huge_pages_copies_into_an_aligned_advised_mapping(thp, make):
    """值、形状、dtype 不变；新的一份连续、从 2 MB 边界开始；整 2 MB 的那几段都 madvise 过；输入不动。"""
    from minisgl.kernel import to_huge_pages

    t = make()
    before = t.clone()
    out = to_huge_pages(t)
    assert out is not t and torch.equal(out, before) and out.dtype == t.dtype and out.is_contiguous()
    assert torch.equal(t, before), "输入不许被改"
    assert out.data_ptr() % thp == 0, "要从 2 MB 边界开始：大页只能映射对齐的整 2 MB"
    vma = _advised_vma(out.data_ptr())
    assert vma is not None, "装着权重的映射没有 madvise(MADV_HUGEPAGE)（smaps 的 VmFlags 里没有 hg）"
    assert vma[1] - out.data_ptr() >= out.nbytes // thp * thp, "整 2 MB 的那几段都要 madvise 过"


def test_to_huge_pages_leaves_small_and_non_cpu_tensors_alone(thp):
    """不到 2 MB 的（一个大页都装不满）和不在 CPU 上的张量：原样返回同一个对象，不拷。"""
    from minisgl.kernel import to_huge_pages

    small = torch.randn(thp // 4 - 1)
    assert to_huge_pages(small) is small
    meta = torch.empty(1024, 1024, device="meta")
    assert to_huge_pages(meta) is meta


def test_the_huge_page_mapping_goes_away_with_the_tensor(thp):
    """映射跟着张量走：张量释放了，映射也解除（不然每加载一次 Engine 就漏一份权重）。"""
    import gc

    from minisgl.kernel import to_huge_pages

    out = to_huge_pages(torch.randn(1024, 1024))
    ptr = out.data_ptr()
    assert _advised_vma(ptr) is not None
    del out
    gc.collect()
    assert _advised_vma(ptr) is None, "张量释放了，madvise 过的映射还在"
