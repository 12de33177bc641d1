"""第 4 章起：KV 池的尺寸必须是正整数；池的"先写后读"性质测试。batch 在哪里建就在哪里查：
generate.py 的命令行见 test_cli_limits.py，Engine 见第 6 章的测试。"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minisgl.distributed import reset_tp_info, set_tp_info
from minisgl.kvcache import MHAKVCache
from tests.harness.errors import expect_error

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
    with expect_error("ch4/pool_sizes", name=name, value=repr(value)):
        make_pool(**{name: value})


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
                assert torch.equal(k_all[s], k), (layer, s)
                assert torch.equal(v_all[s], v), (layer, s)
                page, offset = divmod(s, page_size)
                assert torch.equal(pool.k_cache(layer)[page, offset], k)
            else:
                assert k_all[s].isnan().all(), (layer, s)
                assert v_all[s].isnan().all(), (layer, s)
