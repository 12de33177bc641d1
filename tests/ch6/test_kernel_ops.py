"""minisgl.kernel 里矩阵乘之外的小算子（csrc/decode_ops.cpp）：每个都和它的 PyTorch 退路核对。

退路就是前几章的算式（F.rms_norm、查表旋转、按槽位赋值、index_select + SDPA、F.silu），所以"C++ 版 = 退路"就是"C++ 版 =
前几章"。形状挑不好对齐的：d 不是向量宽度的倍数、GQA 的组、补齐的槽位、行间有间隔的 view。输入一律不许被改；
越界的槽位和位置报一行错，不去读写别人的内存。只核对数值，从不断言耗时。"""

from __future__ import annotations

import pytest
import torch

from tests.ch6.test_kernel import _ext, _has_toolchain

RTOL = 1e-5  # 相对误差：只差 fp32 的累加顺序


@pytest.fixture
def ext():
    e = _ext()
    if e is None:
        assert not _has_toolchain(), "这台机器有编译器，minisgl.kernel 却没编出来"
        pytest.skip("没有 C++ 编译器：只有 PyTorch 退路（上面的测试已经核对过它确实没编出来）")
    return e


@pytest.fixture
def fallback(monkeypatch):
    """让 minisgl.kernel 的函数都走 PyTorch 退路（和编译失败时一样）。"""
    from minisgl.kernel import cpu_linear

    def run(fn, *args):
        with monkeypatch.context() as m:
            m.setattr(cpu_linear, "extension", lambda: None)
            return fn(*args)

    return run


def _close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, (what, got.shape, want.shape)
    err = ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item() if want.numel() else 0.0
    assert err <= RTOL, f"{what}：C++ 和 PyTorch 退路差了 {err:.2e}（相对最大值），超过 {RTOL}"


@pytest.mark.parametrize("shape", [(1, 576), (4, 576), (3, 7), (2, 3, 128), (5, 17)])
def test_rms_norm_and_add_rms_norm_match_the_fallback(ext, fallback, shape):
    from minisgl import kernel

    g = torch.Generator().manual_seed(shape[-1])
    x, res, w = torch.randn(shape, generator=g), torch.randn(shape, generator=g), torch.randn(shape[-1], generator=g)
    x0, res0 = x.clone(), res.clone()
    _close(kernel.rms_norm(x, w, 1e-6), fallback(kernel.rms_norm, x, w, 1e-6), "rms_norm")
    y, s = kernel.add_rms_norm(x, res, w, 1e-5)
    y_ref, s_ref = fallback(kernel.add_rms_norm, x, res, w, 1e-5)
    assert torch.equal(s, s_ref), "x + residual 是逐元素的一次加法，必须逐位相同"
    _close(y, y_ref, "add_rms_norm")
    assert torch.equal(x, x0) and torch.equal(res, res0), "输入不许被改"


def test_rms_norm_reads_eps(ext):
    """eps 真的传进了 C++：eps 大到和 mean(x²) 同量级时结果明显不同。"""
    from minisgl import kernel

    x, w = torch.full((1, 8), 0.01), torch.ones(8)
    assert not torch.allclose(kernel.rms_norm(x, w, 1e-6), kernel.rms_norm(x, w, 1e-2), rtol=1e-2)


def test_rms_norm_takes_a_strided_view(ext, fallback):
    """Qwen3 的 q/k norm：从 qkv 切出来的 (N, H, D) 行间有间隔。"""
    from minisgl import kernel

    qkv = torch.randn(3, 5 * 16)
    q = qkv[:, :3 * 16].reshape(3, 3, 16)
    assert not q.is_contiguous()
    w = torch.randn(16)
    _close(kernel.rms_norm(q, w, 1e-6), fallback(kernel.rms_norm, q, w, 1e-6), "rms_norm（view）")


def _rope_table(max_pos: int, d: int) -> torch.Tensor:
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    f = torch.outer(torch.arange(max_pos).float(), inv)
    return torch.cat([f.cos(), f.cos(), -f.sin(), f.sin()], dim=-1)


