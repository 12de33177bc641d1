"""第 6 章：Engine 按顺序把前五章装起来；forward_batch 给每个请求下一个 token。

调用方（阶段二是调度器）这一边的活在下面的 Driver 里手工做：分页、写 page table、填 batch 的字段、
append_host。测试初始化顺序和属性、出错时的清理、同一进程里先后建两个 Engine、经由 Engine 的贪心结果
（4 个提示词一起跑 = 单独跑 = HF），以及凑批用的假请求（dummy_req）不影响真请求、KV 只写进假页。
"""

from __future__ import annotations

import dataclasses
import math
import os
from contextlib import contextmanager

import pytest
import torch

from minisgl.core import Batch, Req, SamplingParams, get_global_ctx
from minisgl.distributed import DistributedInfo, try_get_tp_info
from minisgl.engine import Engine, EngineConfig, ForwardOutput
from minisgl.utils import div_ceil
from tools.manifest import PROMPTS
from tests.harness.errors import expect_error
from tests.harness.reference import encode, hf_greedy

N = 16  # 每个请求生成的 token 数
MODEL = "qwen3-tied"


def make_engine(model, ps: int = 1, max_running_req: int = 4, num_pages: int | None = 256,
                max_seq_len: int | None = 256, device: str = "auto", cuda_graph_bs: list[int] | None = None,
                cuda_graph_max_bs: int | None = None) -> Engine:
    return Engine(EngineConfig(model_path=str(model), tp_info=DistributedInfo(0, 1), dtype=torch.float32,
                               max_running_req=max_running_req, attention_backend="auto", page_size=ps,
                               num_page_override=num_pages, max_seq_len_override=max_seq_len,
                               use_dummy_weight=False, cuda_graph_bs=cuda_graph_bs,
                               cuda_graph_max_bs=cuda_graph_max_bs, device=device))


@contextmanager
def engine_of(model, **kw):
    engine = make_engine(model, **kw)
    try:
        yield engine
    finally:
        engine.shutdown()


def assert_no_global_state() -> None:
    with expect_error("ch1/global_ctx_unset"):
        get_global_ctx()
    assert try_get_tp_info() is None


class Driver:
    """阶段二调度器的活，手工做。空闲页从尾部拿、几个请求交替增长，所以页是散落的。"""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.free_pages = list(range(engine.num_pages))

    def make_reqs(self, prompt_ids: list[list[int]], n: int) -> list[Req]:
        return [Req(input_ids=torch.tensor(ids, dtype=torch.int32), table_idx=i, cached_len=0, output_len=n,
                    uid=i, sampling_params=SamplingParams(max_tokens=n), cache_handle=None)
                for i, ids in enumerate(prompt_ids)]

    def allocate(self, req: Req) -> None:
        ps = self.engine.config.page_size
        for page_idx in range(div_ceil(req.cached_len, ps), div_ceil(req.device_len, ps)):
            page = self.free_pages.pop()
            self.engine.page_table[req.table_idx, page_idx * ps:(page_idx + 1) * ps] = \
                torch.arange(page * ps, (page + 1) * ps)

    def fill(self, reqs: list[Req], phase: str, extra: list[Req] = (), allocate: bool = True) -> Batch:
        """填好 batch 的字段；extra 是手工接在 padded_reqs 后面的假请求（GPU 上 pad_batch 做的事）。"""
        engine = self.engine
        batch = Batch(reqs=reqs, phase=phase)
        engine.graph_runner.pad_batch(batch)
        batch.padded_reqs = batch.padded_reqs + list(extra)
        if allocate:
            for r in reqs:
                self.allocate(r)
        padded = batch.padded_reqs
        batch.positions = torch.cat([torch.arange(r.cached_len, r.device_len) for r in padded]).int()
        batch.input_ids = torch.cat([r.input_ids[r.cached_len:r.device_len] for r in padded])
        batch.out_loc = torch.cat([engine.page_table[r.table_idx, r.cached_len:r.device_len] for r in padded])
        engine.attn_backend.prepare_metadata(batch)
        return batch

    def step(self, reqs: list[Req], phase: str) -> list[int]:
        """前向 + 采样；顺便检查引擎只做 complete_one，append_host 留给调用方。"""
        engine = self.engine
        batch = self.fill(reqs, phase)
        before = [(r.cached_len, r.device_len, r.max_device_len, len(r.input_ids)) for r in reqs]
        out = engine.forward_batch(batch, engine.sampler.prepare(batch))
        assert isinstance(out, ForwardOutput)
        for r, (_, dev, mx, n_ids) in zip(reqs, before):
            assert (r.cached_len, r.device_len, r.max_device_len) == (dev, dev + 1, mx), r
            assert len(r.input_ids) == n_ids, "append_host 是调用方的事，引擎不该动 input_ids"
        out.copy_done_event.synchronize()
        assert out.next_tokens_cpu.shape == (len(reqs),)
        assert out.next_tokens_cpu.device.type == "cpu"
        assert out.next_tokens_gpu.dtype == torch.int32
        assert out.next_tokens_gpu.device == engine.device
        assert out.next_tokens_cpu.tolist() == out.next_tokens_gpu.tolist()
        for i, r in enumerate(reqs):
            r.append_host(out.next_tokens_cpu[i:i + 1])
            assert len(r.input_ids) == r.device_len
        return out.next_tokens_cpu.tolist()

    def generate(self, reqs: list[Req], n: int) -> list[list[int]]:
        outs = [[t] for t in self.step(reqs, "prefill")]
        for _ in range(n - 1):
            for out, t in zip(outs, self.step(reqs, "decode")):
                out.append(t)
        return outs


