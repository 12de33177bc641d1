"""decode 一步的第二个下限：算。读的下限（权重字节数 / 读带宽）在 memory.py；这里是"乘加次数 / 乘加的峰值"。

batch 里每多一个请求，读的权重不变，乘加却多一份：bs 个请求一步要做 bs × matmul_macs 次乘加。
乘加的峰值在大多数 CPU 上远高于读带宽能喂的，这个下限远低于读的那个；在乘加单元窄的 CPU 上（比如把 512 位
乘加拆成两半做的 AMD Zen 4），bs=4 时它就不能不算了。核把读和算叠起来时，一步接近两者里大的那个；
叠不起来时接近两者之和。
"""

from __future__ import annotations

import time


def fma_rate(seconds: float = 0.3) -> tuple[float, str] | None:
    """这台机器每秒能做多少次 float 乘加（所有线程加起来）和一句怎么量的：第 6 章 C++ 核的 fma_peak，核自己的
    向量宽度、核自己的线程，连续做约 `seconds` 秒。核用不了时是 None（那时线性层走 F.linear，没有"核的峰值"可言）。"""
    from minisgl.kernel import extension  # 调用方已经 use_checkpoint 到第 6 章

    ext = extension()
    if ext is None:
        return None
    iters = 1 << 16
    ext.fma_peak(iters)  # 热身：线程起来、频率升上去
    while True:  # 翻倍到一次约 seconds 秒：太短的一次量的是起线程的开销
        t0 = time.perf_counter()
        rate = ext.fma_peak(iters)
        if time.perf_counter() - t0 >= seconds:
            break
        iters *= 2
    how = (f"C++ 的 fma_peak：{ext.num_threads()} 个线程，每个线程十几串互不依赖的向量乘加"
           f"（一次 {ext.vector_width} 个 float），连续约 {seconds:g} 秒；几轮里取最快的一轮")
    return rate, how


def matmul_macs(engine) -> int:
    """一个请求 decode 一步的矩阵乘要做多少次乘加：每个线性层和 LM head 的权重元素各乘加一次。
    词嵌入是查表不是乘：没有和 LM head 绑定时不算；绑定时那一份就是 LM head 的权重，算一次。
    注意力里 q·k、p·v 的乘加随上下文长度变，这里的短上下文（几十个 token）里它们不到百分之一，不算。"""
    tied = engine.config.model_config.tie_word_embeddings
    return sum(t.numel() for name, t in engine.model.state_dict().items()
               if t.dim() == 2 and (tied or not name.endswith("embed_tokens.weight")))
