"""minisgl.kernel：线性层的每一条路（F.linear、oneDNN 普通布局、按各个行数重排的布局、按块的 bmm、没有 oneDNN 时的退路）
在每台机器上都和 F.linear 核对——和 HF 的对齐不能取决于这台机器量出来选了哪条路。

只核对数值和选择的规则，从不断言耗时。"""

from __future__ import annotations

import platform

import pytest
import torch
import torch.nn.functional as F

TIGHT = {"rtol": 1e-5, "atol": 1e-5}  # 不同的核只差浮点累加顺序
ROWS = (1, 4, 7)  # 少于、等于、多于重排时设想的行数


@pytest.fixture
def kernel():
    from minisgl import kernel

    kernel.reset()
    yield kernel
    kernel.reset()


class Owner:
    def __init__(self, w: torch.Tensor) -> None:
        self.weight = w


def _weights(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(out, inp, generator=g) * 0.1 for out, inp in [(160, 96), (160, 96), (96, 64)]]


def _inputs(inp: int):
    return [torch.randn(n, inp, generator=torch.Generator().manual_seed(n)) for n in ROWS]


def test_onednn_is_there_on_x86(kernel):
    """x86-64 的 CPU 版 torch 带这两个内部算子：没有的话下面的快路径测试等于没测。"""
    if platform.machine().lower() in ("x86_64", "amd64"):
        assert kernel.ONEDNN, "x86-64 的 CPU 版 torch 应该有 mkldnn._linear_pointwise 和 _reorder_linear_weight"


@pytest.mark.parametrize("path", ["F.linear", "onednn", "packed/1", "packed/4", "packed/8", "bmm/2", "bmm/4", "bmm/8"])
@pytest.mark.parametrize("has_bias", [True, False])
def test_every_path_matches_f_linear(kernel, path, has_bias):
    name, _, r = path.partition("/")
    if name in ("onednn", "packed") and not kernel.ONEDNN:
        with pytest.raises(RuntimeError, match="oneDNN"):
            kernel.run_kernel("onednn", torch.randn(1, 4), torch.randn(3, 4))
        return
    w = _weights()[0]  # (160, 96)：160 能被 2、4、8 整除
    b = torch.randn(w.shape[0]) if has_bias else None
    wk = kernel.pack(w, int(r)) if name == "packed" else w
    for x in _inputs(w.shape[1]):
        got = kernel.run_kernel(path if name == "bmm" else name, x, wk, b)
        assert got.shape == (x.shape[0], w.shape[0]) and got.is_contiguous()  # 和 F.linear 一样按行存
        torch.testing.assert_close(got, F.linear(x, w, b), **TIGHT)


def test_bmm_blocks_divide_the_output(kernel):
    """bmm 试的块数：线程数和它的两倍，只取大于 1、能整除输出维的（每块一样大，才能 view 成 (块, out/块, in)）。"""
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert kernel.bmm_blocks(12) == [2, 4]
        assert kernel.bmm_blocks(6) == [2]  # 4 不整除 6
        assert kernel.bmm_blocks(7) == []  # 谁都不整除：这种形状不参加 bmm
        torch.set_num_threads(1)
        assert kernel.bmm_blocks(12) == [2]  # 1 块就是整个矩阵乘，不算一种新做法
        torch.set_num_threads(3)
        assert kernel.bmm_blocks(12) == [3, 6]
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("forced", ["F.linear", "onednn", "packed", "bmm"])
def test_forced_choice_is_applied_and_matches(kernel, forced):
    """prepare_linear_weights(kernel=…)：不量，全用指定的核；linear() 真的走了它（看权重布局和选择表），结果照旧。
    这种形状用不了指定的核（bmm 的块数不整除输出维）时退回 F.linear。"""
    if forced in ("onednn", "packed") and not kernel.ONEDNN:
        return _check_fallback(kernel, forced)
    owners = [Owner(w) for w in _weights()]
    plain = [o.weight for o in owners]
    tied = torch.randn(50, 96)
    layouts = kernel.prepare_linear_weights(owners, rows=[1, 4], keep_layout=[tied], kernel=forced)
    if forced == "bmm":
        for shape, layout in layouts.items():
            blocks = kernel.bmm_blocks(shape[0])
            assert layout == (f"bmm/{blocks[0]}" if blocks else "F.linear"), shape
    else:
        want = {"F.linear": "F.linear", "onednn": "onednn", "packed": "packed/4"}[forced]
        assert layouts[(160, 96)] == layouts[(96, 64)] == want
        assert layouts[(50, 96)] == ("onednn" if forced == "packed" else want)  # 共用的权重不换布局
    assert all(o.weight.is_mkldnn is (forced == "packed") for o in owners)
    for o, w in zip(owners, plain):
        for x in _inputs(w.shape[1]):
            torch.testing.assert_close(kernel.linear(x, o.weight), F.linear(x, w), **TIGHT)
    for x in _inputs(96):
        torch.testing.assert_close(kernel.linear(x, tied), F.linear(x, tied), **TIGHT)


