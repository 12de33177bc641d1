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


# fp32 下每一步 logits 和 HF 的差允许到 LOGITS_RTOL × 这一步 HF logits 的最大绝对值。
# 来历（docs/testing.md「logits 的容差」）：参考检查点在全部小模型、页大小、tp、真模型上量到的最大相对差，乘上余量。
LOGITS_RTOL = 1e-4


def logits_report(i: int, prompt: str, ref_logits: torch.Tensor, our_logits: torch.Tensor | None, decode) -> str | None:
    """token 全对之后再看 logits：写死了一个 config 字段（比如 rms_norm_eps）的实现，token 可能恰好不翻，logits 一定偏。
    在容差之内返回 None；否则说出第几个请求、第几步、max |Δ|、差最大的 token 和两边的 top-5。"""
    if our_logits is None:
        return (f"请求 {i}（提示词 {prompt[:40]!r}）：没有 --dump-logits 写出的 p{i}，对齐测试要逐步比 logits"
                "（docs/testing.md 的命令行契约）")
    if our_logits.shape != ref_logits.shape:
        return f"请求 {i}：--dump-logits 的 p{i} 形状是 {tuple(our_logits.shape)}，HF 是 {tuple(ref_logits.shape)}"
    delta = (our_logits.float() - ref_logits).abs()
    for step in range(len(ref_logits)):
        worst, at = delta[step].max(0)
        tol = LOGITS_RTOL * float(ref_logits[step].abs().max())
        if float(worst) > tol:
            t = int(at)
            return "\n".join([
                f"请求 {i}（提示词 {prompt[:40]!r}）：token 全对，但第 {step} 步（从 0 数）的 logits 超出容差："
                f"max |Δ logit| = {float(worst):.6g} > {tol:.3g}（{LOGITS_RTOL:g} × max |HF logit|）",
                f"  差最大的是 token {t} {decode([t])!r}：HF {float(ref_logits[step, t]):.6g}，"
                f"我们 {float(our_logits[step, t]):.6g}",
                f"  HF   top-5: {_top5(ref_logits[step], decode)}",
                f"  我们 top-5: {_top5(our_logits[step], decode)}",
            ])
    return None
