"""对齐测试比 logits：token 恰好没翻的错误（把 rms_norm_eps 写死成常数）也要抓到，
并说清楚第几个请求、第几步、差多少、在哪。"""

import shutil

from tools.manifest import PROMPTS, TINY_NEW_TOKENS, load_manifest
from tests.harness.parity import parity_failures
from tests.harness.reference import hf_greedy


def _planted(tmp_path, rel, old, new):
    ck = next(c for c in load_manifest() if c.chapter == 3)
    dst = tmp_path / ck.name
    shutil.copytree(ck.path, dst, ignore=shutil.ignore_patterns("__pycache__"))
    src = (dst / rel).read_text(encoding="utf-8")
    assert src.count(old) == 1, f"{rel} 里找不到要改的那一行：{old!r}"
    (dst / rel).write_text(src.replace(old, new), encoding="utf-8")
    return dst / ck.entry


def test_hard_coded_eps_is_caught_by_the_logits_even_if_tokens_agree(tmp_path, tiny_models):
    entry = _planted(tmp_path, "minisgl/models/config.py", "rms_norm_eps=config.rms_norm_eps,", "rms_norm_eps=1e-6,")
    model = tiny_models["qwen3-untied"]  # 真实尺度、eps=1e-5
    failures = parity_failures(entry, model, PROMPTS[:1], TINY_NEW_TOKENS, in_process=False)
    assert failures, "rms_norm_eps 写死成 1e-6，对齐测试却没发现"
    report = failures[0]
    assert "token 全对" in report, f"这条提示词上 token 恰好不翻，只有 logits 抓得到：\n{report}"
    for must in ["请求 0", "第 0 步", "max |Δ logit|", "容差", "差最大的是 token", "HF   top-5", "我们 top-5"]:
        assert must in report, report


def test_reference_checkpoint_is_within_the_tolerance(tiny_models):
    """同一个测试在没改过的第 3 章上不报错：容差不是紧到连参考实现都过不了。"""
    ck = next(c for c in load_manifest() if c.chapter == 3)
    model = tiny_models["qwen3-untied"]
    assert not parity_failures(ck.entry_path, model, PROMPTS[:1], TINY_NEW_TOKENS, in_process=False)
    assert hf_greedy(str(model), PROMPTS[0], TINY_NEW_TOKENS)[0]  # HF 这一侧确实跑了