def generate(engine: Engine, prompt_ids: list[list[int]], n: int) -> list[list[int]]:
    driver = Driver(engine)
    return driver.generate(driver.make_reqs(prompt_ids, n), n)


# ---------------------------------------------------------------- 任务 1：初始化


@pytest.mark.parametrize("device,rank,expected", [("auto", 0, "cuda:0"), ("auto", 1, "cuda:1"), ("cpu", 1, "cpu"),
                                                  ("cuda", 0, "cuda:0")])
def test_task1_rank_device(tiny_models, monkeypatch, device, rank, expected):
    """一台"看得到 GPU"的机器上（torch.cuda.is_available 换成 True，不碰真的 GPU）：auto、cuda 给 cuda:{rank}，
    cpu 给 CPU；没有 GPU 时 auto 给 CPU（下面那行）。"""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    config = EngineConfig(model_path=str(tiny_models[MODEL]), tp_info=DistributedInfo(rank, 2), dtype=torch.float32,
                          device=device)
    assert config.rank_device == torch.device(expected)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert dataclasses.replace(config, device="auto").rank_device == torch.device("cpu")


@pytest.mark.parametrize("ps", [1, 4, 64])
def test_task1_init_attributes(tiny_models, ps):
    """设备、后端、KV 池（多一页假页）、page table（多一行假请求，宽度对齐）、假请求、GraphRunner。"""
    num_pages, rows, msl = 40, 3, 70
    with engine_of(tiny_models[MODEL], ps=ps, max_running_req=rows, num_pages=num_pages, max_seq_len=msl) as e:
        assert e.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
        assert e.config.attention_backend == "torch"  # "auto" 在阶段一解析成 torch
        assert e.num_pages == num_pages
        assert tuple(e.kv_cache.k_cache(0).shape[:2]) == (num_pages + 1, ps)  # 最后一页是假页
        assert tuple(e.kv_cache.v_cache(2).shape[:2]) == (num_pages + 1, ps)
        assert e.max_seq_len == min(msl, num_pages * ps)
        pt = e.page_table
        assert pt.dtype == torch.int32
        assert pt.device == e.device
        assert pt.shape[0] == rows + 1
        width, align = pt.shape[1], math.lcm(32, ps)
        assert width % 32 == 0, width
        assert width % ps == 0, width
        assert e.max_seq_len <= width < e.max_seq_len + align, width
        dummy_slot = num_pages * ps  # 假页的第一个槽位
        assert (pt[rows] == dummy_slot).all()
        assert (pt[:rows] == 0).all()
        d = e.dummy_req
        assert (d.table_idx, d.cached_len, d.device_len, d.extend_len) == (rows, 0, 1, 1)
        assert e.page_table[d.table_idx, d.cached_len:d.device_len].tolist() == [dummy_slot]
        assert e.graph_runner.dummy_req is d
        if e.device.type == "cpu":  # CPU 上没有 CUDA 图（GPU 上录图见 test_graph.py）
            assert e.graph_runner.graph_bs_list == []
            assert e.graph_runner.max_graph_bs == 0
        ctx = get_global_ctx()
        assert ctx is e.ctx
        assert ctx.page_size == ps
        assert ctx.kv_cache is e.kv_cache
        assert ctx.page_table is e.page_table
        assert ctx.attn_backend is e.attn_backend
        assert e.sampler.vocab_size == 1024
    assert_no_global_state()


def test_task1_num_threads_set_by_engine_only_without_omp(tiny_models, monkeypatch):
    """CPU 上的 Engine 在没有 OMP_NUM_THREADS 时用上能用的所有核；用户设了就不动。device="cpu"：有 GPU 的机器上
    也测 CPU 上的引擎（GPU 上的引擎不管线程数）。"""
    cores = len(os.sched_getaffinity(0))
    old = torch.get_num_threads()
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        torch.set_num_threads(cores + 1)
        with engine_of(tiny_models[MODEL], num_pages=8, max_seq_len=8, device="cpu"):
            assert torch.get_num_threads() == cores
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        torch.set_num_threads(cores + 1)
        with engine_of(tiny_models[MODEL], num_pages=8, max_seq_len=8, device="cpu"):
            assert torch.get_num_threads() == cores + 1
    finally:
        torch.set_num_threads(old)


