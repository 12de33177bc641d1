"""第 1 章起：错的输入和错的用法都要被拒绝，报错说出是哪个字段、哪个请求、哪个上限。

采样参数越界、页大小不是正整数、字段没填好的 batch、前向前被改坏的请求、token id 超出词表。
（嵌套的 forward_batch 见 test_core.py。）第 4、5 章加上的检查（槽位、page table、注意力元数据）在那两章的测试里。
"""

import math

import pytest
import torch

from minisgl.core import Context, Req, SamplingParams, check_token_ids
from tests.ch1.common import ready_batch


def make_req(prompt_len=5, cached_len=0, uid=0):
    return Req(input_ids=torch.arange(prompt_len, dtype=torch.int32), table_idx=uid, cached_len=cached_len,
               output_len=3, uid=uid, sampling_params=SamplingParams(), cache_handle=None)



@pytest.mark.parametrize("field, value", [
    ("temperature", -0.1), ("temperature", math.nan), ("temperature", math.inf), ("temperature", "0.5"),
    ("top_k", 0), ("top_k", -2), ("top_k", 2.0),
    ("top_p", -0.01), ("top_p", 1.01), ("top_p", math.nan),
    ("max_tokens", 0), ("max_tokens", -3), ("max_tokens", 4.0),
])
def test_sampling_params_out_of_range(field, value):
    with pytest.raises(ValueError) as e:
        SamplingParams(**{field: value})
    msg = str(e.value)
    assert f"SamplingParams.{field}" in msg and repr(value) in msg, msg


@pytest.mark.parametrize("kw", [dict(temperature=0.0), dict(temperature=2.5, top_k=1), dict(top_k=-1, top_p=0.0),
                                dict(top_p=1.0, max_tokens=1), dict(temperature=1, top_k=50, top_p=0.9)])
def test_sampling_params_in_range_accepted(kw):
    SamplingParams(**kw)


@pytest.mark.parametrize("bad_size", [0, -4, 1.5, "4", True])
def test_context_page_size_must_be_a_positive_int(bad_size):
    with pytest.raises(ValueError) as e:
        Context(page_size=bad_size)
    assert "page_size" in str(e.value) and repr(bad_size) in str(e.value)


@pytest.mark.parametrize("unset", ["input_ids", "positions", "padded_reqs"])
def test_batch_forwarded_before_fields_are_filled(unset):
    ctx = Context(page_size=1)
    b = ready_batch([make_req()])
    delattr(b, unset)
    with pytest.raises(RuntimeError) as e:
        with ctx.forward_batch(b):
            pytest.fail("前向不该开始")
    assert f"batch.{unset}" in str(e.value)
    assert ctx._batch is None  # 没进去，也就不用退出


def test_cached_len_broken_after_construction():
    """Req 构造时查过长度；之后被改坏（cached_len 追上 device_len）的请求在前向前被拒绝，说出是哪个请求。"""
    ctx = Context(page_size=1)
    good, bad = make_req(uid=0), make_req(uid=7)
    b = ready_batch([good, bad])
    bad.cached_len = bad.device_len
    with pytest.raises(ValueError) as e:
        with ctx.forward_batch(b):
            pass
    assert "uid=7" in str(e.value) and "cached_len" in str(e.value)


@pytest.mark.parametrize("field", ["input_ids", "positions"])
def test_batch_length_disagrees_with_reqs(field):
    ctx = Context(page_size=1)
    b = ready_batch([make_req(5), make_req(3, cached_len=1, uid=1)])
    setattr(b, field, getattr(b, field)[:-1])
    with pytest.raises(ValueError) as e:
        with ctx.forward_batch(b):
            pass
    assert f"batch.{field}" in str(e.value) and "7" in str(e.value)  # 说出应有的 extend_len 之和


@pytest.mark.parametrize("ids", [[1, 2, 50], [-1, 3], [1000]])
def test_token_ids_outside_vocab(ids):
    with pytest.raises(ValueError) as e:
        check_token_ids(torch.tensor(ids, dtype=torch.int32), 50)
    msg = str(e.value)
    assert "vocab_size=50" in msg and f"[{min(ids)}, {max(ids)}]" in msg, msg


def test_token_ids_inside_vocab_pass():
    check_token_ids(torch.tensor([0, 49], dtype=torch.int32), 50)
    check_token_ids(torch.tensor([], dtype=torch.int32), 50)
