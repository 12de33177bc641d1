"""第 6 章：批量采样器。

在合成的 logits（词表 50）上大量抽样：top-k 不出前 k 个，top-p 不出核（按概率从大到小、概率和第一次
达到 p 的最短前缀，至少 1 个），两者一起时先 top-k 再在重新归一化的分布上 top-p；温度趋于 0 就是 argmax；
纯温度采样的频率接近 softmax(logits / T)；一个 batch 里每个请求用自己的参数；种子决定结果。
最后经由 generate.py 的命令行：--temperature / --top-k / --seed 真的起作用。
"""

from __future__ import annotations

import pytest
import torch

from minisgl.core import Batch, SamplingParams
from minisgl.engine import BatchSamplingArgs, Sampler
from minisgl.engine.sample import sample_impl
from tests.harness.batch import make_batch as decode_batch
from tests.harness.batch import make_req
from tests.harness.contract import parse_outputs, run_in_process
from tests.harness.reference import hf_greedy, load_hf

VOCAB = 50
DRAWS = 20000
TOL = 0.02  # 频率的最大绝对误差；20000 次抽样时一个标准差不超过 0.0036
CPU = torch.device("cpu")


def make_logits(seed: int = 1) -> torch.Tensor:
    return torch.randn(VOCAB, generator=torch.Generator().manual_seed(seed))


def draw(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
         n: int = DRAWS, seed: int = 0) -> torch.Tensor:
    """同一行 logits 抽 n 次（n 行一起交给 sample_impl）。"""
    torch.manual_seed(seed)
    k = None if top_k is None else torch.full((n,), top_k, dtype=torch.int32)
    p = None if top_p is None else torch.full((n,), top_p, dtype=torch.float32)
    return sample_impl(logits.expand(n, -1).contiguous(), torch.full((n,), temperature), k, p)


def freqs(samples: torch.Tensor) -> torch.Tensor:
    return torch.bincount(samples, minlength=VOCAB).double() / len(samples)


def nucleus(probs: torch.Tensor, p: float) -> list[int]:
    """概率从大到小排，概率和第一次 >= p 的最短前缀（至少 1 个）。测试数据要离边界足够远，免得舍入说了算。"""
    sorted_probs, order = probs.double().sort(descending=True)
    csum = sorted_probs.cumsum(0)
    size = min(int((csum < p).sum()) + 1, len(probs))
    assert abs(csum[size - 1] - p) > 1e-3, "测试数据离边界太近"
    assert size == 1 or abs(csum[size - 2] - p) > 1e-3, "测试数据离边界太近"
    return order[:size].tolist()


def restricted(probs: torch.Tensor, keep: list[int]) -> torch.Tensor:
    out = torch.zeros_like(probs, dtype=torch.float64)
    out[keep] = probs.double()[keep]
    return out / out.sum()


def assert_distribution(samples: torch.Tensor, expected: torch.Tensor, tol: float = TOL) -> None:
    support = set(torch.nonzero(expected > 0).flatten().tolist())
    seen = set(samples.unique().tolist())
    assert seen <= support, f"抽到了不该抽到的 token：{sorted(seen - support)}"
    likely = {i for i in support if expected[i] * len(samples) >= 50}
    assert likely <= seen, f"该抽到的 token 一次也没抽到：{sorted(likely - seen)}"
    diff = (freqs(samples) - expected).abs().max().item()
    assert diff < tol, f"频率和期望分布最大差 {diff:.4f}"


# ---------------------------------------------------------------- sample_impl


@pytest.mark.parametrize("k", [1, 5, 12])
def test_task4_top_k_never_outside(k):
    """top-k：只从概率最大的 k 个里抽，按重新归一化的概率抽。"""
    logits = make_logits()
    probs = logits.softmax(-1)
    samples = draw(logits, top_k=k)
    assert_distribution(samples, restricted(probs, probs.topk(k).indices.tolist()))
    if k == 1:
        assert (samples == logits.argmax()).all()


@pytest.mark.parametrize("p", [0.3, 0.7, 0.92])
def test_task4_top_p_never_outside_nucleus(p):
    """top-p：只从核里抽（概率和第一次达到 p 的最短前缀），按重新归一化的概率抽。"""
    logits = make_logits()
    probs = logits.softmax(-1)
    keep = nucleus(probs, p)
    assert 1 < len(keep) < VOCAB
    assert_distribution(draw(logits, top_p=p), restricted(probs, keep))


