"""第 6 章：手工的调度器角色（minisgl.scheduler）和 Engine 的几处约定。

TableManager 给行、CacheManager 给页、add_req 在请求进来时查一次、prepare_batch 填 batch、process_output 写回；
页的账记在主存里，所以 out_loc 不重复不必在每步前向里去设备上查。另有：每个 rank 按自己的 KV 头数算页数，
ForwardOutput 带着 logits，logits 有 NaN 时采样器给出 NAN_TOKEN、process_output 报错。
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minisgl.core import Req, SamplingParams
from minisgl.distributed import DistributedInfo
from minisgl.engine import Engine, EngineConfig, ForwardOutput, Sampler
from minisgl.engine import engine as engine_module
from minisgl.engine.sample import NAN_TOKEN, BatchSamplingArgs
from minisgl.scheduler import CacheManager, TableManager, add_req, prepare_batch, process_output
from minisgl.utils import div_ceil
from tests.harness.errors import expect_error

MODEL = "qwen3-tied"  # 词表 1024，2 个 KV 头


@pytest.fixture(scope="module")
def engine(tiny_models):
    from minisgl.core import reset_global_ctx
    from minisgl.distributed import reset_tp_info

    reset_global_ctx()
    reset_tp_info()
    e = Engine(EngineConfig(model_path=str(tiny_models[MODEL]), tp_info=DistributedInfo(0, 1), dtype=torch.float32,
                            max_running_req=3, page_size=4, num_page_override=12, max_seq_len_override=24))
    yield e
    e.shutdown()


@pytest.fixture(autouse=True)
def clean_global_state():  # 覆盖 conftest 的同名夹具：这里的引擎整个文件共用
    yield


def managers(engine):
    return (TableManager(engine.config.max_running_req, engine.page_table),
            CacheManager(engine.num_pages, engine.config.page_size, engine.page_table))


def req(uid, n, row, output_len=4):
    return Req(input_ids=torch.arange(1, n + 1, dtype=torch.int32), table_idx=row, cached_len=0,
               output_len=output_len, uid=uid, sampling_params=SamplingParams(max_tokens=output_len),
               cache_handle=None)


# ---------------------------------------------------------------- add_req：请求进来时查一次

def test_add_req_refuses_an_empty_prompt(engine):
    table, _ = managers(engine)
    with expect_error("ch6/add_req_empty", uid=5):
        add_req(engine, table, [], SamplingParams(max_tokens=2), uid=5)
    assert table.available_size == 3, "被拒绝的请求不该占一行"


@pytest.mark.parametrize("bad", [1024, -1, 5000])
def test_add_req_refuses_ids_outside_the_vocab(engine, bad):
    table, _ = managers(engine)
    with expect_error("ch6/add_req_vocab", id=bad, vocab_size=1024):
        add_req(engine, table, [1, bad, 3], SamplingParams(max_tokens=2), uid=0)


def test_add_req_states_the_length_rule(engine):
    """提示词 + max_tokens - 1 <= max_seq_len（24）：最后采出的 token 不再前向。
    22 + 4 - 1 = 25 被拒绝，21 + 4 - 1 = 24 可以，而且真的能跑完：最后一步 device_len 正好是 24。"""
    table, cache = managers(engine)
    with expect_error("ch6/add_req_length", prompt_len=22, max_tokens=4, max_seq_len=24):
        add_req(engine, table, list(range(22)), SamplingParams(max_tokens=4), uid=1)
    r = add_req(engine, table, list(range(21)), SamplingParams(max_tokens=4), uid=2)
    assert table.token_pool[r.table_idx, :21].tolist() == list(range(21))
    for phase in ("prefill", "decode", "decode", "decode"):
        batch = prepare_batch(engine, table, cache, [r], phase)
        process_output(table, cache, [r], engine.forward_batch(batch, engine.sampler.prepare(batch)))
    assert r.max_device_len == 25
    assert not r.can_decode
    assert table.available_size == 3


def test_table_rows_run_out_and_free_twice(engine):
    table, _ = managers(engine)
    rows = [table.allocate() for _ in range(3)]
    assert sorted(rows) == [0, 1, 2], "假请求的那一行（第 3 行）不能分给真请求"
    with expect_error("ch6/table_full", running=3):
        table.allocate()
    table.free(rows[0])
    with expect_error("ch6/table_free_unallocated", row=rows[0]):
        table.free(rows[0])


# ---------------------------------------------------------------- CacheManager：页的账在主存里

def test_two_reqs_on_one_row_are_refused_before_any_page_moves(engine):
    _, cache = managers(engine)
    a, b = req(0, 5, row=1), req(1, 3, row=1)
    with expect_error("ch6/row_pages_mismatch", uid=1, row=1, pages=2):  # a 排好了 2 页，b 却要从第 0 页开始
        cache.allocate_paged([a, b])
    assert len(cache.free_slots) == engine.num_pages
    cache.allocate_paged([a])
    with expect_error("ch6/row_pages_mismatch", uid=1, row=1, pages=2):  # 下一步又来一个新请求占这一行
        cache.allocate_paged([b])


def test_req_longer_than_the_row_is_refused_before_any_page_moves(engine):
    """没经过 add_req 的请求（40 个 token，一行只有 32 个位置）：报出请求和行宽，而不是写页表时越界。"""
    table, cache = managers(engine)
    with expect_error("ch6/req_longer_than_row", uid=0, width=32):
        prepare_batch(engine, table, cache, [req(0, 40, row=0)], "prefill")
    assert len(cache.free_slots) == engine.num_pages


def test_running_out_of_pages_names_the_option(engine):
    _, cache = managers(engine)
    with expect_error("ch6/out_of_pages"):
        cache.allocate_paged([req(0, 24, 0), req(1, 24, 1), req(2, 24, 2)])  # 3 × 6 页 > 12 页
    assert len(cache.free_slots) == engine.num_pages


@settings(max_examples=30, deadline=None, derandomize=True, database=None)
@given(lens=st.lists(st.integers(1, 8), min_size=1, max_size=3), steps=st.integers(0, 6))
def test_slots_are_unique_and_inside_the_pool(engine, lens, steps):
    """几个请求交替增长：每个请求每个位置的槽位都在池里（不碰假页），且没有两个位置共用一个槽位。"""
    _, cache = managers(engine)
    ps, reqs = engine.config.page_size, [req(i, n, row=i, output_len=8) for i, n in enumerate(lens)]
    cache.allocate_paged(reqs)
    for _ in range(steps):
        for r in reqs:
            r.complete_one()
        cache.allocate_paged(reqs)
    slots = [s for r in reqs for s in engine.page_table[r.table_idx, :r.device_len].tolist()]
    assert len(set(slots)) == len(slots)
    assert all(0 <= s < engine.num_pages * ps for s in slots)
    used = sum(div_ceil(r.device_len, ps) for r in reqs)
    assert len(cache.free_slots) == engine.num_pages - used
    for r in reqs:
        cache.free(r.table_idx)
    assert sorted(cache.free_slots) == [p * ps for p in range(engine.num_pages)]


# ---------------------------------------------------------------- 一整轮：prepare_batch → forward → process_output

def test_round_trip_returns_logits_and_frees_rows(engine):
    table, cache = managers(engine)
    reqs = [add_req(engine, table, ids, SamplingParams(max_tokens=3), uid)
            for uid, ids in enumerate([[1, 2, 3], [4, 5]])]
    for phase in ("prefill", "decode", "decode"):
        batch = prepare_batch(engine, table, cache, reqs, phase)
        out = engine.forward_batch(batch, engine.sampler.prepare(batch))
        assert isinstance(out, ForwardOutput)
        assert out.logits.shape == (2, 1024)
        assert out.logits.argmax(-1).tolist() == out.next_tokens_cpu.tolist()  # 贪心：token 就是这份 logits 的 argmax
        tokens = process_output(table, cache, reqs, out)
        assert [r.input_ids[-1].item() for r in reqs] == tokens
    assert table.available_size == 3, "生成完的请求交还行和页"
    assert len(cache.free_slots) == engine.num_pages, "生成完的请求交还行和页"
    row = reqs[0].table_idx
    with expect_error("ch6/row_pages_mismatch", uid=0, row=row, pages=0):  # 生成完的请求交还了行和页，不能再送进来
        prepare_batch(engine, table, cache, reqs, "decode")
    assert len(cache.free_slots) == engine.num_pages, "被拒绝的 batch 不该拿走页"


def test_nan_logits_are_reported_not_token_0(engine):
    sampler = Sampler(torch.device("cpu"), 5)
    logits = torch.tensor([[0.0, 1.0, 2.0, 0.0, 0.0], [float("nan")] * 5, [0.0, float("nan"), 9.0, 0.0, 0.0]])
    greedy = BatchSamplingArgs(temperatures=None)
    assert sampler.sample(logits, greedy).tolist() == [2, NAN_TOKEN, NAN_TOKEN]
    mixed = BatchSamplingArgs(temperatures=torch.ones(3), greedy=torch.tensor([True, False, False]))
    assert sampler.sample(logits, mixed).tolist()[1:] == [NAN_TOKEN, NAN_TOKEN]
    table, cache = managers(engine)
    r = add_req(engine, table, [1, 2], SamplingParams(max_tokens=2), uid=9)
    cache.allocate_paged([r])
    r.complete_one()
    out = ForwardOutput(torch.tensor([NAN_TOKEN], dtype=torch.int32, device=engine.device),
                        torch.tensor([NAN_TOKEN], dtype=torch.int32),
                        SimpleNamespace(synchronize=lambda: None), torch.full((1, 1024), float("nan")))
    with expect_error("ch6/nan_logits", uid=9):
        process_output(table, cache, [r], out)


# ---------------------------------------------------------------- 页数按本 rank 的 KV 头数算

@pytest.mark.parametrize("tp", [2, 4])
def test_num_pages_counts_this_ranks_kv_heads(tiny_models, monkeypatch, tp):
    """2 个 KV 头：tp=2 时每个 rank 1 个头，tp=4 时复制、也是 1 个头。同样的内存，页数是 tp=1 的 2 倍。"""
    mc = EngineConfig(model_path=str(tiny_models[MODEL]), tp_info=DistributedInfo(0, 1),
                      dtype=torch.float32).model_config
    full_page = 2 * mc.head_dim * mc.num_kv_heads * 4 * mc.num_layers  # tp=1、page_size=1、fp32 一页的字节数
    free_bytes = int(100 * full_page / 0.9) + 1  # memory_ratio=0.9 之后正好 100 页
    monkeypatch.setattr(engine_module, "available_memory", lambda device: free_bytes)  # 页面点了名的接缝

    def pages(size):
        config = EngineConfig(model_path=str(tiny_models[MODEL]), tp_info=DistributedInfo(0, size),
                              dtype=torch.float32, max_running_req=4, max_seq_len_override=512)
        fake = SimpleNamespace(device=torch.device("cpu"), dtype=torch.float32)
        return Engine._determine_num_pages(fake, config)

    assert mc.num_kv_heads == 2
    assert pages(1) == 100
    assert pages(tp) == 200