@pytest.mark.parametrize("heads,kv_heads,d", [(9, 3, 64), (16, 8, 128), (2, 1, 6), (4, 4, 8)])
@pytest.mark.parametrize("pos_dtype", [torch.int32, torch.int64])
def test_apply_rope_matches_the_fallback(ext, fallback, heads, kv_heads, d, pos_dtype):
    from minisgl import kernel

    g = torch.Generator().manual_seed(d)
    n = 5
    qkv = torch.randn(n, (heads + 2 * kv_heads) * d, generator=g)
    q, k, _ = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)  # 行间有间隔的 view，和注意力层一样
    table, pos = _rope_table(64, d), torch.tensor([0, 1, 63, 7, 30], dtype=pos_dtype)
    before = qkv.clone()
    got, want = kernel.apply_rope(pos, q, k, table, d), fallback(kernel.apply_rope, pos, q, k, table, d)
    for a, b, name in zip(got, want, ["query", "key"]):
        _close(a, b, f"apply_rope 的 {name}")
    assert torch.equal(qkv, before), "输入不许被改"
    q3 = q.reshape(n, heads, d)  # Qwen3：q_norm 之后是 (N, H, D)
    _close(kernel.apply_rope(pos, q3, k, table, d)[0], want[0].reshape(n, heads, d), "apply_rope（三维）")


def test_apply_rope_refuses_a_position_past_the_table(ext):
    from minisgl import kernel

    with pytest.raises(RuntimeError) as e:
        kernel.apply_rope(torch.tensor([64]), torch.randn(1, 8), torch.randn(1, 8), _rope_table(64, 8), 8)
    assert str(e.value).splitlines()[0] == "apply_rope: position 64 is out of range [0, 64)"


