"""第 5 章起：不认识的后端名字、没有 GPU 却要 GPU 后端，在校验名字时（引擎的配置阶段）就报错，说出是哪个名字。
没调用 prepare_metadata 就前向的 batch 由 Engine 拒绝（第 6 章的测试）。"""

import pytest
import torch

from minisgl.attention import SUPPORTED_ATTENTION_BACKENDS, create_attention_backend, validate_attn_backend
from minisgl.core import Batch, Context, Req, reset_global_ctx, set_global_ctx
from minisgl.distributed import reset_tp_info, set_tp_info
from minisgl.kvcache import create_kvcache_pool
from minisgl.models import ModelConfig, RotaryConfig
from tests.harness.errors import expect_error


def make_config():
    return ModelConfig(num_layers=1, num_qo_heads=4, num_kv_heads=2, head_dim=8, hidden_size=32, vocab_size=32,
                       intermediate_size=16, rms_norm_eps=1e-6, rotary_config=RotaryConfig(8, 8, 64, 1e4, None),
                       hidden_act="silu", tie_word_embeddings=False, model_type="qwen3",
                       architectures=["Qwen3ForCausalLM"])


@pytest.fixture
def ctx():
    reset_global_ctx()
    reset_tp_info()
    set_tp_info(0, 1)
    ctx = Context(page_size=1)
    set_global_ctx(ctx)
    ctx.kv_cache = create_kvcache_pool(make_config(), 16, 1, torch.float32, torch.device("cpu"))
    ctx.page_table = torch.arange(32, dtype=torch.int32).view(2, 16) % 16
    ctx.attn_backend = create_attention_backend("torch", make_config())
    try:
        yield ctx
    finally:
        reset_global_ctx()
        reset_tp_info()


def filled(ctx, n=3):
    r = Req(input_ids=torch.zeros(n, dtype=torch.int32), table_idx=0, cached_len=0, output_len=1, uid=4,
            sampling_params=None, cache_handle=None)
    b = Batch(reqs=[r], phase="prefill")
    b.padded_reqs = [r]
    b.input_ids = torch.zeros(n, dtype=torch.int32)
    b.positions = torch.arange(n, dtype=torch.int32)
    b.out_loc = ctx.page_table[0, :n].clone()
    return b


def test_nested_forward_is_refused(ctx):
    b = filled(ctx)
    ctx.attn_backend.prepare_metadata(b)
    with ctx.forward_batch(b):
        with expect_error("ch1/nested_forward"):
            with ctx.forward_batch(b):
                pass
        assert ctx.batch is b  # 被拒绝的内层没有把外层的 batch 清掉


@pytest.mark.parametrize("name", ["flash", "torch,fi,fa", "Torch", ""])
def test_unknown_backend_name_lists_choices(name):
    assert set(SUPPORTED_ATTENTION_BACKENDS) == {"torch", "fi", "fa"}
    with expect_error("ch5/unknown_backend", name=repr(name)):
        validate_attn_backend(name)


@pytest.mark.parametrize("name, culprit", [("fi", "fi"), ("fa", "fa"), ("torch,fi", "fi"), ("fa,torch", "fa")])
def test_gpu_backend_without_gpu_is_refused_by_validation(monkeypatch, name, culprit):
    """假装这台机器没有 GPU（有 GPU 的机器上也一样测）：名字校验就报错，说出是哪个后端、要 GPU、改用 'torch'。"""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with expect_error("ch5/gpu_backend_without_gpu", backend=repr(culprit)):
        validate_attn_backend(name)


def test_cpu_backends_validate_without_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for name in ("auto", "torch", "torch,torch"):
        assert validate_attn_backend(name) == name
