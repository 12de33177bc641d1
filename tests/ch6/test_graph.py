"""第 6 章任务 3：decode 的 CUDA 图。在 cuda 上（模拟的 CUDA 每台机器都有，有真 GPU 时真的也跑一遍）。

模拟的 CUDA 图（tests/harness/cuda_emu/graph.py）和真的一样：录下设备上的每个算子，重放时在同一批张量上重算，
录图那一刻从 Python 读进来的数冻住不变；录图时读回主存直接报错。所以图开着和关着的 token 必须逐个相同，
哪里在录图时读了这一步才有的数，这里就会错。
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from minisgl.core import Batch
from tests.ch6.test_cuda import FORWARD_HOST_SYNCS, drive
from tests.ch6.test_engine import Driver, engine_of
from tests.harness.errors import expect_error
from tests.harness.reference import encode
from tools.manifest import PROMPTS

N = 16
MODEL = "qwen3-tied"
GRAPH_BS = [1, 2, 4, 8]


@pytest.fixture
def replays(monkeypatch):
    """数 CUDAGraph.replay 被调了几次（真的和模拟的 CUDAGraph 都是 torch.cuda.CUDAGraph 这个类）。"""
    count = [0]
    real = torch.cuda.CUDAGraph.replay

    def replay(self, *args, **kwargs):
        count[0] += 1
        return real(self, *args, **kwargs)

    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", replay)
    return count


def prompts(bs: int, model) -> list[list[int]]:
    return [encode(model, PROMPTS[i % len(PROMPTS)]) for i in range(bs)]


@pytest.mark.parametrize("ps", [1, 4])
def test_task3_graphs_on_equal_graphs_off(tiny_models, gpu, replays, ps):
    """同一个引擎上先后跑 bs 1、3（补到 4）、8、再 3，每次 16 步：decode 重放图，token 和图关着的引擎逐个相同，
    logits 在 1e-4 以内。batch 大小变了，重放的图跟着换。"""
    model = tiny_models[MODEL]
    sizes = [1, 3, 8, 3]
    with engine_of(model, ps=ps, max_running_req=8, num_pages=512, device=gpu.device, cuda_graph_bs=[]) as e:
        assert e.graph_runner.max_graph_bs == 0
        off = [drive(e, prompts(bs, model), N) for bs in sizes]
    assert replays[0] == 0, "图关着时不该重放"
    with engine_of(model, ps=ps, max_running_req=8, num_pages=512, device=gpu.device, cuda_graph_bs=GRAPH_BS) as e:
        assert e.graph_runner.graph_bs_list == GRAPH_BS
        assert sorted(e.graph_runner.graph_map) == GRAPH_BS
        on = [drive(e, prompts(bs, model), N) for bs in sizes]
    assert replays[0] == len(sizes) * (N - 1), f"[{gpu.kind}] 每个 decode 步都该重放一次图，实际 {replays[0]} 次"
    for bs, (t_off, lg_off, pad_off), (t_on, lg_on, pad_on) in zip(sizes, off, on):
        assert pad_off == [bs] * N
        assert pad_on == [bs] + [next(g for g in GRAPH_BS if g >= bs)] * (N - 1), "decode 补齐到第一个装得下的图"
        assert t_on == t_off, f"[{gpu.kind}] bs={bs} page_size={ps}：图开着 {t_on} != 关着 {t_off}"
        for step, (a, b) in enumerate(zip(lg_on, lg_off)):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4, msg=lambda m, s=step: f"bs={bs} 第 {s} 步：{m}")


def test_task3_no_host_sync_in_the_graph(tiny_models, gpu):
    """录图的区域里一次读回主存也没有（有的话录图时 CUDA 就报错，引擎建不起来）；重放的 decode 一步
    forward_batch 仍然只读回 token 那一次。"""
    model = tiny_models[MODEL]
    with engine_of(model, ps=4, device=gpu.device, cuda_graph_bs=[1, 2, 4]) as e:
        driver = Driver(e)
        reqs = driver.make_reqs(prompts(3, model), 4)
        for phase in ["prefill", "decode", "decode"]:
            batch = driver.fill(reqs, phase)
            args = e.sampler.prepare(batch)
            start = len(gpu.syncs)
            out = e.forward_batch(batch, args)
            syncs = gpu.syncs.since(start)
            assert len(syncs) <= FORWARD_HOST_SYNCS, f"[{gpu.kind}] {phase}：读回主存 {len(syncs)} 次：{syncs}"
            out.copy_done_event.synchronize()
            for i, r in enumerate(reqs):
                r.append_host(out.next_tokens_cpu[i:i + 1])


def test_task3_replay_reads_this_steps_metadata(tiny_models, gpu):
    """图里的注意力读的是静态缓冲：重放前不调 prepare_for_replay，图就用录图时的槽位和掩码，logits 不对。
    （这条说明模拟的图真的冻住了录图时的数，而不是每次重新跑 Python。）"""
    model = tiny_models[MODEL]
    ids = prompts(2, model)
    with engine_of(model, ps=1, device=gpu.device, cuda_graph_bs=[]) as e:
        _, good, _ = drive(e, ids, 4)
    with engine_of(model, ps=1, device=gpu.device, cuda_graph_bs=[2]) as e:
        e.attn_backend.prepare_for_replay = lambda batch: None
        _, stale, _ = drive(e, ids, 4)
    torch.testing.assert_close(stale[0], good[0], atol=1e-4, rtol=1e-4)  # prefill 不走图
    assert max((a - b).abs().max().item() for a, b in zip(stale[1:], good[1:])) > 1e-2, \
        f"[{gpu.kind}] 没更新元数据的重放给出了一样的 logits：图没有冻住录图时的数"


def test_task3_graph_sizes(tiny_models, gpu):
    """cuda_graph_bs 没给时：1, 2, 4, 8, 16, 24, …，到第一个装得下 max_running_req 的为止（也不超过
    cuda_graph_max_bs）；cuda_graph_max_bs=0 或 cuda_graph_bs=[] 不录。CPU 上总是不录。"""
    model = tiny_models[MODEL]
    for running, max_bs, expected in [(3, None, [1, 2, 4]), (9, None, [1, 2, 4, 8, 16]), (9, 4, [1, 2, 4]),
                                      (4, 0, [])]:
        with engine_of(model, max_running_req=running, device=gpu.device, cuda_graph_max_bs=max_bs) as e:
            assert e.graph_runner.graph_bs_list == expected, (running, max_bs)
            assert e.graph_runner.max_graph_bs == max(expected, default=0)
            b = Batch(reqs=Driver(e).make_reqs(prompts(3, model), 2), phase="decode")
            e.graph_runner.pad_batch(b)
            assert b.padded_size == (4 if expected else 3)
    with engine_of(model, max_running_req=4, device="cpu") as e:
        assert e.graph_runner.graph_bs_list == []


def test_task3_max_bs_off_the_ladder(tiny_models, gpu):
    """cuda_graph_max_bs=10 不在 1, 2, 4, 8, 16, … 上：它只是上限，自己不加进去（和官方一样）。录的是 1, 2, 4, 8；
    9 个请求的 decode 用不上图、不补，而不是补到 10。"""
    model = tiny_models[MODEL]
    with engine_of(model, max_running_req=20, device=gpu.device, cuda_graph_max_bs=10) as e:
        assert e.graph_runner.graph_bs_list == [1, 2, 4, 8], "cuda_graph_max_bs 不在阶梯上时不加进录的大小"
        assert sorted(e.graph_runner.graph_map) == [1, 2, 4, 8]
        b = Batch(reqs=Driver(e).make_reqs(prompts(9, model), 2), phase="decode")
        assert not e.graph_runner.can_use_cuda_graph(b)
        e.graph_runner.pad_batch(b)
        assert b.padded_size == 9


def test_task3_shutdown_frees_the_graphs(tiny_models, gpu):
    """shutdown()（经 destroy_cuda_graphs）之后，录好的图没有引用留着：图和它们的显存池都释放了。
    TP 时这要在拆进程组之前做完，否则进程可能挂住。"""
    model = tiny_models[MODEL]
    with engine_of(model, device=gpu.device, cuda_graph_bs=[1, 2]) as e:
        graphs = [weakref.ref(g) for g in e.graph_runner.graph_map.values()]
        assert len(graphs) == 2
    gc.collect()
    assert not getattr(e.graph_runner, "graph_map", {}), "destroy_cuda_graphs 之后 graph_map 里不该还有图"
    assert all(r() is None for r in graphs), f"[{gpu.kind}] shutdown 之后还有图没被释放：别处还留着它们的引用"


def test_task3_bad_graph_sizes(tiny_models):
    with expect_error("ch6/graph_bs_invalid", value="[0, 2]"):
        with engine_of(tiny_models[MODEL], device="cpu", cuda_graph_bs=[0, 2]):
            pass


def test_task3_decode_batch_not_padded(tiny_models, gpu):
    """decode 的 batch 没经 pad_batch（3 个请求，图只有 1、2、4）：forward_batch 说一句该先补齐，而不是 KeyError。"""
    model = tiny_models[MODEL]
    with engine_of(model, ps=1, device=gpu.device, cuda_graph_bs=[1, 2, 4]) as e:
        driver = Driver(e)
        reqs = driver.make_reqs(prompts(3, model), 3)
        out = e.forward_batch(batch := driver.fill(reqs, "prefill"), e.sampler.prepare(batch))
        out.copy_done_event.synchronize()
        for i, r in enumerate(reqs):
            r.append_host(out.next_tokens_cpu[i:i + 1])
        batch = driver.fill(reqs, "decode")
        batch.padded_reqs = batch.reqs  # 手工填的 batch 忘了补齐
        e.attn_backend.prepare_metadata(batch)
        batch.input_ids, batch.positions, batch.out_loc = (t[:3] for t in (batch.input_ids, batch.positions,
                                                                          batch.out_loc))
        with expect_error("ch6/graph_batch_not_padded", padded=3):
            e.forward_batch(batch, e.sampler.prepare(batch))
