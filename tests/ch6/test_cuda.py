"""第 6 章的 GPU 一档：同一个引擎放在 cuda 上（模拟的 CUDA，每台机器都有；有真 GPU 时再在真 CUDA 上跑一遍）。

模拟的 CUDA 数值在 CPU 上真算，只是守 CUDA 的规矩：张量不能混放两个设备（主存里填的 batch 要先搬上去），
读回主存的每一次都记下来（tests/harness/cuda_emu，规则表见"怎么跑测试"一页）。所以这里的 token 要和 CPU 上的
引擎逐个相同；真 GPU 上贪心的 token 也该相同（fp32、不开 TF32），采样的随机数来自 GPU 的生成器，只查是否合法。
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import subprocess

import torch

from minisgl.core import SamplingParams
from tests.ch6.test_engine import Driver, engine_of
from tests.harness.contract import build_argv
from tests.harness.errors import expect_exit, run_cli
from tests.harness.parity import parity_failures
from tests.harness.reference import encode, hf_greedy
from tools.manifest import PROMPTS, TINY_NEW_TOKENS

N = 16
MODEL = "qwen3-tied"
# 一次 forward_batch 读回主存的次数：只有把 token 拷回 CPU 那一次（CUDA 图要的是图里一次也没有）
FORWARD_HOST_SYNCS = 1


def drive(engine, prompt_ids: list[list[int]], n: int, params: list[SamplingParams] | None = None):
    """Driver 在主存里填 batch（像里程碑和阶段二的调度器那样，含 pad_batch 补的假请求），返回每个请求的 token、
    每步的 logits（搬回 CPU）和每步补齐后的大小。"""
    driver = Driver(engine)
    reqs = driver.make_reqs(prompt_ids, n)
    for r, p in zip(reqs, params or []):
        r.sampling_params = p
    tokens, logits, padded = [], [], []
    for phase in ["prefill"] + ["decode"] * (n - 1):
        batch = driver.fill(reqs, phase)
        padded.append(batch.padded_size)
        out = engine.forward_batch(batch, engine.sampler.prepare(batch))
        out.copy_done_event.synchronize()
        for i, r in enumerate(reqs):
            r.append_host(out.next_tokens_cpu[i:i + 1])
        tokens.append(out.next_tokens_cpu.tolist())
        logits.append(out.logits.cpu())
    return [list(t) for t in zip(*tokens)], logits, padded


def test_task6_generate_on_gpu_matches_hf(checkpoint, tiny_models, gpu, family):
    """generate.py --device cuda --page-size 4：和 HF 逐 token 相同、logits 在容差内（和 CPU 上同一个判据）。"""
    failures = parity_failures(checkpoint.entry_path, tiny_models[family], PROMPTS, TINY_NEW_TOKENS, 4,
                               extra=["--device", gpu.device])
    assert not failures, f"[{gpu.kind}] " + "\n\n".join(failures)


def test_task2_host_filled_batches_on_gpu_equal_cpu(tiny_models, gpu):
    """batch 在主存里填好交给 cuda 上的引擎（forward_batch 先搬上设备）：token 和 CPU 上的引擎逐个相同，
    logits 也接近。"""
    model = tiny_models[MODEL]
    ids = [encode(model, p) for p in PROMPTS]
    with engine_of(model, ps=4, device="cpu") as e:
        cpu_tokens, cpu_logits, _ = drive(e, ids, N)
    with engine_of(model, ps=4, device=gpu.device) as e:
        assert e.device.type == e.page_table.device.type == e.kv_cache.k_cache(0).device.type == "cuda"
        gpu_tokens, gpu_logits, _ = drive(e, ids, N)
    assert gpu_tokens == cpu_tokens, f"[{gpu.kind}] cuda 上 {gpu_tokens} != CPU 上 {cpu_tokens}"
    for step, (g, c) in enumerate(zip(gpu_logits, cpu_logits)):
        torch.testing.assert_close(g, c, atol=1e-4, rtol=1e-4, msg=lambda m, s=step: f"第 {s} 步：{m}")


def test_task2_one_host_sync_per_forward_batch(tiny_models, gpu, record_property):
    """每次 forward_batch 读回主存的次数（.item()、.tolist()、拷回 CPU、nonzero…）：prefill 和 decode
    都只有拷 token 那一次。"""
    model = tiny_models[MODEL]
    ids = [encode(model, p) for p in PROMPTS[:3]]
    with engine_of(model, ps=4, device=gpu.device) as e:
        driver = Driver(e)
        reqs = driver.make_reqs(ids, 4)
        per_step = []
        for phase in ["prefill", "decode", "decode", "decode"]:
            batch = driver.fill(reqs, phase)
            args = e.sampler.prepare(batch)
            start = len(gpu.syncs)
            out = e.forward_batch(batch, args)
            per_step.append((phase, gpu.syncs.since(start)))
            out.copy_done_event.synchronize()
            for i, r in enumerate(reqs):
                r.append_host(out.next_tokens_cpu[i:i + 1])
    record_property("host_syncs_per_forward_batch", {phase: len(s) for phase, s in per_step})
    for phase, syncs in per_step:
        assert len(syncs) <= FORWARD_HOST_SYNCS, \
            f"[{gpu.kind}] {phase} 的 forward_batch 读回主存 {len(syncs)} 次：{syncs}"


def test_task2_mixed_prefill_and_decode_batch_on_gpu(tiny_models, gpu):
    """一个 prefill 的 batch 里既有新提示词，也有接着生成的请求（extend_len 为 1）：cuda 上的 token 和 HF 相同。"""
    model = tiny_models[MODEL]
    a_ids, b_ids = encode(model, PROMPTS[0]), encode(model, PROMPTS[2])
    n = 6
    with engine_of(model, ps=4, device=gpu.device) as e:
        driver = Driver(e)
        a, b = driver.make_reqs([a_ids, b_ids], n)
        a_out = driver.step([a], "prefill") + driver.step([a], "decode")
        both = driver.step([a, b], "prefill")  # a 这一步只有 1 个新 token，b 是整段提示词
        a_out.append(both[0])
        b_out = [both[1]]
        for _ in range(n - 3):
            t = driver.step([a, b], "decode")
            a_out.append(t[0])
            b_out.append(t[1])
    assert a_out == hf_greedy(str(model), PROMPTS[0], n)[0][:len(a_out)], f"[{gpu.kind}] 接着生成的请求错了"
    assert b_out == hf_greedy(str(model), PROMPTS[2], n)[0][:len(b_out)], f"[{gpu.kind}] 同 batch 的新请求错了"


def test_task4_sampling_on_gpu(tiny_models, gpu):
    """温度、top-k、top-p 各设各的，放进一个 batch：模拟的 CUDA 上和 CPU 的引擎采出同样的 token（同一个种子、
    同一个 CPU 生成器）；真 GPU 的生成器不同，只查贪心的那个相同、采出的都在词表里。"""
    model = tiny_models[MODEL]
    ids = [encode(model, p) for p in PROMPTS]
    params = [SamplingParams(max_tokens=8), SamplingParams(temperature=0.8, max_tokens=8),
              SamplingParams(temperature=1.0, top_k=5, max_tokens=8),
              SamplingParams(temperature=1.0, top_p=0.9, max_tokens=8)]
    results = []
    for device in ("cpu", gpu.device):
        with engine_of(model, ps=4, device=device) as e:
            torch.manual_seed(7)
            results.append(drive(e, ids, 8, params)[0])
    cpu_tokens, gpu_tokens = results
    if gpu.kind == "emulated":
        assert gpu_tokens == cpu_tokens
    assert gpu_tokens[0] == cpu_tokens[0] == hf_greedy(str(model), PROMPTS[0], 8)[0]
    assert all(0 <= t < 1024 for row in gpu_tokens for t in row)


def test_task5_milestone_on_gpu(checkpoint, tiny_models, gpu):
    """里程碑脚本原样在 cuda 上跑（batch 由 prepare_batch 在主存里填）：四个"与 HF 一致"和
    "单独跑 == batch 里跑"都是 True。"""
    script = checkpoint.path / "examples" / "stage1_milestone.py"
    res = run_cli(script, ["--model", str(tiny_models[MODEL])])
    assert res.returncode == 0, f"[{gpu.kind}] 里程碑以状态 {res.returncode} 退出：\n{res.stderr[-3000:]}"
    lines = res.stdout.splitlines()
    assert any(line.startswith("正式结构：cuda:0") for line in lines), res.stdout
    verdicts = [line.rsplit(":", 1)[1].strip() for line in lines if "与 HF 一致:" in line]
    assert verdicts == ["True"] * 4, res.stdout
    assert lines[-1].endswith("单独跑 == batch 里跑：True"), res.stdout


def test_task7_tp_on_a_one_gpu_machine(checkpoint, tiny_models, gpu):
    """一块卡的机器上：--tp 2 一句话拒绝并给出 --device cpu；加上它，两个 rank 在 CPU 上用 gloo 跑，结果和 cuda 上
    tp=1 相同（张量并行一页教的正是这条路）。"""
    generate = importlib.import_module("generate")  # 当模块导入：spawn 出来的 rank 要按名字找到 run_rank
    model = tiny_models[MODEL]
    argv = build_argv(model, PROMPTS[:2], 6)

    def run(extra: list[str]) -> subprocess.CompletedProcess:
        """在这个进程里（模拟的 CUDA 只在这里）跑 main，结果写成命令行的样子：SystemExit 的消息就是 stderr。"""
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                generate.main(argv + extra)
        except SystemExit as e:
            if e.code not in (None, 0):
                return subprocess.CompletedProcess(extra, 1, out.getvalue(), str(e.code))
        return subprocess.CompletedProcess(extra, 0, out.getvalue(), "")

    expect_exit("ch6/cli_tp_more_ranks_than_gpus", run(["--tp", "2"]))
    outputs = []
    for extra in (["--device", gpu.device], ["--tp", "2", "--device", "cpu"]):
        res = run(extra)
        assert res.returncode == 0, f"[{gpu.kind}] {' '.join(extra)}：{res.stderr}"
        outputs.append(json.loads(res.stdout.splitlines()[-1])["outputs"])
    one, two = outputs
    assert one == two == [hf_greedy(str(model), p, 6)[0] for p in PROMPTS[:2]]