def test_task1_max_seq_len_beyond_model_is_refused(tiny_models):
    """超过 max_position_embeddings（小模型是 512）→ ValueError；全局状态清干净，之后还能建 Engine。"""
    model = tiny_models[MODEL]
    with expect_error("ch6/max_seq_len_beyond_model", limit=512):
        make_engine(model, max_seq_len=513)
    assert_no_global_state()
    with engine_of(model, num_pages=1024, max_seq_len=512) as e:
        assert e.max_seq_len == 512
        assert generate(e, [encode(model, PROMPTS[0])], 4) == [hf_greedy(str(model), PROMPTS[0], 4)[0]]
    assert_no_global_state()


def test_task1_missing_model_dir(tiny_models, tmp_path):
    """模型目录不存在：FileNotFoundError，说出路径和下载命令；之后还能建 Engine。"""
    missing = tmp_path / "no_such_model"
    with expect_error("ch3/model_dir_missing", path=missing):
        make_engine(missing)
    assert_no_global_state()
    with engine_of(tiny_models[MODEL], num_pages=8, max_seq_len=8) as e:
        assert e.num_pages == 8


def test_task1_large_weights_are_put_on_huge_pages(tmp_path):
    """CPU 上 _load_weight_state_dict 把每个张量交给 kernel.to_huge_pages：至少 2 MB 的那些从 2 MB 边界开始
    （拷进了大页），值和检查点一样；小的原样收下。"""
    from safetensors.torch import load_file
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from minisgl.kernel import huge_pages

    if not huge_pages._thp_enabled():
        pytest.skip("这台机器没有透明大页：to_huge_pages 原样返回")
    config = Qwen3Config(hidden_size=256, intermediate_size=1024, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=64, vocab_size=2048, max_position_embeddings=64,
                         tie_word_embeddings=True)  # 词嵌入和 gate_up 各 2 MB，其余不到 2 MB
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).save_pretrained(tmp_path)
    ckpt = load_file(tmp_path / "model.safetensors")
    with engine_of(tmp_path, num_pages=8, max_seq_len=8, device="cpu") as e:  # 大页是主存的事
        sd = e.model.state_dict()
        large = {k for k, v in sd.items() if v.nbytes >= huge_pages.HUGE_PAGE}
        assert large == {"model.embed_tokens.weight", "model.layers.0.mlp.gate_up_proj.weight"}
        off = [k for k in large if sd[k].data_ptr() % huge_pages.HUGE_PAGE]
        assert not off, (f"{off} 没放进大页：_load_weight_state_dict 里每个张量（转完 dtype）"
                         f"再过一遍 kernel.to_huge_pages")
        assert torch.equal(sd["model.embed_tokens.weight"], ckpt["model.embed_tokens.weight"])
        assert torch.equal(sd["model.layers.0.mlp.gate_up_proj.weight"],
                           torch.cat([ckpt["model.layers.0.mlp.gate_proj.weight"],
                                      ckpt["model.layers.0.mlp.up_proj.weight"]]))


def test_task1_two_engines_in_sequence(tiny_models):
    """shutdown 之后同一个进程里再建一个 Engine：两个都能用，结果相同（也和 HF 相同）。"""
    model = tiny_models[MODEL]
    ids = [encode(model, PROMPTS[0]), encode(model, PROMPTS[2])]
    first = make_engine(model)
    out1 = generate(first, ids, 8)
    first.shutdown()
    assert_no_global_state()
    second = make_engine(model)
    assert get_global_ctx() is second.ctx
    out2 = generate(second, ids, 8)
    second.shutdown()
    assert_no_global_state()
    assert out1 == out2 == [hf_greedy(str(model), PROMPTS[i], 8)[0] for i in (0, 2)]


# ---------------------------------------------------------------- 任务 2：经由 Engine 的贪心结果


@pytest.mark.parametrize("ps", [1, 4])
def test_task2_greedy_parity_batched_alone_and_hf(tiny_models, family, ps):
    """4 个提示词一个 batch、每个单独跑、HF 单独跑：逐 token 相同。"""
    model = tiny_models[family]
    ids = [encode(model, p) for p in PROMPTS]
    with engine_of(model, ps=ps) as e:
        together = generate(e, ids, N)
        alone = [generate(e, [x], N)[0] for x in ids]
    refs = [hf_greedy(str(model), p, N)[0] for p in PROMPTS]
    for p, t, a, r in zip(PROMPTS, together, alone, refs):
        assert t == r, f"{family} page_size={ps} {p[:30]!r}: batch 里 {t} != HF {r}"
        assert a == r, f"{family} page_size={ps} {p[:30]!r}: 单独跑 {a} != HF {r}"


