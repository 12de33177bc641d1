"""第 1 章：Req 的三个长度字段、Batch、全局 Context 的规则。"""

import pytest
import torch

from minisgl import core
from minisgl.core import Batch, Context, Req, SamplingParams
from tests.ch1.common import ready_batch
from tests.harness.batch import make_req
from tests.harness.errors import expect_error



def lengths(r):
    return r.cached_len, r.device_len, r.max_device_len, r.extend_len, r.remain_len, r.can_decode


def test_task1_lengths_through_prefill_and_decode():
    r = make_req(prompt_len=5, output_len=3)
    assert lengths(r) == (0, 5, 8, 5, 3, True)  # prefill 之前：整段提示词都要算
    r.complete_one()  # prefill 之后（引擎做）
    assert lengths(r) == (5, 6, 8, 1, 2, True)
    assert len(r.input_ids) == 5  # 新 token 还没接上：append_host 是调用方的事
    r.append_host(torch.tensor([42], dtype=torch.int32))
    assert len(r.input_ids) == 6
    assert r.input_ids[-1] == 42
    assert r.input_ids.dtype == torch.int32
    r.complete_one()  # 第 1 步 decode
    assert lengths(r) == (6, 7, 8, 1, 1, True)
    r.append_host(torch.tensor([43], dtype=torch.int32))
    r.complete_one()  # 第 2 步 decode：一共 3 次前向，3 个 token
    assert lengths(r) == (7, 8, 8, 1, 0, False)


def test_task1_prefix_already_cached():
    r = make_req(prompt_len=6, output_len=2, cached_len=4)
    assert (r.extend_len, r.device_len) == (2, 6)


@pytest.mark.parametrize("bad", [dict(cached_len=5), dict(cached_len=-1), dict(prompt_len=0)])
def test_task1_invalid_req_is_refused(bad):
    with expect_error("ch1/req_lengths"):
        make_req(**bad)


def test_task1_input_ids_must_be_a_cpu_vector():
    with expect_error("ch1/req_input_ids"):
        Req(input_ids=torch.zeros(2, 3, dtype=torch.int32), table_idx=0, cached_len=0, output_len=1, uid=0,
            sampling_params=None, cache_handle=None)


def test_task1_batch_properties():
    reqs = [make_req(table_idx=i) for i in range(3)]
    b = Batch(reqs=reqs, phase="prefill")
    assert b.is_prefill
    assert not b.is_decode
    assert b.size == 3
    b.padded_reqs = reqs + [make_req(table_idx=9)]
    assert b.padded_size == 4
    assert len({*reqs, make_req(table_idx=0)}) == 4  # 按身份哈希：字段相同的两个请求也是两个


def test_task1_sampling_params_greedy():
    assert SamplingParams().is_greedy
    assert SamplingParams(temperature=0.7, top_k=1).is_greedy
    assert not SamplingParams(temperature=0.7).is_greedy
    assert not SamplingParams(temperature=0.0, top_p=0.9).is_greedy


def test_task2_context_batch_only_inside_forward():
    ctx = Context(page_size=1)
    with expect_error("ch1/batch_outside_forward"):
        ctx.batch
    b = ready_batch([make_req()])
    with ctx.forward_batch(b):
        assert ctx.batch is b
        with expect_error("ch1/nested_forward"):
            with ctx.forward_batch(b):
                pass
    with expect_error("ch1/batch_outside_forward"):
        ctx.batch


class Boom(Exception):
    """块里抛出的异常：测试自己的，forward_batch 要原样传出去。"""


def test_task2_context_is_reset_even_when_forward_fails():
    ctx = Context(page_size=1)
    with pytest.raises(Boom):
        with ctx.forward_batch(ready_batch([make_req()])):
            raise Boom()
    assert ctx._batch is None


def test_task2_global_context_is_set_once():
    core.reset_global_ctx()
    with expect_error("ch1/global_ctx_unset"):
        core.get_global_ctx()
    ctx = Context(page_size=4)
    core.set_global_ctx(ctx)
    try:
        assert core.get_global_ctx() is ctx
        with expect_error("ch1/global_ctx_twice"):
            core.set_global_ctx(Context(page_size=1))
    finally:
        core.reset_global_ctx()