@pytest.mark.parametrize("onednn", [True, False])
def test_measured_choice_follows_the_measurement(kernel, monkeypatch, onednn):
    """min_bytes=0 逼它量小权重：每种形状记下每个候选的毫秒，选出来的布局和这些毫秒按规则推出来的一致，结果照旧。
    onednn=False：假装这个 torch 没有 oneDNN 的内部算子，只在 F.linear 和 bmm 之间选。"""
    if onednn and not kernel.ONEDNN:
        return _check_fallback(kernel, None)
    from minisgl.kernel import cpu_linear
    from minisgl.kernel.cpu_linear import MARGIN

    monkeypatch.setattr(cpu_linear, "SAMPLE_BYTES", 1 << 20)  # 冲缓存的缓冲区也跟着变小：测试不必等它
    monkeypatch.setattr(cpu_linear, "ONEDNN", onednn)

    owners = [Owner(w) for w in _weights()]
    plain = [o.weight for o in owners]
    layouts = kernel.prepare_linear_weights(owners, rows=[1, 4], min_bytes=0)
    assert set(layouts) == {(160, 96), (96, 64)}
    for shape, layout in layouts.items():
        ms = kernel.report[shape]["ms"]
        bmm = [f"bmm/{k}" for k in kernel.bmm_blocks(shape[0])]
        plain_kernels = ["F.linear", *(["onednn"] if onednn else []), *bmm]
        packs = [1, 4] if onednn else []
        assert set(ms) == {(k, n) for k in plain_kernels + [f"packed/{r}" for r in packs] for n in (1, 4)}
        per_row = {}
        for n in (1, 4):
            best = min(plain_kernels, key=lambda k: ms[(k, n)])
            per_row[n] = best if ms[(best, n)] < ms[("F.linear", n)] * (1 - MARGIN) else "F.linear"
        plain_ms = sum(ms[(per_row[n], n)] for n in (1, 4))
        packed = {r: sum(ms[(f"packed/{r}", n)] for n in (1, 4)) for r in packs}
        r = min(packed, key=packed.get, default=0)
        if r and packed[r] < plain_ms * (1 - MARGIN):
            assert layout == f"packed/{r}"
        else:
            assert layout == (per_row[1] if per_row[1] == per_row[4] else "mixed")
            # 没量过的 2、3 行（batch 变小时）照下一个量过的 4 行选
            assert cpu_linear._choice[(*shape, 2)] == cpu_linear._choice[(*shape, 3)] == per_row[4]
    for o, w in zip(owners, plain):
        for x in _inputs(w.shape[1]):  # 7 行比量过的最多 4 行还多：照 4 行的选择走
            torch.testing.assert_close(kernel.linear(x, o.weight), F.linear(x, w), **TIGHT)


def test_small_models_are_not_measured(kernel):
    """权重合计不到 MIN_BYTES（测试用的小模型都是）：不量、不换布局、选择表是空的——linear() 就是 F.linear。"""
    owners = [Owner(w) for w in _weights()]
    plain = [o.weight for o in owners]
    assert kernel.prepare_linear_weights(owners, rows=[1, 4]) == {}
    assert all(o.weight is w for o, w in zip(owners, plain)) and not kernel.report
    x = _inputs(96)[1]
    assert torch.equal(kernel.linear(x, plain[0]), F.linear(x, plain[0]))


