"""第 6 章：引擎的配置、模型目录和送进 forward_batch 的 batch，错了都在最早的地方报错并说出是哪个。

配置错误在 EngineConfig 构造时就报（不读任何文件：这里的 model_path 根本不存在）；注意力后端的名字和官方一样
只在建后端时查一次（create_attention_backend）；模型目录的错误在读权重之前；
batch 的错误在前向之前（请求的长度不会被推进，引擎之后照常可用）。最后是采样器的性质测试。
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minisgl.core import Batch, Req, SamplingParams, get_global_ctx
from minisgl.distributed import DistributedInfo, try_get_tp_info
from minisgl.engine import Engine, EngineConfig, Sampler
from minisgl.engine import engine as engine_module
from tests.harness.batch import make_req as new_req  # make_req 在这里多一步：先在 page table 里给它写好槽位
from tests.harness.errors import expect_error

MODEL = "qwen3-tied"  # 词表 1024，max_position_embeddings 512
NOWHERE = "/nonexistent/model"


def config(model_path=NOWHERE, **kw):
    kw = {"max_running_req": 4, "num_page_override": 64, "max_seq_len_override": 64, **kw}
    return EngineConfig(model_path=str(model_path), tp_info=DistributedInfo(0, 1), dtype=torch.float32, **kw)


def assert_no_global_state():
    with expect_error("ch1/global_ctx_unset"):
        get_global_ctx()
    assert try_get_tp_info() is None


# ---------------------------------------------------------------- EngineConfig：构造时就拒绝

@pytest.mark.parametrize("field, value", [
    ("page_size", 0), ("page_size", -16), ("page_size", 2.5), ("page_size", "4"), ("page_size", True),
    ("max_running_req", 0), ("num_page_override", 0), ("max_seq_len_override", -1),
])
def test_config_sizes_must_be_positive_ints(field, value):
    with expect_error("ch6/config_sizes", field=field, value=repr(value)):
        config(**{field: value})


def test_config_pool_too_small_for_max_running_req():
    with expect_error("ch6/config_pool_too_small", pages=5, reqs=8):
        config(max_running_req=8, num_page_override=5)


@pytest.mark.parametrize("ratio", [0.0, 1.5, -0.1])
def test_config_memory_ratio(ratio):
    with expect_error("ch6/config_memory_ratio"):
        config(memory_ratio=ratio)


@pytest.mark.parametrize("name", ["flash", "torch,nope", "a,b,c"])
def test_engine_unknown_attention_backend(tiny_models, name):
    with expect_error("ch5/unknown_backend", name=repr(name)):
        Engine(config(tiny_models[MODEL], attention_backend=name))
    assert_no_global_state()


@pytest.mark.parametrize("name", ["fi", "fa", "fa,fi"])
def test_engine_gpu_backend_without_gpu(monkeypatch, tiny_models, name):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with expect_error("ch5/gpu_backend_without_gpu", backend=repr(name.split(",")[0])):
        Engine(config(tiny_models[MODEL], attention_backend=name))
    assert_no_global_state()


@pytest.mark.parametrize("device", ["gpu", "cuda:0", ""] + ([] if torch.cuda.is_available() else ["cuda"]))
def test_config_device(device):
    """device 只认三个名字；没有 GPU 时 'cuda' 也在构造时就拒绝，而不是建到一半在 torch 里出错。"""
    with expect_error("ch6/config_device", value=repr(device)):
        config(device=device)


@pytest.mark.parametrize("timeout", [0, -1.0, float("nan")])
def test_config_distributed_timeout_must_be_positive(timeout):
    with expect_error("ch6/config_distributed_timeout"):
        config(distributed_timeout=timeout)


def test_task1_page_larger_than_max_seq_len_is_refused(tiny_models):
    """一页 128 个槽位、一个请求最多 64 个位置：多出来的槽位谁也用不上，在建 KV 池之前就拒绝。"""
    with expect_error("ch6/page_larger_than_max_seq_len", page_size=128, max_seq_len=64):
        Engine(config(tiny_models[MODEL], page_size=128))
    assert_no_global_state()


def test_pool_estimated_too_small_for_max_running_req(tiny_models, monkeypatch):
    """不给 num_page_override、按可用内存估算出来的页比 max_running_req 还少：说出 max_running_req。
    可用内存只经 available_memory(device) 问（页面点了名的接缝），测试替换的就是它。"""
    monkeypatch.setattr(engine_module, "available_memory", lambda device: 4096)
    with expect_error("ch6/pool_estimated_too_small", running=64):
        Engine(config(tiny_models[MODEL], max_running_req=64, num_page_override=None))
    assert_no_global_state()


# ---------------------------------------------------------------- 模型目录：读权重之前就拒绝

def broken_model(tiny_models, tmp_path, case):
    """弄坏模型目录，返回 (给 Engine 的路径, 报错清单里的哪一条, 回显)。"""
    path = shutil.copytree(tiny_models[MODEL], tmp_path / "m")
    cfg = json.loads((path / "config.json").read_text())
    if case == "not_a_dir":
        return path / "model.safetensors", "ch3/model_path_is_a_file", dict(path=path / "model.safetensors")
    if case == "no_config":
        (path / "config.json").unlink()
        return path, "ch3/no_config_json", dict(path=path)
    if case == "architecture":
        cfg["architectures"] = ["MixtralForCausalLM"]
    if case == "missing_field":
        del cfg["num_hidden_layers"]
    (path / "config.json").write_text(json.dumps(cfg))
    if case == "architecture":
        return path, "ch3/config_unsupported_architecture", dict(file=path / "config.json", arch="MixtralForCausalLM")
    return path, "ch3/missing_field", dict(file=path / "config.json", field="num_hidden_layers")


@pytest.mark.parametrize("case", ["not_a_dir", "no_config", "architecture", "missing_field"])
def test_engine_refuses_bad_model_dir(tiny_models, tmp_path, case):
    path, case_id, values = broken_model(tiny_models, tmp_path, case)
    with expect_error(case_id, **values):
        Engine(config(path))
    assert_no_global_state()


# ---------------------------------------------------------------- forward_batch：错的 batch 在前向之前被拒绝

@pytest.fixture
def engine(tiny_models):
    e = Engine(config(tiny_models[MODEL]))
    try:
        yield e
    finally:
        e.shutdown()


def make_req(engine, ids, row, uid):
    """给 row 这一行写好连续的槽位，返回一个还没 prefill 的请求。"""
    n = len(ids)
    engine.page_table[row, :min(n, engine.page_table.shape[1])] = torch.arange(row * 16, row * 16 + n)[:64]
    return new_req(n, 0, row, uid, ids, output_len=2, sampling_params=SamplingParams())


def fill(engine, reqs, prepare=True, phase="prefill"):
    """phase 在 pad_batch 和 prepare_metadata 之前定好：GPU 上 decode 的 batch 重放 CUDA 图，补齐的大小和
    decode 才有的元数据都按 phase 准备。"""
    batch = Batch(reqs=reqs, phase=phase)
    engine.graph_runner.pad_batch(batch)
    batch.input_ids = torch.cat([r.input_ids[r.cached_len:r.device_len] for r in reqs])
    batch.positions = torch.cat([torch.arange(r.cached_len, r.device_len, dtype=torch.int32) for r in reqs])
    width = engine.page_table.shape[1]
    batch.out_loc = torch.cat([engine.page_table[r.table_idx, r.cached_len:min(r.device_len, width)] for r in reqs])
    if prepare:
        engine.attn_backend.prepare_metadata(batch)
    return batch


def refused(engine, batch, case_id, **values):
    before = [(r.cached_len, r.device_len) for r in batch.reqs]
    with expect_error(case_id, **values):
        engine.forward_batch(batch, engine.sampler.prepare(batch))
    assert [(r.cached_len, r.device_len) for r in batch.reqs] == before, "被拒绝的 batch 不该推进请求"
    assert engine.ctx._batch is None
    ok = fill(engine, [make_req(engine, [1, 2, 3], 3, uid=99)])  # 之后引擎照常可用
    assert engine.forward_batch(ok, engine.sampler.prepare(ok)).next_tokens_cpu.shape == (1,)


def test_request_longer_than_max_seq_len(engine):
    """引擎的 max_seq_len 是 64（page table 一行 64 个位置）：65 个 token 的请求被拒绝，而不是被截断。"""
    assert engine.max_seq_len == 64 == engine.page_table.shape[1]
    batch = fill(engine, [make_req(engine, list(range(65)), 1, uid=7)], prepare=False)
    batch.out_loc = torch.arange(65, dtype=torch.int32)
    batch.attn_metadata = None  # 到不了元数据那一步
    refused(engine, batch, "ch6/batch_too_long", uid=7, device_len=65, max_seq_len=64)


def test_cached_len_not_below_device_len(engine):
    req = make_req(engine, [5, 6, 7], 0, uid=3)
    batch = fill(engine, [req])
    req.cached_len = 3
    refused(engine, batch, "ch6/batch_cached_len", uid=3)


def test_table_row_outside_the_page_table(engine):
    req = make_req(engine, [5, 6, 7], 0, uid=2)
    batch = fill(engine, [req])
    req.table_idx = engine.page_table.shape[0]
    refused(engine, batch, "ch6/batch_table_idx", uid=2)


def test_request_longer_than_max_seq_len_but_inside_the_row(tiny_models):
    """max_seq_len=50 时 page table 一行对齐到 64：第 51 个位置也要拒绝，不能放到行宽才拒。"""
    e = Engine(config(tiny_models[MODEL], max_seq_len_override=50))
    try:
        assert e.max_seq_len == 50
        assert e.page_table.shape[1] == 64
        refused(e, fill(e, [make_req(e, list(range(51)), 1, uid=7)]), "ch6/batch_too_long", uid=7, device_len=51,
                max_seq_len=50)
    finally:
        e.shutdown()


def test_prefill_labelled_decode(engine):
    batch = fill(engine, [make_req(engine, [5, 6, 7], 0, uid=3)])
    batch.phase = "decode"
    refused(engine, batch, "ch6/batch_decode_extend", uid=3, n=3)


@pytest.mark.parametrize("phase", ["Prefill", "extend", ""])
def test_unknown_phase(engine, phase):
    batch = fill(engine, [make_req(engine, [5, 6, 7], 0, uid=0)])
    batch.phase = phase
    refused(engine, batch, "ch6/batch_phase", phase=repr(phase))


def test_two_reqs_on_one_table_row(engine):
    batch = fill(engine, [make_req(engine, [5, 6, 7], 2, uid=0), make_req(engine, [8, 9], 2, uid=1)])
    refused(engine, batch, "ch6/batch_shared_row", uid=1, row=2)


def test_finished_req_is_not_forwarded_again(engine):
    """output_len=2：prefill 和一次 decode 之后它就生成完了；再送进来会多写一个位置的 KV、多采一个 token。"""
    req = make_req(engine, [5, 6, 7], 0, uid=4)
    for phase in ("prefill", "decode"):
        batch = fill(engine, [req], phase=phase)
        out = engine.forward_batch(batch, engine.sampler.prepare(batch))
        out.copy_done_event.synchronize()
        req.append_host(out.next_tokens_cpu[:1])
        engine.page_table[0, req.cached_len:req.device_len] = 40 + req.cached_len
    batch = fill(engine, [req], phase="decode")
    refused(engine, batch, "ch6/batch_finished_req", uid=4)


def test_padded_reqs_must_start_with_reqs(engine):
    a, b = make_req(engine, [5, 6, 7], 0, uid=0), make_req(engine, [8, 9], 1, uid=1)
    batch = fill(engine, [a, b])
    batch.padded_reqs = [b, a]
    refused(engine, batch, "ch6/batch_padded_reqs")


def test_batch_forwarded_before_metadata(engine):
    batch = fill(engine, [make_req(engine, [5, 6, 7], 0, uid=0)], prepare=False)
    refused(engine, batch, "ch6/batch_not_filled")


def test_nested_forward(engine):
    outer = fill(engine, [make_req(engine, [5, 6, 7], 0, uid=0)])
    inner = fill(engine, [make_req(engine, [8, 9], 1, uid=1)])
    with engine.ctx.forward_batch(outer):
        with expect_error("ch1/nested_forward"):
            engine.forward_batch(inner, engine.sampler.prepare(inner))
    assert (inner.reqs[0].cached_len, inner.reqs[0].device_len) == (0, 2)


@pytest.mark.parametrize("bad", [1024, -1])
def test_token_id_outside_the_vocab_in_a_hand_filled_batch(engine, bad):
    """手工填的 batch（像里程碑的规格脚本那样）里有词表外的 id：前向之前拒绝，说出请求和 id，
    而不是嵌入层的一句 IndexError（GPU 上是设备端断言）。只读主存里的 req.input_ids，不同步。"""
    batch = fill(engine, [make_req(engine, [5, bad, 7], 0, uid=5)])
    refused(engine, batch, "ch6/batch_token_outside_vocab", uid=5, id=bad, vocab_size=1024)


def test_pool_without_override_is_bounded_by_the_requests(tiny_models):
    """不给 num_page_override：页数不超过 max_running_req 条满长序列用得到的（4 × 64 / 4 = 64 页），
    而不是可用内存的 90%（CPU 上那会清零一大块主存）。"""
    e = Engine(config(tiny_models[MODEL], num_page_override=None, page_size=4))
    try:
        assert e.num_pages == 4 * 64 // 4
    finally:
        e.shutdown()


# ---------------------------------------------------------------- 性质测试：采样器只在允许的集合里抽

@st.composite
def sampling_cases(draw):
    vocab = draw(st.integers(2, 40))
    rows = []
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["greedy", "top_k_1", "t0_top_p", "sample"]))
        t = draw(st.floats(0.05, 3.0))
        k = draw(st.sampled_from([-1, *range(1, vocab + 1)]))
        p = draw(st.sampled_from([1.0, draw(st.floats(0.0, 1.0))]))
        rows.append({"greedy": SamplingParams(), "top_k_1": SamplingParams(temperature=t, top_k=1, top_p=p),
                     "t0_top_p": SamplingParams(temperature=0.0, top_p=min(p, 0.9)),
                     "sample": SamplingParams(temperature=t, top_k=k, top_p=p)}[kind])
    return vocab, rows, draw(st.floats(0.5, 8.0)), draw(st.integers(0, 2**31 - 1))


def allowed(logits: torch.Tensor, sp: SamplingParams) -> set[int]:
    """从头算（float64）：贪心 / top_k=1 / T=0 只有 argmax；否则先按温度 softmax，留前 k 个，重新归一化后留
    排在前面的概率和还没达到 p 的那些（第一名永远留）。p 的边界放宽 1e-6，免得舍入说了算。"""
    order = logits.double().argsort(descending=True).tolist()
    if sp.is_greedy or sp.temperature == 0.0:
        return {order[0]}
    probs = torch.softmax(logits.double() / sp.temperature, -1)
    keep = order[:len(order) if sp.top_k == -1 else sp.top_k]
    mass = sum(probs[i].item() for i in keep)
    out, before = set(), 0.0
    for i in keep:
        if out and before >= sp.top_p + 1e-6:
            break
        out.add(i)
        before += probs[i].item() / mass
    return out


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(case=sampling_cases())
def test_sampled_tokens_stay_in_the_allowed_set(case):
    vocab, params, scale, seed = case
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(params), vocab, generator=g) * scale
    repeat = 50  # 每个请求复制 50 份放进同一个 batch：一次抽 50 个样本
    reqs = [Req(input_ids=torch.tensor([0], dtype=torch.int32), table_idx=i, cached_len=0, output_len=1, uid=i,
                sampling_params=sp, cache_handle=None) for i, sp in enumerate(params) for _ in range(repeat)]
    sampler = Sampler(torch.device("cpu"), vocab)
    torch.manual_seed(seed)
    tokens = sampler.sample(logits.repeat_interleave(repeat, 0), sampler.prepare(Batch(reqs=reqs, phase="decode")))
    assert tokens.shape == (len(reqs),)
    for i, sp in enumerate(params):
        got = set(tokens[i * repeat:(i + 1) * repeat].tolist())
        ok = allowed(logits[i], sp)
        assert got <= ok, f"请求 {i}（{sp}）抽到了 {sorted(got - ok)}，允许的只有 {sorted(ok)}"
        if len(ok) == 1:
            assert ok == {int(logits[i].argmax())}
            assert got == ok
