"""第 4 章起：KV 池的尺寸必须是正整数；有了 page table 和 KV 池之后，ctx.forward_batch 在前向前查一次
out_loc 是否在池里、table_idx 是否在 page table 里、请求是否比一行还长。最后是池的"先写后读"性质测试。"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minisgl.core import Batch, Context, Req
from minisgl.distributed import reset_tp_info, set_tp_info
from minisgl.kvcache import MHAKVCache

SIZES = dict(num_kv_heads=2, num_layers=2, head_dim=4, num_pages=6, page_size=4)


@pytest.fixture(autouse=True)
def tp1():
    reset_tp_info()
    set_tp_info(0, 1)
    yield
    reset_tp_info()


def make_pool(**kw):
    return MHAKVCache(**{**SIZES, **kw}, dtype=torch.float32, device=torch.device("cpu"))


@pytest.mark.parametrize("name, value", [("num_pages", 0), ("page_size", 0), ("page_size", -4), ("page_size", 2.5),
                                         ("num_layers", 0), ("head_dim", 0), ("num_kv_heads", 0)])
def test_pool_sizes_must_be_positive_ints(name, value):
    with pytest.raises(ValueError) as e:
        make_pool(**{name: value})
    assert name in str(e.value) and repr(value) in str(e.value), str(e.value)


# ---------------------------------------------------------------- ctx.forward_batch 的检查（有 page table 之后）

def paged_ctx(rows=3, width=8):
    ctx = Context(page_size=4)
    ctx.kv_cache = make_pool()  # 6 页 × 4 = 24 个槽位
    ctx.page_table = torch.arange(rows * width, dtype=torch.int32).view(rows, width) % 24
    return ctx


def make_req(total, cached, row, uid):
    return Req(input_ids=torch.zeros(total, dtype=torch.int32), table_idx=row, cached_len=cached, output_len=1,
               uid=uid, sampling_params=None, cache_handle=None)


def filled(ctx, reqs):
    b = Batch(reqs=reqs, phase="prefill")
    b.padded_reqs = reqs
    b.input_ids = torch.cat([r.input_ids[r.cached_len:r.device_len] for r in reqs])
    b.positions = torch.cat([torch.arange(r.cached_len, r.device_len, dtype=torch.int32) for r in reqs])
    b.out_loc = torch.cat([ctx.page_table[r.table_idx, r.cached_len:r.device_len] for r in reqs])
    return b


def forward(ctx, batch):
    with ctx.forward_batch(batch):
        pass


def test_good_paged_batch_passes():
    ctx = paged_ctx()
    forward(ctx, filled(ctx, [make_req(5, 0, 0, 0), make_req(8, 7, 2, 1)]))


def test_batch_without_out_loc():
    ctx = paged_ctx()
    b = filled(ctx, [make_req(5, 0, 0, 0)])
    del b.out_loc
    with pytest.raises(RuntimeError, match=r"batch\.out_loc"):
        forward(ctx, b)


@pytest.mark.parametrize("slot", [-1, 24, 10**6])
def test_out_loc_outside_the_pool(slot):
    ctx = paged_ctx()
    b = filled(ctx, [make_req(5, 0, 0, 0)])
    b.out_loc[2] = slot
    with pytest.raises(ValueError) as e:
        forward(ctx, b)
    msg = str(e.value)
    assert "out_loc" in msg and str(slot) in msg and "24" in msg, msg


@pytest.mark.parametrize("row", [3, -1])
def test_table_row_outside_the_page_table(row):
    ctx = paged_ctx(rows=3)
    good = make_req(5, 0, 0, 0)
    b = filled(ctx, [good])
    bad = make_req(2, 0, row, uid=9)
    b.reqs, b.padded_reqs = [good, bad], [good, bad]
    with pytest.raises(ValueError) as e:
        forward(ctx, b)
    msg = str(e.value)
    assert "uid=9" in msg and "table_idx" in msg and "3 行" in msg, msg


def test_request_longer_than_a_page_table_row():
    """page table 一行 8 个位置 = 最大序列长度：第 9 个位置没有地方记槽位，不能悄悄截断。"""
    ctx = paged_ctx(width=8)
    ok = make_req(8, 7, 0, 0)
    b = filled(ctx, [ok])
    long = make_req(9, 8, 1, uid=5)
    b.reqs = b.padded_reqs = [ok, long]
    b.input_ids, b.positions = torch.zeros(2, dtype=torch.int32), torch.tensor([7, 8], dtype=torch.int32)
    b.out_loc = torch.tensor([0, 1], dtype=torch.int32)
    with pytest.raises(ValueError) as e:
        forward(ctx, b)
    msg = str(e.value)
    assert "uid=5" in msg and "9" in msg and "8" in msg, msg


# ---------------------------------------------------------------- 性质测试：先写后读

@st.composite
def store_sequences(draw):
    num_pages, page_size = draw(st.integers(1, 6)), draw(st.sampled_from([1, 2, 4, 16]))
    h_kv, d, layers = draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([4, 8])), draw(st.integers(1, 3))
    slots = num_pages * page_size
    ops = []
    for _ in range(draw(st.integers(1, 6))):
        loc = draw(st.lists(st.integers(0, slots - 1), min_size=1, max_size=min(slots, 12), unique=True))
        ops.append((draw(st.integers(0, layers - 1)), loc, draw(st.booleans()), draw(st.booleans())))
    return num_pages, page_size, h_kv, d, layers, ops, draw(st.integers(0, 2**31 - 1))


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(case=store_sequences())
def test_store_then_gather(case):
    """随机的池形状和一串写入（随机层、随机不重复的槽位、两种 k/v 形状、int32/int64 的 out_loc）：
    按槽位读回来的正好是最后一次写进去的值；没写过的槽位、没写过的层保持原样。"""
    num_pages, page_size, h_kv, d, layers, ops, seed = case
    g = torch.Generator().manual_seed(seed)
    pool = MHAKVCache(num_kv_heads=h_kv, num_layers=layers, head_dim=d, num_pages=num_pages, page_size=page_size,
                      dtype=torch.float32, device=torch.device("cpu"))
    for layer in range(layers):
        pool.k_cache(layer).fill_(float("nan"))
        pool.v_cache(layer).fill_(float("nan"))
    expected = {}  # (层, 槽位) -> (k, v)，从头记的参照
    for layer, loc, flat, int64 in ops:
        k, v = torch.randn(2, len(loc), h_kv, d, generator=g)
        out_loc = torch.tensor(loc, dtype=torch.int64 if int64 else torch.int32)
        pool.store_kv(k.flatten(1) if flat else k, v.flatten(1) if flat else v, out_loc, layer)
        for i, s in enumerate(loc):
            expected[layer, s] = (k[i], v[i])
    for layer in range(layers):
        k_all = pool.k_cache(layer).reshape(-1, h_kv, d)  # 分页视图按槽位摊平：page * page_size + 偏移
        v_all = pool.v_cache(layer).reshape(-1, h_kv, d)
        assert pool.k_cache(layer).shape == (num_pages, page_size, h_kv, d)
        for s in range(num_pages * page_size):
            if (layer, s) in expected:
                k, v = expected[layer, s]
                assert torch.equal(k_all[s], k) and torch.equal(v_all[s], v), (layer, s)
                page, offset = divmod(s, page_size)
                assert torch.equal(pool.k_cache(layer)[page, offset], k)
            else:
                assert k_all[s].isnan().all() and v_all[s].isnan().all(), (layer, s)
