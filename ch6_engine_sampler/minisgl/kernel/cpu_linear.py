"""CPU 上 fp32 线性层的核：F.linear（MKL sgemm）、oneDNN 吃普通布局、oneDNN 吃加载后重排（prepack）的布局、
把权重按输出切成几块交给一次 torch.bmm（每个线程从头到尾读自己那几块）。

哪个快因 CPU 而异（见附录"CPU 上的矩阵乘"）：同样 2 核，有的机器 MKL 在 1 行时最快，有的机器 oneDNN 快一倍；
重排的布局在 4 行时最快，在 1 行时有的机器反而慢。所以不写死，而是在本进程、本机器上，每种形状量一次再选。

- linear(x, w, b)：前向里的矩阵乘；w 可以是普通张量，也可以是 prepare_linear_weights 换上的重排张量。
- prepare_linear_weights(owners, rows)：加载后调一次。owners 是有 .weight 的算子，rows 是会用到的行数（batch 大小）。
  按形状分组量一遍，记下每个 (形状, 行数) 用哪个核；选了重排布局的，把 owner.weight 换成重排过的张量。
- 权重不大（装得进缓存，比如测试用的小模型）时不量，全用 F.linear：量出来的是缓存的速度，而且白花时间。
- torch 没有 oneDNN 的两个内部算子（别的平台、别的构建）时不量 oneDNN 的两种做法。
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Iterable, Sequence

import torch
import torch.nn.functional as F

ONEDNN = (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
          and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))
KERNELS = ("F.linear", "onednn", "packed", "bmm")  # 后三个只对 CPU 上的 fp32 有意义
MIN_BYTES = 128 << 20  # 线性层权重合计不到这么多就不量：小于几倍 L3 时量到的是缓存，不是 decode 时的内存
SAMPLE_BYTES = 64 << 20  # 每种形状最多拿这么多权重来量：超过常见的 L3（32 MiB），又不至于让加载变慢
MARGIN = 0.05  # 别的做法至少快 5% 才换：噪声里的差别不值得走内部算子

# (out, in, 行数) -> 核的名字（"F.linear"、"onednn" 或 "bmm/块数"），行数从 1 到量过的最大行数；
# 重排过的权重不查表（只能走 oneDNN）
_choice: dict[tuple[int, int, int], str] = {}
_max_rows: dict[tuple[int, int], int] = {}  # 每种形状量过的最大行数：更多行（prefill）时照它选
# 每次测量的记录，给基准和测试看：(out, in) -> {"layout": ..., "ms": {(核, 行数): 最快毫秒}}
report: dict[tuple[int, int], dict] = {}


def pack(w: torch.Tensor, rows: int) -> torch.Tensor:
    """(out, in) 的 fp32 CPU 权重 -> oneDNN 为 rows 行输入挑的分块布局（同形状，只能交给 linear）。"""
    packed = torch.ops.mkldnn._reorder_linear_weight(w, rows)
    packed.pack_rows = rows  # linear() 在行数更少时补 0 行到它
    return packed


def _onednn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")


# --8<-- [start:bmm]
def _bmm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None, *, blocks: int) -> torch.Tensor:
    """权重按输出切成 blocks 个连续的块（只是 view），一次 bmm 算完：torch 把 batch 维分给各个线程，
    每个线程顺着读完自己的块。行很少时，这在有的机器上比让一个矩阵乘在线程间细分读得快。"""
    (n, inp), out = x.shape, w.shape[0]
    y = torch.bmm(w.view(blocks, out // blocks, inp), x.t().expand(blocks, inp, n))  # (块, out/块, n)
    # reshape 在这里得到的是按列存的 view；后面的算子（和下一层的 bmm）吃按行存的快得多，所以整理一次（n = 1 时不搬）
    y = y.permute(2, 0, 1).reshape(n, out).contiguous()
    return y if b is None else y + b
# --8<-- [end:bmm]


_FNS: dict[str, Callable] = {"F.linear": F.linear, "onednn": _onednn}  # 名字 -> 普通布局的核；"bmm/块数" 按需添上


def _fn(name: str) -> Callable:
    if name not in _FNS:
        _FNS[name] = functools.partial(_bmm, blocks=int(name.split("/")[1]))
    return _FNS[name]


def bmm_blocks(out: int) -> list[int]:
    """bmm 试哪几种块数：线程数和它的两倍（能整除 out 的），让每个线程分到一样多的块。"""
    t = torch.get_num_threads()
    return [k for k in dict.fromkeys((t, 2 * t)) if k > 1 and out % k == 0]


# --8<-- [start:linear]
def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """x: (N, in)，w: (out, in)，b: (out,) 或 None -> (N, out)。按 prepare_linear_weights 量好的选择走。"""
    if w.is_mkldnn:
        n, rows = x.shape[0], w.pack_rows
        if n < rows:  # 这个布局是按 rows 行挑的：补 0 行再算（实测比只算那几行快），多出来的行丢掉
            return _onednn(F.pad(x, (0, 0, 0, rows - n)), w, b)[:n]
        return _onednn(x, w, b)
    if _choice and x.dim() == 2 and x.dtype == w.dtype == torch.float32 and x.is_cpu:
        out, inp = w.shape
        name = _choice.get((out, inp, min(x.shape[0], _max_rows.get((out, inp), 0))))
        if name is not None:
            return _FNS[name](x, w, b)
    return F.linear(x, w, b)
# --8<-- [end:linear]


def run_kernel(kernel: str, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """不看选择、直接走指定的核（测试和基准用）；"packed" 要先用 pack() 重排 w，"bmm/k" 要 k 整除输出维。"""
    name, _, blocks = kernel.partition("/")
    if name not in KERNELS or (name == "bmm") != bool(blocks) or (blocks and not blocks.isdigit()):
        raise ValueError(f"没有叫 {kernel!r} 的核；可选 F.linear、onednn、packed、bmm/块数（如 bmm/4）")
    if kernel == "F.linear":
        return F.linear(x, w, b)
    if name == "bmm":
        if w.is_mkldnn or w.dim() != 2 or int(blocks) < 1 or w.shape[0] % int(blocks):
            raise ValueError(f"核 {kernel!r}：权重 {tuple(w.shape)} 要是普通布局、输出维能被 {blocks} 整除")
        return _fn(kernel)(x, w, b)
    if not ONEDNN:
        raise RuntimeError(f"这个 torch 没有 oneDNN 的 linear / 权重重排算子，跑不了核 {kernel!r}")
    if (kernel == "packed") != w.is_mkldnn:
        raise ValueError(f"核 {kernel!r} 和权重的布局对不上：只有 'packed' 吃 pack() 重排过的权重")
    return linear(x, w, b) if w.is_mkldnn else _onednn(x, w, b)


def reset() -> None:
    """忘掉所有选择（测试和基准在同一进程里换设置时用）。已经重排过的权重不受影响。"""
    _choice.clear()
    _max_rows.clear()
    for name in [k for k in _FNS if k.startswith("bmm/")]:
        del _FNS[name]
    report.clear()


def forced_kernel() -> str | None:
    """环境变量 MINISGL_LINEAR=F.linear / onednn / packed / bmm 时不量，全用它（基准对照、排查数值差异用）。"""
    name = os.environ.get("MINISGL_LINEAR", "auto")
    if name == "auto":
        return None
    if name not in KERNELS:
        raise ValueError(f"MINISGL_LINEAR={name!r}：可选 auto 或 {', '.join(KERNELS)}")
    return name


def prepare_linear_weights(owners: Iterable[object], rows: Sequence[int], *, keep_layout: Iterable[torch.Tensor] = (),
                           kernel: str | None = None, min_bytes: int = MIN_BYTES) -> dict[tuple[int, int], str]:
    """加载后调用一次。owners：有 (out, in) 的 .weight 的算子，选了重排布局就把 .weight 换掉；
    keep_layout：也走 linear() 但不能换布局的权重（和词嵌入共用的 LM head）；rows：会用到的行数（batch 大小）。
    按形状分组，量出每种形状最快的做法并记下。kernel（或环境变量 MINISGL_LINEAR）给了就不量、直接用它。
    返回 {(out, in): 布局}，布局是 "F.linear"、"onednn"、"bmm/k"、"mixed"（不同行数不同核）或 "packed/r"。"""
    rows = sorted(set(rows))
    if not rows or rows[0] < 1:
        raise ValueError(f"rows={rows}：要给会用到的行数（batch 大小），都是正整数")
    kernel = kernel or forced_kernel()
    if kernel is not None and kernel not in KERNELS:
        raise ValueError(f"没有叫 {kernel!r} 的核；可选 {KERNELS}")
    groups: dict[tuple[int, int], list[tuple[torch.Tensor, object | None]]] = {}
    for w, o in [(o.weight, o) for o in owners] + [(w, None) for w in keep_layout]:
        if w.dim() != 2 or w.is_mkldnn:
            raise ValueError(f"权重形状 {tuple(w.shape)}（{type(o).__name__}）：要的是还没重排过的 (out, in) 矩阵")
        if w.is_cpu and w.dtype == torch.float32:  # 别的（GPU、bf16）本来就只走 F.linear
            groups.setdefault(tuple(w.shape), []).append((w, o))
    total = sum(w.numel() * 4 for g in groups.values() for w, _ in g)
    if kernel is None and total < min_bytes:
        return {}  # 小模型：全用 F.linear，什么也不量
    layouts = {}
    for shape, group in groups.items():
        can_pack = all(o is not None for _, o in group)
        per_row, packed_rows, ms = _plan([w for w, _ in group], rows, kernel, can_pack)
        report[shape] = {"ms": ms}
        _max_rows[shape] = rows[-1]
        if packed_rows:
            for _, o in group:
                o.weight = pack(o.weight, packed_rows)
            layouts[shape] = f"packed/{packed_rows}"
        else:
            # 没量过的行数（decode 的 batch 变小时）照下一个量过的行数选；更多行（prefill）时 linear() 照最多的那个选
            _choice.update({(*shape, n): per_row[next(r for r in rows if r >= n)] for n in range(1, rows[-1] + 1)})
            kinds = set(per_row.values())
            for name in kinds:
                _fn(name)  # 选中的 bmm/k 登记进 _FNS：linear() 直接查表
            layouts[shape] = kinds.pop() if len(kinds) == 1 else "mixed"
        report[shape]["layout"] = layouts[shape]
    return layouts


def _plan(weights: list[torch.Tensor], rows: list[int], kernel: str | None, can_pack: bool
          ) -> tuple[dict[int, str], int, dict]:
    """-> (普通布局时每个行数用的核, 重排时按几行（0 = 不重排）, 量到的毫秒)。"""
    plain = ["F.linear", *(["onednn"] if ONEDNN else []), *(f"bmm/{k}" for k in bmm_blocks(weights[0].shape[0]))]
    packs = rows if ONEDNN and can_pack else []
    if kernel is not None:  # 指定了核：这种形状用不了它（没有 oneDNN、块数不整除）就退回 F.linear
        if kernel == "packed" and packs:
            return {}, rows[-1], {}
        want = "onednn" if kernel == "packed" else kernel  # 共用的 LM head 不能重排：走 oneDNN 的普通布局
        return dict.fromkeys(rows, next((p for p in plain if p.split("/")[0] == want), "F.linear")), 0, {}
    sample, size = [], 0
    for w in weights:  # 拿前几个同形状的权重量：装不进 L3，才和 decode 时一样是从内存读
        sample.append(w)
        size += w.numel() * 4
        if size >= SAMPLE_BYTES:
            break
    flush = torch.ones(SAMPLE_BYTES // 4) if size < SAMPLE_BYTES else torch.empty(0)  # 样本太小：每次先冲掉缓存
    cands = {name: (_fn(name), sample) for name in plain}
    cands.update({f"packed/{r}": (linear, [pack(w, r) for w in sample]) for r in packs})
    xs = {n: torch.randn(n, sample[0].shape[1]) for n in rows}
    ms: dict[tuple[str, int], float] = {}
    for _ in range(3):  # 几个核轮流量、取最快：共用机器上的噪声摊到每个核头上
        for name, (fn, ws) in cands.items():
            for n in rows:
                flush.sum()
                t0 = time.perf_counter()
                for w in ws:
                    fn(xs[n], w)
                t = (time.perf_counter() - t0) * 1e3
                ms[(name, n)] = min(ms.get((name, n), t), t)
    # 别的核至少快 MARGIN 才换掉 F.linear；重排也至少快 MARGIN 才值得（噪声里的差别不值得走别的路）
    per_row = {}
    for n in rows:
        best = min(plain, key=lambda p: ms[(p, n)])
        per_row[n] = best if ms[(best, n)] < ms[("F.linear", n)] * (1 - MARGIN) else "F.linear"
    plain_ms = sum(ms[(per_row[n], n)] for n in rows)
    packed = {r: sum(ms[(f"packed/{r}", n)] for n in rows) for r in packs}
    best_r = min(packed, key=packed.get, default=0)
    if best_r and packed[best_r] < plain_ms * (1 - MARGIN):
        return {}, best_r, ms
    return per_row, 0, ms


def prepare_model(model: object, rows: Sequence[int], **kwargs) -> dict[tuple[int, int], str]:
    """Engine 加载完权重后调一次：找出模型里所有线性层和 LM head，交给 prepare_linear_weights。
    和词嵌入共用权重的 LM head 只选核、不换布局（查词表要普通布局）。
    先忘掉之前的选择：同一进程里先后建的 Engine 各按自己的设置（和当时的 MINISGL_LINEAR）选。"""
    from minisgl.layers.embedding import ParallelLMHead
    from minisgl.layers.linear import _LinearTPImpl

    reset()

    owners, keep = [], []
    for op in _walk(model):
        if isinstance(op, ParallelLMHead):
            tied = getattr(op, "tied_embedding", getattr(op, "_tied", None))  # 第 2 章改名前叫 _tied
            if tied is None:
                owners.append(op)
            else:
                keep.append(tied.weight)
        elif isinstance(op, _LinearTPImpl):
            owners.append(op)
    return prepare_linear_weights(owners, rows, keep_layout=keep, **kwargs)


def _walk(op: object, seen: set[int] | None = None) -> Iterable[object]:
    """按属性（和 OPList 的列表）把算子树走一遍；下划线开头的属性是借来的，不走。"""
    seen = set() if seen is None else seen
    if id(op) in seen or not hasattr(op, "__dict__"):
        return
    seen.add(id(op))
    yield op
    for name, value in vars(op).items():
        if name.startswith("_") or isinstance(value, torch.Tensor):
            continue
        for child in value if isinstance(value, list) else [value]:
            if hasattr(child, "forward"):
                yield from _walk(child, seen)