def test_task2_req_lengths_after_each_forward(tiny_models):
    """三个长度字段：引擎 complete_one，调用方 append_host；生成 n 个 token 之后正好不能再 decode。"""
    model, n = tiny_models[MODEL], 4
    with engine_of(model, ps=4) as e:
        driver = Driver(e)
        [r] = driver.make_reqs([encode(model, PROMPTS[1])], n)
        L = r.device_len
        assert (r.cached_len, r.device_len, r.max_device_len) == (0, L, L + n)
        driver.step([r], "prefill")
        assert (r.cached_len, r.device_len, r.max_device_len, len(r.input_ids)) == (L, L + 1, L + n, L + 1)
        for i in range(1, n):
            assert r.extend_len == 1
            assert r.can_decode
            driver.step([r], "decode")
            assert (r.cached_len, r.device_len, r.max_device_len) == (L + i, L + i + 1, L + n)
        assert not r.can_decode
        assert r.remain_len == 0
        assert r.input_ids[L:].tolist() == hf_greedy(str(model), PROMPTS[1], n)[0]


# ---------------------------------------------------------------- 任务 3：凑批的假请求


@pytest.mark.parametrize("ps", [1, 4])
def test_task3_pad_batch_and_dummy_req(tiny_models, ps):
    """图关着时 pad_batch 不补；手工补上假请求（GPU 上 pad_batch 做的事）：真请求的 logits 不变，
    假请求的 KV 只写进假页，引擎也不对假请求 complete_one、不为它采样。"""
    model = tiny_models[MODEL]
    with engine_of(model, ps=ps, max_running_req=4, num_pages=64, device="cpu") as e:
        driver = Driver(e)
        reqs = driver.make_reqs([encode(model, PROMPTS[0]), encode(model, PROMPTS[2])], 4)
        b = Batch(reqs=reqs, phase="decode")
        e.graph_runner.pad_batch(b)
        assert b.padded_reqs == reqs
        assert b.padded_size == 2
        assert not e.graph_runner.can_use_cuda_graph(b)

        driver.step(reqs, "prefill")
        plain = driver.fill(reqs, "decode")
        with e.ctx.forward_batch(plain):
            logits_plain = e.model.forward()
        assert logits_plain.shape == (2, 1024)

        kv, dummy_page, dummy_slot = e.kv_cache, e.num_pages, e.num_pages * ps
        layers = kv.num_layers
        for layer in range(layers):  # 假页先涂成 NaN，才看得出它被写了什么
            kv.k_cache(layer)[dummy_page].fill_(float("nan"))
            kv.v_cache(layer)[dummy_page].fill_(float("nan"))
        before = [(kv.k_cache(i).clone(), kv.v_cache(i).clone()) for i in range(layers)]

        padded = driver.fill(reqs, "decode", extra=[e.dummy_req] * 2, allocate=False)
        assert padded.size == 2
        assert padded.padded_size == 4
        assert padded.out_loc[2:].tolist() == [dummy_slot] * 2
        with e.ctx.forward_batch(padded):
            logits_padded = e.model.forward()
        assert logits_padded.shape == (4, 1024)
        torch.testing.assert_close(logits_padded[:2], logits_plain, atol=1e-5, rtol=1e-5)

        real_slots = set(plain.out_loc.tolist())
        for layer, old_pair in enumerate(before):
            for now, old in zip((kv.k_cache(layer), kv.v_cache(layer)), old_pair):
                now, old = now.flatten(0, 1).flatten(1), old.flatten(0, 1).flatten(1)  # (槽位, H·D)
                same = ((now == old) | (now.isnan() & old.isnan())).all(dim=1)
                changed = set(torch.nonzero(~same).flatten().tolist())
                assert changed - real_slots == {dummy_slot}, f"层 {layer}：写了假页以外的槽位 {changed}"
                assert now[dummy_slot].isfinite().all()
                assert now[dummy_slot + 1:].isnan().all()  # 假页的其余槽位没人碰
                idx = sorted(real_slots)
                torch.testing.assert_close(now[idx], old[idx], atol=1e-5, rtol=1e-5)

        padded = driver.fill(reqs, "decode", extra=[e.dummy_req] * 2, allocate=False)
        lens = [(r.cached_len, r.device_len) for r in reqs]
        out = e.forward_batch(padded, e.sampler.prepare(padded))
        assert out.next_tokens_cpu.tolist() == logits_plain.argmax(dim=-1).tolist()
        assert [(r.cached_len, r.device_len) for r in reqs] == [(c + 1, d + 1) for c, d in lens]
        assert (e.dummy_req.cached_len, e.dummy_req.device_len) == (0, 1)