def test_task4_top_p_keeps_at_least_one_token():
    """p 比最大的概率还小（甚至是 0）：核只有 1 个 token，就是 argmax——第一名永远保留。"""
    logits = make_logits()
    assert logits.softmax(-1).max() > 0.01
    for p in (0.01, 0.0):
        assert (draw(logits, top_p=p, n=2000) == logits.argmax()).all()
    sampler = Sampler(CPU, VOCAB)
    batch = make_batch([SamplingParams(temperature=1.0, top_p=0.0)] * 2000)
    torch.manual_seed(0)
    assert (sampler.sample(logits.expand(2000, -1), sampler.prepare(batch)) == logits.argmax()).all()


def test_task4_top_k_then_top_p():
    """先截 top-k，在重新归一化的分布上再截 top-p。"""
    logits, k, p = make_logits(), 10, 0.65
    probs = logits.softmax(-1)
    top = probs.topk(k).indices.tolist()
    keep = nucleus(restricted(probs, top), p)
    wrong_orders = {len(nucleus(probs, p)), len(top)}  # 只做 top-p；或者先 top-p（在原分布上）再 top-k
    assert len(keep) not in wrong_orders, "测试数据区分不了先后顺序"
    assert_distribution(draw(logits, top_k=k, top_p=p), restricted(probs, keep))


def test_task4_tiny_temperature_is_argmax():
    """温度 1e-6：不管截不截断，抽到的都是 argmax。"""
    n = 500
    logits = torch.randn(n, VOCAB, generator=torch.Generator().manual_seed(7))
    top2 = logits.topk(2).values
    assert (top2[:, 0] - top2[:, 1]).min() > 1e-4  # 没有近似平局
    t = torch.full((n,), 1e-6)
    torch.manual_seed(0)
    for k, p in [(None, None), (torch.full((n,), 5, dtype=torch.int32), None), (None, torch.full((n,), 0.9)),
                 (torch.full((n,), 5, dtype=torch.int32), torch.full((n,), 0.9))]:
        assert torch.equal(sample_impl(logits, t, k, p), logits.argmax(dim=-1))


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_task4_temperature_frequencies(temperature):
    """纯温度采样：频率接近 softmax(logits / T)。"""
    logits = make_logits()
    expected = (logits.double() / temperature).softmax(-1)
    for other in {0.5, 1.0, 2.0} - {temperature}:  # 测试数据要能看出温度用没用上
        assert ((logits.double() / other).softmax(-1) - expected).abs().max() > 2 * TOL
    assert_distribution(draw(logits, temperature=temperature), expected)


def test_task4_seed_decides_samples():
    """同一个种子，同样的结果；换一个种子，结果不同。"""
    logits = make_logits()
    a = draw(logits, temperature=1.0, top_k=20, top_p=0.95, n=1000, seed=123)
    b = draw(logits, temperature=1.0, top_k=20, top_p=0.95, n=1000, seed=123)
    c = draw(logits, temperature=1.0, top_k=20, top_p=0.95, n=1000, seed=124)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


# ---------------------------------------------------------------- Sampler：prepare + sample


def make_batch(params: list[SamplingParams]) -> Batch:
    """每个请求带一组采样参数的 decode batch（采样器只读 batch.reqs 的 sampling_params）。"""
    return decode_batch([make_req(2, table_idx=i, sampling_params=sp) for i, sp in enumerate(params)], "decode")


def test_task4_prepare_semantics():
    """全是贪心：temperatures 为 None；没人设 top_k / top_p：对应的张量为 None（官方语义）。"""
    sampler = Sampler(CPU, VOCAB)
    args = sampler.prepare(make_batch([SamplingParams(), SamplingParams(temperature=0.7, top_k=1)]))
    assert isinstance(args, BatchSamplingArgs)
    assert args.temperatures is None
    assert args.top_k is None
    assert args.top_p is None

    args = sampler.prepare(make_batch([SamplingParams(temperature=0.8), SamplingParams()]))
    assert args.temperatures is not None
    assert args.temperatures.dtype == torch.float32
    assert args.temperatures.shape == (2,)
    assert args.temperatures[0].item() == pytest.approx(0.8)
    assert args.top_k is None
    assert args.top_p is None
    assert args.greedy is not None
    assert args.greedy.tolist() == [False, True]

    args = sampler.prepare(make_batch([SamplingParams(temperature=0.8, top_k=5), SamplingParams(temperature=1.0)]))
    assert args.top_k is not None
    assert args.top_k.dtype == torch.int32
    assert args.top_k.tolist() == [5, VOCAB]
    assert args.top_p is None

    args = sampler.prepare(make_batch([SamplingParams(temperature=0.8), SamplingParams(temperature=1.0, top_p=0.9)]))
    assert args.top_k is None
    assert args.top_p is not None
    assert args.top_p.tolist() == pytest.approx([1.0, 0.9])