@pytest.mark.parametrize("forced", ["onednn", "packed"])
def test_fallback_without_onednn(kernel, forced):
    """没有那两个内部算子时指定 oneDNN 的做法：不换布局，全用 F.linear，linear() 逐位等于 F.linear。"""
    _check_fallback(kernel, forced)


def _check_fallback(kernel, forced: str | None) -> None:
    from minisgl.kernel import cpu_linear

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cpu_linear, "ONEDNN", False)
        owners = [Owner(w) for w in _weights()]
        plain = [o.weight for o in owners]
        layouts = cpu_linear.prepare_linear_weights(owners, rows=[1, 4], kernel=forced or "onednn", min_bytes=0)
        assert set(layouts.values()) == {"F.linear"}
        assert all(o.weight is w for o, w in zip(owners, plain))
        for x in _inputs(96):
            assert torch.equal(kernel.linear(x, plain[0]), F.linear(x, plain[0]))


def test_other_dtypes_stay_on_f_linear(kernel):
    """bf16 不参加（oneDNN 这几条路只为 fp32 CPU 量过）：forced 也不换，结果逐位等于 F.linear。"""
    owners = [Owner(w.bfloat16()) for w in _weights()]
    assert kernel.prepare_linear_weights(owners, rows=[1], kernel="packed") == {}
    x = _inputs(96)[0].bfloat16()
    assert torch.equal(kernel.linear(x, owners[0].weight), F.linear(x, owners[0].weight))


def test_bad_arguments_name_the_problem(kernel, monkeypatch):
    with pytest.raises(ValueError, match="rows"):
        kernel.prepare_linear_weights([Owner(torch.randn(4, 4))], rows=[])
    with pytest.raises(ValueError, match="rows"):
        kernel.prepare_linear_weights([Owner(torch.randn(4, 4))], rows=[0, 4])
    with pytest.raises(ValueError, match=r"\(8,\)"):
        kernel.prepare_linear_weights([Owner(torch.randn(8))], rows=[1])
    with pytest.raises(ValueError, match="没有叫 'fast'"):
        kernel.prepare_linear_weights([Owner(torch.randn(4, 4))], rows=[1], kernel="fast")
    for bad in ("bmm", "bmm/x", "onednn/2"):
        with pytest.raises(ValueError, match=f"没有叫 '{bad}'"):
            kernel.run_kernel(bad, torch.randn(1, 4), torch.randn(6, 4))
    with pytest.raises(ValueError, match=r"\(6, 4\).*整除"):
        kernel.run_kernel("bmm/4", torch.randn(1, 4), torch.randn(6, 4))
    if kernel.ONEDNN:
        with pytest.raises(ValueError, match="布局对不上"):
            kernel.run_kernel("packed", torch.randn(1, 4), torch.randn(3, 4))
        with pytest.raises(ValueError, match="布局对不上"):
            kernel.run_kernel("onednn", torch.randn(1, 4), kernel.pack(torch.randn(3, 4), 1))
        packed = Owner(kernel.pack(torch.randn(3, 4), 1))
        with pytest.raises(ValueError, match="还没重排过"):
            kernel.prepare_linear_weights([packed], rows=[1])
    monkeypatch.setenv("MINISGL_LINEAR", "fast")
    with pytest.raises(ValueError, match="MINISGL_LINEAR='fast'"):
        kernel.prepare_linear_weights([Owner(torch.randn(4, 4))], rows=[1])


def test_env_var_forces_the_kernel(kernel, monkeypatch):
    monkeypatch.setenv("MINISGL_LINEAR", "F.linear")
    owners = [Owner(w) for w in _weights()]
    assert set(kernel.prepare_linear_weights(owners, rows=[1, 4], min_bytes=0).values()) == {"F.linear"}
    assert not kernel.report[(160, 96)]["ms"]  # 没量


