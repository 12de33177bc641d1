"""不一致时说清楚在哪：哪个提示词、第几步第一次分叉、两边的 top-5、那一步 logits 的最大差。"""

from __future__ import annotations

import torch


def _top5(logits: torch.Tensor, decode) -> str:
    vals, ids = logits.float().topk(5)
    return ", ".join(f"{int(i)}{decode([int(i)])!r}:{float(v):.4f}" for v, i in zip(vals, ids))


def mismatch_report(prompt: str, ours: list[int], ref: list[int], ref_logits: torch.Tensor,
                    our_logits: torch.Tensor | None, decode) -> str | None:
    """两边一致时返回 None；否则返回一段可读的报告。"""
    if ours == ref:
        return None
    step = next(i for i, (a, b) in enumerate(zip(ours, ref)) if a != b) if len(ours) == len(ref) else 0
    lines = [
        f"提示词 {prompt[:60]!r}：第 {step} 步（从 0 数）第一次分叉",
        f"  HF   选 {ref[step]} {decode([ref[step]])!r}；top-5: {_top5(ref_logits[step], decode)}",
        f"  我们 选 {ours[step]} {decode([ours[step]])!r}；"
        + (f"top-5: {_top5(our_logits[step], decode)}" if our_logits is not None
           else "（没有 --dump-logits，取不到我们这边的 top-5）"),
    ]
    if our_logits is not None and our_logits.shape == ref_logits.shape:
        lines.append(f"  这一步 max |Δ logit| = {(our_logits[step].float() - ref_logits[step]).abs().max():.6g}")
    lines.append(f"  HF  : {ref}")
    lines.append(f"  我们: {ours}")
    return "\n".join(lines)
