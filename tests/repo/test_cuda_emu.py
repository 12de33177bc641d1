"""模拟的 CUDA 自己的测试：rules.py 的每条规则一个测试。

同一批断言在真 GPU 上也跑（gpu 夹具有 "cuda" 一档时）：模拟照抄的 CUDA 行为，在第一次有 GPU 的运行里就对上了真货。
最后一个测试证明这一档抓得到它为之而建的那个错：去掉 _to_device，主存里的 input_ids 进了 cuda 上的 embedding。
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tests.harness.cuda_emu import RULES

ROOT = Path(__file__).resolve().parents[2]
SAME_DEVICE = "Expected all tensors to be on the same device, but found at least two devices"


def test_every_rule_has_its_test():
    names = {r.name for r in RULES}
    tested = {n.removeprefix("test_rule_").replace("_", "-") for n in globals() if n.startswith("test_rule_")}
    assert names == tested, f"没有测试的规则：{names - tested}；没有规则的测试：{tested - names}"
    assert all(r.cuda for r in RULES), "每条规则都要写出它照抄的 CUDA 行为"


def test_rule_same_device(gpu):
    x = torch.ones(3, device=gpu.device)
    for mix in (lambda: x + torch.ones(3), lambda: torch.cat([x, torch.ones(3)]),
                lambda: torch.ones(2, 3) @ x):
        with pytest.raises(RuntimeError, match=SAME_DEVICE):
            mix()


def test_rule_cpu_scalar(gpu):
    x = torch.arange(3.0, device=gpu.device)
    y = x * torch.tensor(2.0)  # 0 维 CPU 张量当标量
    z = torch.where(x > 0, torch.tensor(-1.0), x)
    assert y.device.type == z.device.type == "cuda"
    assert y.cpu().tolist() == [0.0, 2.0, 4.0] and z.cpu().tolist() == [0.0, -1.0, -1.0]


def test_rule_copy(gpu):
    host = torch.arange(4.0)
    dev = torch.zeros(4, device=gpu.device)
    dev.copy_(host)
    assert dev.device.type == "cuda" and host.to(gpu.device).device.type == "cuda"
    back = dev.to("cpu")
    assert back.device.type == "cpu" and back.tolist() == host.tolist()


def test_rule_index_cpu_indices(gpu):
    x = torch.arange(5.0, device=gpu.device)
    idx = torch.tensor([0, 3])  # 在 CPU 上
    assert x[idx].cpu().tolist() == [0.0, 3.0]
    x[idx] = torch.tensor([7.0, 8.0], device=gpu.device)
    assert x.cpu().tolist() == [7.0, 1.0, 2.0, 8.0, 4.0]
    with pytest.raises(IndexError, match="indices should be either on cpu or on the same device"):
        torch.arange(5.0)[torch.tensor([1], device=gpu.device)]


def test_rule_index_select_same_device(gpu):
    w = torch.randn(5, 2, device=gpu.device)
    for lookup in (lambda: w.index_select(0, torch.tensor([1, 2])), lambda: F.embedding(torch.tensor([1, 2]), w),
                   lambda: w.index_select(0, torch.tensor(1)),
                   lambda: w.gather(0, torch.zeros(1, 2, dtype=torch.long))):
        with pytest.raises(RuntimeError, match=SAME_DEVICE):
            lookup()


def test_rule_factory(gpu):
    made = [torch.zeros(2, device=gpu.device), torch.arange(3, device=gpu.device),
            torch.tensor([1, 2], device=gpu.device), torch.as_tensor([1.0], device=gpu.device),
            torch.empty(2, device=gpu.device, pin_memory=False)]
    assert all(t.device.type == "cuda" for t in made)
    assert torch.tensor([1, 2], device=gpu.device).cpu().tolist() == [1, 2]
    pinned = torch.empty(2, pin_memory=True)
    assert pinned.device.type == "cpu"


def test_rule_host_sync(gpu):
    x = torch.arange(4, device=gpu.device)
    reads = [lambda: int(x[0]), lambda: x.tolist(), lambda: x.cpu(), lambda: x.nonzero(), lambda: x[x > 1],
             lambda: torch.cuda.synchronize(),
             lambda: torch.arange(4).to(gpu.device),  # 不带 non_blocking 的上传：拷完要等流
             lambda: torch.tensor([1, 2], device=gpu.device),
             lambda: x[torch.tensor([0])]]  # CPU 上的下标先同步地拷上设备
    for read in reads:
        before = len(gpu.syncs)
        read()
        assert len(gpu.syncs) == before + 1, gpu.syncs.since(before)
    before = len(gpu.syncs)
    y = (x + 1) * 2  # 留在设备上的计算、non_blocking 的上传、设备上的下标：主机都不等
    torch.arange(4).to(gpu.device, non_blocking=True)
    y[torch.tensor([0]).to(gpu.device, non_blocking=True)] = 5
    assert gpu.syncs.since(before) == []



def test_rule_graph_capture(gpu):
    """录下的是设备上的算子：重放时读缓冲的新内容，视图和原地算子照样生效；Python 的数停在录的那一刻。"""
    static_in = torch.zeros(4, device=gpu.device)
    scale = torch.full((4,), 2.0, device=gpu.device)
    offset = [3.0]  # 录图时读进来的 Python 数
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = static_in * scale + offset[0]
        head = out[:2]  # 视图
        out.add_(1.0)  # 原地
    static_in.copy_(torch.arange(4.0))
    offset[0] = 100.0
    g.replay()
    torch.cuda.synchronize()
    assert out.cpu().tolist() == [4.0, 6.0, 8.0, 10.0]  # x·2 + 3 + 1：3 是录图时的数，不是 100
    assert head.cpu().tolist() == [4.0, 6.0]
    static_in.fill_(1.0)
    g.replay()
    assert out.cpu().tolist() == [6.0] * 4


def test_rule_graph_no_host_sync(gpu):
    x = torch.arange(4, device=gpu.device)
    g = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="stream is capturing|capture"):
        with torch.cuda.graph(g):
            y = x * 2
            y.sum().item()


NEGATIVE = textwrap.dedent("""
    import sys, torch
    sys.path[:0] = [{root!r}, {ch6!r}]
    from tests.harness.cuda_emu import emulated_cuda
    import minisgl.engine.engine as engine_module
    from minisgl.core import Batch, Req, SamplingParams
    from minisgl.distributed import DistributedInfo
    from minisgl.engine import Engine, EngineConfig
    engine_module._to_device = lambda batch, device: None  # 去掉"搬上设备"这一步：167c67e 的引擎就是这样
    with emulated_cuda():
        e = Engine(EngineConfig(model_path={model!r}, tp_info=DistributedInfo(0, 1), dtype=torch.float32,
                                max_running_req=2, num_page_override=64, max_seq_len_override=64, device="cuda"))
        req = Req(input_ids=torch.tensor([1, 2, 3], dtype=torch.int32), table_idx=0, cached_len=0, output_len=2,
                  uid=0, sampling_params=SamplingParams(max_tokens=2), cache_handle=None)
        e.page_table[0, :3] = torch.arange(3)
        batch = Batch(reqs=[req], phase="prefill")
        e.graph_runner.pad_batch(batch)
        batch.input_ids = req.input_ids  # 像里程碑那样在主存里填 batch
        batch.positions = torch.arange(3, dtype=torch.int32)
        batch.out_loc = torch.arange(3, dtype=torch.int32)
        e.attn_backend.prepare_metadata(batch)
        try:
            e.forward_batch(batch, e.sampler.prepare(batch))
        except RuntimeError as err:
            sys.exit(str(err).splitlines()[0])
    print("没有报错")
""")


def test_engine_without_to_device_fails_under_emulation(tiny_models):
    """H200 上那 35 个失败的原因：主存里填的 batch 没搬上设备，input_ids 在 CPU、词嵌入在 cuda:0。
    模拟的 CUDA 上同样失败，一行说出算子和两个设备。"""
    from tests.harness.cuda_emu import guard_problem

    if guard_problem():
        pytest.skip(guard_problem())
    code = NEGATIVE.format(root=str(ROOT), ch6=str(ROOT / "ch6_engine_sampler"), model=str(tiny_models["qwen3-tied"]))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    last = (res.stderr.strip().splitlines() or [""])[-1]
    assert res.returncode != 0, f"去掉 _to_device 的引擎在模拟的 CUDA 上没有失败：{res.stdout[-500:]}"
    assert SAME_DEVICE in last and "cuda:0 and cpu" in last and "aten::embedding" in last, res.stderr[-2000:]
