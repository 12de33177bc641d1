"""第 1 章起：错的输入和错的用法都要被拒绝，报错说出是哪个字段、哪个上限。

采样参数越界、页大小不是正整数。（嵌套的 forward_batch 见 test_core.py；建 batch 时的检查见 test_generate_input.py。）
"""

import math

import pytest

from minisgl.core import Context, SamplingParams
from tests.harness.errors import expect_error


@pytest.mark.parametrize("field, value", [
    ("temperature", -0.1), ("temperature", math.nan), ("temperature", math.inf), ("temperature", "0.5"),
    ("top_k", 0), ("top_k", -2), ("top_k", 2.0),
    ("top_p", -0.01), ("top_p", 1.01), ("top_p", math.nan),
    ("max_tokens", 0), ("max_tokens", -3), ("max_tokens", 4.0),
])
def test_sampling_params_out_of_range(field, value):
    with expect_error("ch1/sampling_param", field=field, value=repr(value)):
        SamplingParams(**{field: value})


@pytest.mark.parametrize("kw", [dict(temperature=0.0), dict(temperature=2.5, top_k=1), dict(top_k=-1, top_p=0.0),
                                dict(top_p=1.0, max_tokens=1), dict(temperature=1, top_k=50, top_p=0.9)])
def test_sampling_params_in_range_accepted(kw):
    SamplingParams(**kw)


@pytest.mark.parametrize("bad_size", [0, -4, 1.5, "4", True])
def test_context_page_size_must_be_a_positive_int(bad_size):
    with expect_error("ch1/context_page_size", value=repr(bad_size)):
        Context(page_size=bad_size)
