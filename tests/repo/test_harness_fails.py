"""测试框架自己也要能失败：把检查点故意改坏（跳过一个 norm），对齐测试必须抓到，并说清楚在哪。"""

import shutil


from tools.manifest import PROMPTS, TINY_NEW_TOKENS, load_manifest
from tests.harness.parity import parity_failures


def _broken_copy(tmp_path, name, rel, old, new):
    ck = next(c for c in load_manifest() if c.name == name)
    dst = tmp_path / name
    shutil.copytree(ck.path, dst, ignore=shutil.ignore_patterns("__pycache__"))
    src = (dst / rel).read_text()
    assert src.count(old) == 1, f"{rel} 里找不到要改坏的那一行：{old!r}"
    (dst / rel).write_text(src.replace(old, new))
    return dst / ck.entry


def test_skeleton_without_post_attention_norm_is_caught(tmp_path, tiny_models):
    entry = _broken_copy(tmp_path, "step0_skeleton", "skeleton.py",
                         'h = rms_norm(x, W[p + "post_attention_layernorm.weight"])', "h = x")
    failures = parity_failures(entry, tiny_models["qwen3-tied"], PROMPTS[:2], TINY_NEW_TOKENS, in_process=False)
    assert failures, "跳过了一个 norm，测试却没发现"
    report = failures[0]
    for must in ["第一次分叉", "HF", "top-5", "max |Δ logit|"]:
        assert must in report, report


def test_engine_with_norm_weight_ignored_is_caught(tmp_path, tiny_models):
    # RMSNormFused 的 C++ 和 PyTorch 两条路都改坏：哪台机器上都真的忽略了 norm 的权重
    fused = ("return self._add_rms_norm(x, residual, {w}, self.eps)\n        if residual is not None:\n"
             "            x = x + residual\n        return self._rms_norm(x, {w}, self.eps), x")
    entry = _broken_copy(tmp_path, "ch6_engine_sampler", "minisgl/layers/norm.py", fused.format(w="self.weight"),
                         fused.format(w="torch.ones_like(self.weight)"))
    failures = parity_failures(entry, tiny_models["qwen2"], PROMPTS[:1], TINY_NEW_TOKENS, page_size=4,
                               in_process=False)
    assert failures and "max |Δ logit|" in failures[0], failures


def test_engine_without_llama3_rope_scaling_is_caught(tmp_path, tiny_models):
    entry = _broken_copy(tmp_path, "ch6_engine_sampler", "minisgl/layers/rotary.py",
                         "inv_freq = _llama3_inv_freq(inv_freq, scaling)", "pass")
    failures = parity_failures(entry, tiny_models["llama3"], PROMPTS[3:], TINY_NEW_TOKENS, in_process=False)
    assert failures, "忽略了 Llama 3 的 RoPE 缩放，测试却没发现"
