"""一步 decode 的去向：torch.profiler 数出调了多少个算子、算子自身的耗时里矩阵乘占多少。
其余的（RMSNorm、RoPE、注意力的小算子、形状变换）每个都要付一次调度开销，这一行说明固定开销从哪来。"""

from __future__ import annotations

from tools.bench.timing import PROMPTS, engine_requests

MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::mv", "minisgl::small_linear")  # 矩阵乘落到的算子


def profile_engine_decode(engine, tok) -> str:
    """bs=1：prefill、一步热身的 decode，再 profile 一步 decode。"""
    from torch.profiler import ProfilerActivity, profile

    one_step = engine_requests(engine, tok, PROMPTS[:1], 3)
    one_step("prefill")
    one_step("decode")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        one_step("decode")
    top = sum(1 for e in prof.events() if e.cpu_parent is None)  # 前向里直接调用的算子（不数算子内部再调的）
    total = sum(e.self_cpu_time_total for e in prof.key_averages())
    matmul = sum(e.self_cpu_time_total for e in prof.key_averages() if e.key in MATMUL_OPS)
    layers = engine.config.model_config.num_layers
    return (f"{top} 个 ATen 算子（{layers} 层，平均每层约 {top / layers:.0f} 个，含 view、reshape 这类不搬数据的）；"
            f"算子自身的耗时里矩阵乘占 {100 * matmul / max(total, 1e-9):.0f}%")