def test_task4_all_greedy_batch_is_argmax():
    sampler = Sampler(CPU, VOCAB)
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(3))
    args = sampler.prepare(make_batch([SamplingParams()] * 3))
    assert torch.equal(sampler.sample(logits, args), logits.argmax(dim=-1))


def test_task4_zero_temperature_with_top_p_is_argmax():
    """T=0 但设了 top_p：不算贪心请求，温度取 1e-6，结果仍是 argmax。"""
    sampler = Sampler(CPU, VOCAB)
    sp = SamplingParams(temperature=0.0, top_p=0.9)
    assert not sp.is_greedy
    logits = torch.randn(200, VOCAB, generator=torch.Generator().manual_seed(5))
    torch.manual_seed(0)
    assert torch.equal(sampler.sample(logits, sampler.prepare(make_batch([sp] * 200))), logits.argmax(dim=-1))


def test_task4_per_request_params_in_one_batch():
    """一个 batch 里各用各的参数：贪心、top_k=1、小 top_p、T=1。贪心的行严格是 argmax（近似平局也一样）。"""
    reps = 5000
    sampler = Sampler(CPU, VOCAB)
    rows = torch.stack([make_logits(s) for s in (11, 12, 13, 1)])
    for r in (0, 1):  # 贪心的两行：最大的两个 logit 只差一个 ulp，用 T=1e-6 近似贪心会抽到第二大的
        top = rows[r].argmax()
        rows[r, (top + 1) % VOCAB] = torch.nextafter(rows[r, top], torch.tensor(-float("inf")))
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, top_k=1),
              SamplingParams(temperature=1.0, top_p=0.3), SamplingParams(temperature=1.0)]
    batch = make_batch(params)
    batch.reqs = batch.reqs * reps  # 同样 4 个请求重复：prepare 只看 sampling_params
    args = sampler.prepare(batch)
    torch.manual_seed(0)
    samples = sampler.sample(rows.repeat(reps, 1), args).view(reps, 4)
    assert (samples[:, 0] == rows[0].argmax()).all()
    assert (samples[:, 1] == rows[1].argmax()).all()
    probs2, probs3 = rows[2].softmax(-1), rows[3].softmax(-1)
    keep = nucleus(probs2, 0.3)
    assert 1 < len(keep) < 10
    assert_distribution(samples[:, 2], restricted(probs2, keep), tol=0.03)
    assert_distribution(samples[:, 3], probs3.double(), tol=0.03)


# ---------------------------------------------------------------- generate.py 的采样参数


CLI_PROMPTS = ["Hello", "def f(x):"]
CLI_N = 8


def cli(checkpoint, model, *flags: str) -> list[list[int]]:
    argv = ["--model", str(model), "--max-new-tokens", str(CLI_N), "--json", *flags]
    for p in CLI_PROMPTS:
        argv += ["--prompt", p]
    return parse_outputs(run_in_process(checkpoint.entry_path, list(argv)), len(CLI_PROMPTS), CLI_N)


def test_task6_cli_sampling_flags(checkpoint, tiny_models):
    """同一个种子同样的输出，换种子输出不同；--temperature 0 就是贪心（= HF）；--top-k 5 不出每一步的前 5 个。"""
    model = tiny_models["qwen3-tied"]
    flags = ["--temperature", "0.8", "--top-k", "5"]
    a = cli(checkpoint, model, *flags, "--seed", "1")
    b = cli(checkpoint, model, *flags, "--seed", "1")
    c = cli(checkpoint, model, *flags, "--seed", "2")
    greedy = cli(checkpoint, model)
    zero = cli(checkpoint, model, "--temperature", "0", "--seed", "3")
    refs = [hf_greedy(str(model), p, CLI_N)[0] for p in CLI_PROMPTS]
    assert a == b
    assert a != c
    assert greedy == zero == refs
    assert a != greedy
    hf, tok = load_hf(str(model))
    for outs in (a, c):
        for p, out in zip(CLI_PROMPTS, outs):
            ids = tok(p).input_ids
            with torch.inference_mode():
                logits = hf(torch.tensor([ids + out])).logits[0, len(ids) - 1:-1]
            top5 = logits.topk(5).indices
            assert all(t in top5[i].tolist() for i, t in enumerate(out)), f"{p!r}: {out} 超出了每一步的 top-5"