@pytest.mark.parametrize("loc_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("flat", [True, False])
def test_store_cache_writes_only_the_given_slots(ext, fallback, loc_dtype, flat):
    from minisgl import kernel

    g = torch.Generator().manual_seed(0)
    caches = [torch.full((24, 2, 8), float("nan")) for _ in range(4)]
    k, v = torch.randn(2, 5, 2, 8, generator=g)
    loc = torch.tensor([21, 2, 9, 14, 3], dtype=loc_dtype)
    args = (k.flatten(1), v.flatten(1)) if flat else (k, v)
    kernel.store_cache(caches[0], caches[1], loc, *args)
    fallback(kernel.store_cache, caches[2], caches[3], loc, *args)
    assert torch.equal(caches[0].nan_to_num(), caches[2].nan_to_num())
    assert torch.equal(caches[1].nan_to_num(), caches[3].nan_to_num())
    assert torch.equal(caches[0][loc.long()], k) and caches[0].isnan().sum() == (24 - 5) * 16


def test_store_cache_refuses_a_slot_outside_the_pool(ext):
    from minisgl import kernel

    kc, vc = torch.zeros(4, 2, 8), torch.zeros(4, 2, 8)
    with pytest.raises(RuntimeError) as e:
        kernel.store_cache(kc, vc, torch.tensor([1, 4]), torch.ones(2, 16), torch.ones(2, 16))
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


@pytest.mark.parametrize("shape", [(1, 2 * 1536), (4, 2 * 1536), (3, 2 * 7), (2, 5, 18)])
def test_silu_and_mul_matches_the_fallback(ext, fallback, shape):
    from minisgl import kernel

    x = torch.randn(shape, generator=torch.Generator().manual_seed(shape[-1])) * 4  # 两头的饱和区也覆盖到
    before = x.clone()
    got = kernel.silu_and_mul(x)
    # 逐个元素比：exp 是 decode_ops.cpp 自己算的（exp_vec），每个值都要和 ATen 的 F.silu(x1) * x2 差在几个 ulp 以内
    torch.testing.assert_close(got, fallback(kernel.silu_and_mul, x), rtol=1e-6, atol=1e-30)
    assert got.shape == (*shape[:-1], shape[-1] // 2) and got.is_contiguous()
    assert torch.equal(x, before), "输入不许被改"


def test_silu_and_mul_edges(ext, fallback):
    """exp 的两头：很负的 x 得 0（差不到 1e-30），很大的 x 得 x 本身，inf、NaN 和 F.silu 一样。
    放在向量宽度的整数倍里，走的是向量化的那段。"""
    from minisgl import kernel

    gate = torch.tensor([-1e4, -100., -88.5, -87.5, -20., -1., -0., 0., 1., 20., 87.5, 88.5, 100., 1e4,
                         float("inf"), float("-inf"), float("nan")] * 2)[:32]
    x = torch.cat([gate, torch.linspace(-3, 3, 32)])[None]
    torch.testing.assert_close(kernel.silu_and_mul(x), fallback(kernel.silu_and_mul, x), rtol=1e-6, atol=1e-30,
                               equal_nan=True)


@pytest.mark.parametrize("bs,heads,kv_heads,d,lens", [(1, 9, 3, 64, [1]), (4, 9, 3, 64, [30, 1, 7, 256]),
                                                        (3, 16, 8, 128, [5, 40, 12]), (2, 2, 2, 6, [3, 9]),
                                                        (8, 4, 1, 17, [1, 2, 3, 4, 5, 6, 7, 8])])
def test_decode_attention_matches_the_fallback(ext, fallback, bs, heads, kv_heads, d, lens):
    from minisgl import kernel

    q, kc, vc, slots, mask = _decode_case(bs, heads, kv_heads, d, lens, seed=bs * d)
    before = [t.clone() for t in (q, kc, vc)]
    scale = d ** -0.5
    got = kernel.decode_attention(q, kc, vc, slots, mask, scale)
    _close(got, fallback(kernel.decode_attention, q, kc, vc, slots, mask, scale), "decode_attention")
    assert all(torch.equal(a, b) for a, b in zip((q, kc, vc), before)), "输入不许被改"


@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
def test_decode_attention_takes_int32_and_int64_slots(ext, slot_dtype):
    from minisgl import kernel

    q, kc, vc, slots, mask = _decode_case(3, 4, 2, 8, [3, 9, 1], seed=5)
    assert torch.equal(kernel.decode_attention(q, kc, vc, slots.to(slot_dtype), mask, 0.3),
                       kernel.decode_attention(q, kc, vc, slots, mask, 0.3))


def test_float_indices_are_refused_in_one_line(ext):
    from minisgl import kernel

    with pytest.raises(RuntimeError) as e:
        kernel.store_cache(torch.zeros(4, 8), torch.zeros(4, 8), torch.tensor([1.0]), torch.ones(1, 8),
                           torch.ones(1, 8))
    assert str(e.value).splitlines()[0] == "store_cache: indices must be CPU int32 or int64, got Float"


def test_decode_attention_ignores_what_the_mask_hides(ext):
    """补齐的位置不管指向哪个槽位，结果都一样：它们的权重是 0。"""
    from minisgl import kernel

    q, kc, vc, slots, mask = _decode_case(2, 4, 2, 8, [3, 9], seed=1)
    other = slots.clone()
    other[0, 3:] = slots[1, 0]  # 第 0 个请求补的位置改指向别的请求的槽位
    assert torch.equal(kernel.decode_attention(q, kc, vc, slots, mask, 0.3),
                       kernel.decode_attention(q, kc, vc, other, mask, 0.3))


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


@pytest.mark.parametrize("op", ["rms_norm", "add_rms_norm", "apply_rope", "store_cache", "decode_attention",
                                "silu_and_mul"])
def test_other_dtypes_take_the_pytorch_path(op, monkeypatch):
    """C++ 版只收 CPU 上的 fp32：bf16 原样交给 PyTorch 算式，一次也不调 C++。"""
    from minisgl import kernel
    from minisgl.kernel import cpu_linear

    class Refuse:
        def __getattr__(self, name):
            raise AssertionError(f"bf16 的 {name} 不该走 C++")

    bf = torch.bfloat16
    args = {"rms_norm": (torch.randn(2, 8, dtype=bf), torch.ones(8, dtype=bf), 1e-6),
            "add_rms_norm": (torch.randn(2, 8, dtype=bf), torch.randn(2, 8, dtype=bf), torch.ones(8, dtype=bf), 1e-6),
            "apply_rope": (torch.tensor([0, 3]), torch.randn(2, 16, dtype=bf), torch.randn(2, 8, dtype=bf),
                           _rope_table(8, 8), 8),
            "store_cache": (torch.zeros(4, 1, 8, dtype=bf), torch.zeros(4, 1, 8, dtype=bf), torch.tensor([2, 0]),
                            torch.ones(2, 8, dtype=bf), torch.ones(2, 8, dtype=bf)),
            "decode_attention": (*(t.to(bf) if t.is_floating_point() else t
                                   for t in _decode_case(1, 2, 1, 8, [3], seed=4)), 0.3),
            "silu_and_mul": (torch.randn(2, 16, dtype=bf),)}[op]
    monkeypatch.setattr(cpu_linear, "extension", lambda: Refuse())
    getattr(kernel, op)(*args)


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