@pytest.mark.parametrize("name", ["qwen3-tied", "qwen3-untied"])
def test_prepare_model_finds_every_linear_and_keeps_the_tied_table(kernel, tiny_models, name):
    """prepare_model 走遍模型：每个线性层和不绑定的 LM head 都换成重排布局（forced packed），
    绑定时词嵌入（也是 LM head 的权重）原样保留；换过的每个权重经 linear() 算出来和原来的 F.linear 一样。"""
    if not kernel.ONEDNN:
        return _check_fallback(kernel, None)
    from tests.ch3.common import build_meta, config_of, load_into

    model = build_meta(config_of(tiny_models[name]))
    load_into(model, tiny_models[name])
    before = dict(model.state_dict())
    kernel.prepare_model(model, rows=[1, 4], kernel="packed")
    after = model.state_dict()
    linear_keys = [k for k, w in before.items() if w.dim() == 2 and "embed_tokens" not in k]
    assert any("lm_head" in k for k in linear_keys) == (name == "qwen3-untied")
    assert linear_keys and all(after[k].is_mkldnn for k in linear_keys), "有线性层没被找到"
    emb = "model.embed_tokens.weight"
    assert after[emb] is before[emb] and not after[emb].is_mkldnn  # 查词表要普通布局
    for k in linear_keys + ([emb] if name == "qwen3-tied" else []):
        x = torch.randn(3, before[k].shape[1])
        torch.testing.assert_close(kernel.linear(x, after[k]), F.linear(x, before[k]), **TIGHT)


# ---------------------------------------------------------------- 经由 Engine：每条路都和 HF 逐 token 相同


def _engine_tokens(model, n: int) -> tuple[list[list[int]], dict, list[torch.Tensor]]:
    """4 个提示词一个 batch 经由 Engine 生成 n 个；另返回 Engine 加载后的选择表和模型的二维权重。"""
    from minisgl.kernel import cpu_linear
    from tests.ch6.test_engine import engine_of, generate
    from tests.harness.course import PROMPTS
    from tests.harness.reference import encode

    with engine_of(model) as e:
        weights = [w for w in e.model.state_dict().values() if w.dim() == 2]
        choice = dict(cpu_linear._choice)
        return generate(e, [encode(model, p) for p in PROMPTS], n), choice, weights


@pytest.mark.parametrize("forced", [None, "F.linear", "onednn", "packed", "bmm"])
@pytest.mark.parametrize("name", ["qwen3-tied", "qwen3-untied"])
def test_engine_matches_hf_on_every_kernel(kernel, tiny_models, monkeypatch, name, forced):
    """MINISGL_LINEAR 逼 Engine 走每一条路（None = 默认：小模型不量，全用 F.linear）：batch 里 4 个提示词都和 HF 相同。
    同时核对真的走了那条路：packed 换了布局，onednn / F.linear / bmm 记进了选择表，默认什么都不记。"""
    from tests.harness.course import PROMPTS
    from tests.harness.reference import hf_greedy

    if forced is None:
        monkeypatch.delenv("MINISGL_LINEAR", raising=False)
    else:
        monkeypatch.setenv("MINISGL_LINEAR", forced)
    model = tiny_models[name]
    got, choice, weights = _engine_tokens(model, 8)
    fast = kernel.ONEDNN and forced in ("onednn", "packed")
    assert any(w.is_mkldnn for w in weights) is (fast and forced == "packed")
    if kernel.ONEDNN and forced in ("F.linear", "onednn"):
        assert choice and set(choice.values()) == {forced}
    if forced == "bmm":  # 每种形状用能整除它的第一个块数；哪种形状都整除不了才是 F.linear
        assert choice and all(k == (f"bmm/{kernel.bmm_blocks(out)[0]}" if kernel.bmm_blocks(out) else "F.linear")
                              for (out, _, _), k in choice.items())
        assert any(k.startswith("bmm/") for k in choice.values())
    if forced is None:
        assert not choice
    for p, g in zip(PROMPTS, got):
        assert g == hf_greedy(str(model), p, 8)[0], f"{name} MINISGL_LINEAR={forced}: {p[:30]!r}"


def test_each_engine_chooses_afresh(kernel, tiny_models, monkeypatch):
    """同一进程里先后建的 Engine：前一个的选择（这里是 bmm）不带给后一个（默认，小模型全用 F.linear）。"""
    monkeypatch.setenv("MINISGL_LINEAR", "bmm")
    assert _engine_tokens(tiny_models["qwen3-tied"], 1)[1]
    monkeypatch.delenv("MINISGL_LINEAR")
    assert not _engine_tokens(tiny_models["qwen3-tied"], 1)[1]
