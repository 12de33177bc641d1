"""Hugging Face transformers 参考：fp32、eager 注意力、贪心，正好 N 个新 token（不因 EOS 提前停）。"""

from __future__ import annotations

import functools
from pathlib import Path

import torch


@functools.lru_cache(maxsize=4)
def load_hf(model_dir: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    return model.eval(), AutoTokenizer.from_pretrained(model_dir)


@functools.lru_cache(maxsize=64)
def hf_greedy(model_dir: str | Path, prompt: str, n: int) -> tuple[list[int], torch.Tensor]:
    """返回 (n 个 token, 每一步的 logits (n, vocab))。

    自己写贪心循环而不用 generate()：generate 会在 EOS 处停下，而我们要求两边都正好生成 n 个。
    每一步仍然是 HF 自己的 forward 和 KV 缓存。"""
    model, tok = load_hf(str(model_dir))
    ids = torch.tensor([tok(prompt).input_ids])
    tokens, logits = [], []
    with torch.inference_mode():
        out = model(ids, use_cache=True)
        for _ in range(n):
            step_logits = out.logits[0, -1].float()
            logits.append(step_logits)
            tokens.append(int(step_logits.argmax()))
            out = model(torch.tensor([[tokens[-1]]]), cache=out.cache, use_cache=True)
    return tokens, torch.stack(logits)


def hf_tensors(model_dir: str | Path) -> dict[str, torch.Tensor]:
    """按 HF 原名读检查点里的全部张量（测试自己读，不经过被测的加载器）。"""
    from safetensors import safe_open

    out = {}
    for file in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            out.update({k: f.get_tensor(k) for k in f.keys()})
    return out


def encode(model_dir: str | Path, prompt: str) -> list[int]:
    return load_hf(str(model_dir))[1](prompt).input_ids
