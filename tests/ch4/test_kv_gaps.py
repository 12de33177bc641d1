"""第 4 章：输出碰巧对、实现其实错了的几种情况（causal mask 或顺序分配会把它们藏起来）。"""

import math

import torch

from minisgl.kvcache import MHAKVCache
from tests.harness import parity
from tests.harness.contract import build_argv, parse_outputs, run_in_process

PROMPTS = ["The capital of France is", "def fibonacci(n):"]


def _patch_pool(monkeypatch, fill: float | None = None) -> list[int]:
    """让每个新建的 MHAKVCache 记下页数，并（可选）把整个池填成 fill。"""
    seen: list[int] = []
    init = MHAKVCache.__init__

    def patched(self, *args, **kwargs):
        init(self, *args, **kwargs)
        seen.append(kwargs["num_pages"] if "num_pages" in kwargs else args[3])
        if fill is not None:
            for layer in range(self.num_layers):
                self.k_cache(layer).fill_(fill)
                self.v_cache(layer).fill_(fill)

    monkeypatch.setattr(MHAKVCache, "__init__", patched)
    return seen


def test_task2_only_the_request_own_slots_are_read(checkpoint, tiny_models, monkeypatch):
    """池先填满 NaN，页给得远多于需要：取历史只能取 page_table[行, :device_len]。
    取整行的话，行尾指向的槽位 0 从没写过，V 里的 NaN 乘上被 mask 成 0 的权重还是 NaN，输出就乱了。"""
    model, n = tiny_models["llama3"], 6
    base = parity.generate(checkpoint.entry_path, model, PROMPTS, n, 4)
    _patch_pool(monkeypatch, float("nan"))
    argv = build_argv(model, PROMPTS, n, 4) + ["--num-pages", "64"]
    assert parse_outputs(run_in_process(checkpoint.entry_path, argv), len(PROMPTS), n) == base


def test_task4_default_pool_is_exactly_what_is_needed(checkpoint, tiny_models, monkeypatch):
    """不给 --num-pages 时页数"正好够用"：每个请求写 len + n - 1 个位置的 KV，按页向上取整再求和。"""
    from transformers import AutoTokenizer

    model, n, ps = tiny_models["llama3"], 5, 4
    seen = _patch_pool(monkeypatch)
    run_in_process(checkpoint.entry_path, build_argv(model, PROMPTS, n, ps))
    tok = AutoTokenizer.from_pretrained(model)
    need = sum(math.ceil((len(tok(p).input_ids) + n - 1) / ps) for p in PROMPTS)
    assert seen, "没有建 MHAKVCache"
    assert seen[-1] <= need + (1 if checkpoint.chapter >= 6 else 0), f"默认建了 {seen[-1]} 页，只需要 {need} 页"


def test_task2_nan_pool_really_changes_output_when_whole_row_is_read():
    """上面 NaN 哨兵的前提：被 mask 成 0 的权重乘上 NaN 的 V 仍是 NaN。"""
    w = torch.tensor([1.0, 0.0])
    v = torch.tensor([2.0, float("nan")])
    assert torch.isnan((w * v).sum())


def test_task2_pages_come_from_the_tail_so_they_are_not_contiguous(checkpoint, tiny_models, monkeypatch):
    """页从空闲列表尾部拿：prefill 里按请求顺序拿到的页号严格递减（文档的例子：请求 0 拿 3、2，请求 1 拿 1）。
    从头部拿时槽位恰好连续，绕过 page table、按"起点 + 偏移"读槽位的实现也能蒙对；这里把它们分开。"""
    from minisgl.core import get_global_ctx

    model, n, ps = tiny_models["llama3"], 3, 4
    first: list[torch.Tensor] = []
    store = MHAKVCache.store_kv

    def recording(self, k, v, out_loc, layer_id):
        if not first and get_global_ctx().batch.is_prefill:  # GPU 上引擎先录 decode 的 CUDA 图：那几次不算
            first.append(out_loc.clone())
        return store(self, k, v, out_loc, layer_id)

    monkeypatch.setattr(MHAKVCache, "store_kv", recording)
    run_in_process(checkpoint.entry_path, build_argv(model, PROMPTS, n, ps))
    assert first, "prefill 没有调用 store_kv"
    pages = []
    for page in (first[0].long() // ps).tolist():
        if not pages or pages[-1] != page:
            pages.append(page)
    why = f"prefill 按顺序拿到的页是 {pages}：应当从空闲列表尾部拿，页号严格递减"
    assert len(pages) > 1, why
    assert all(a > b for a, b in zip(pages, pages[1:])), why


def test_task2_input_ids_come_from_the_token_pool(checkpoint, tiny_models, monkeypatch):
    """decode 的 input_ids 要从 token pool 取（阶段二的调度器只看得到它），不能从 Req.input_ids 取：
    让 append_host 往 Req.input_ids 里接一个错的 token，token pool 不受影响，输出就必须不变。"""
    from minisgl.core import Req

    model, n = tiny_models["llama3"], 6
    base = parity.generate(checkpoint.entry_path, model, PROMPTS, n, 4)

    def wrong_append(self, next_token):
        self.input_ids = torch.cat([self.input_ids, (next_token.to(self.input_ids.dtype) + 1) % 50])

    monkeypatch.setattr(Req, "append_host", wrong_append)
    argv = build_argv(model, PROMPTS, n, 4)
    assert parse_outputs(run_in_process(checkpoint.entry_path, argv), len(PROMPTS), n) == base
