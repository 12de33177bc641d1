"""在检查点自己的进程里记录每一步的引擎状态（python -m tools.trace 起这个进程，读者不直接用它）。

不改章节代码：只在类上换掉两个官方名字的方法——Context.forward_batch（batch 准备好、前向开始的地方）和
Req.append_host（采样出的 token 写回请求的地方），第 6 章另包一层 Engine.__init__ 认出假页。
所以检查点用的是它自己的 generate.py 和它自己的每一步，读者写的版本也一样。

    python -m tools.trace.record OUT.json -- generate.py 的参数 ...   # 在检查点目录里、PYTHONPATH 含仓库根目录
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import io
import json
import sys
from typing import Any


def _ints(t: Any) -> list:
    """张量（任意维）或整数序列 -> 纯 Python 列表；bool 记成 0/1。"""
    if hasattr(t, "tolist"):
        t = t.detach().cpu()
        if t.dtype.is_floating_point:
            return t.tolist()
        return t.int().tolist()
    return [_ints(x) if isinstance(x, (list, tuple)) else int(x) for x in t]


class Recorder:
    """一步一条记录：prepared（进 ctx.forward_batch 时）+ after（这个 batch 的请求都 append_host 之后）。"""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self.steps: list[dict] = []
        self.prompt_len: dict[int, int] = {}
        self.vocab: dict[int, str] = {}
        self.dummy_page: int | None = None
        self._open: dict | None = None  # 还没收齐采样结果的那一步
        self._reqs: list = []

    def _text(self, ids: list[int]) -> str:
        for t in ids:
            if t not in self.vocab:
                self.vocab[t] = self.tok.decode([t])
        return self.tok.decode(ids)

    def prepared(self, ctx: Any, batch: Any) -> None:
        self.finish()  # 上一步有请求没 append_host：按收到的为准收尾
        reqs = list(batch.reqs)
        padded = list(getattr(batch, "padded_reqs", reqs))
        rec: dict[str, Any] = {"phase": batch.phase, "reqs": [], "sampled": [None] * len(reqs)}
        for r in reqs:
            tokens = _ints(r.input_ids)
            self.prompt_len.setdefault(r.uid, len(tokens))
            self._text(tokens)
            rec["reqs"].append({"uid": r.uid, "table_idx": r.table_idx, "cached_len": r.cached_len,
                                "device_len": r.device_len, "extend_len": r.extend_len,
                                "prompt_len": self.prompt_len[r.uid], "tokens": tokens})
        rec["dummies"] = [{"table_idx": r.table_idx, "cached_len": r.cached_len, "device_len": r.device_len}
                          for r in padded[len(reqs):]]
        for name in ("positions", "input_ids", "out_loc"):
            rec[name] = _ints(getattr(batch, name)) if hasattr(batch, name) else None
        self._text(rec["input_ids"] or [])
        rec.update(self._pool(ctx, reqs, padded))
        meta = getattr(batch, "attn_metadata", None)
        rec["attn"] = None if meta is None else self._meta(meta)
        self.steps.append(rec)
        self._open, self._reqs = rec, reqs

    @staticmethod
    def _meta(meta: Any) -> dict:
        items = ({f.name: getattr(meta, f.name) for f in dataclasses.fields(meta)} if dataclasses.is_dataclass(meta)
                 else dict(vars(meta)))
        out = {}
        for k, v in items.items():
            if hasattr(v, "tolist") or (isinstance(v, (list, tuple)) and all(isinstance(x, (int, tuple)) for x in v)):
                out[k] = _ints(v)
        return out

    def _pool(self, ctx: Any, reqs: list, padded: list) -> dict:
        """页表的行（到 device_len 为止）、每个槽位归谁、用到哪些页；第 1~3 章没有池，全是 None。"""
        table = getattr(ctx, "page_table", None)
        pool = getattr(ctx, "kv_cache", None)
        num_pages = getattr(pool, "num_pages", None)
        if table is None or not hasattr(table, "shape") or num_pages is None:
            return {"page_table": None, "pool": None, "slots": None, "pages": None}
        ps = ctx.page_size
        rows = [_ints(table[r.table_idx, :r.device_len]) for r in padded]
        slots, pages = [], set()
        for i, (r, row) in enumerate(zip(padded, rows)):
            uid = r.uid if i < len(reqs) else -1  # -1：凑批的假请求
            for pos, s in enumerate(row):
                slots.append([s, uid, pos])
                pages.add(s // ps)
        return {"page_table": rows, "slots": slots, "pages": sorted(pages),
                "pool": {"num_pages": int(num_pages), "page_size": ps, "dummy_page": self.dummy_page}}

    def sampled(self, req: Any, token: int) -> None:
        if self._open is None:
            return
        for i, r in enumerate(self._reqs):
            if r is req:
                self._open["sampled"][i] = token
        if all(t is not None for t in self._open["sampled"]):
            self.finish()

    def finish(self) -> None:
        """收尾一步：前向之后每个请求的三个长度，和到这一步为止生成的文字。"""
        rec, self._open = self._open, None
        if rec is None:
            return
        rec["after"] = [{"uid": r.uid, "cached_len": r.cached_len, "device_len": r.device_len,
                         "extend_len": r.extend_len} for r in self._reqs]
        rec["texts"] = [self._text(_ints(r.input_ids)[self.prompt_len[r.uid]:]) for r in self._reqs]


def install(recorder: Recorder) -> None:
    """换掉 Context.forward_batch 和 Req.append_host（按名字包一层，不复制它们的函数体）。"""
    from minisgl import core

    forward_batch, append_host = core.Context.forward_batch, core.Req.append_host

    @contextlib.contextmanager
    def traced_forward_batch(self, batch):
        recorder.prepared(self, batch)
        with forward_batch(self, batch):
            yield

    def traced_append_host(self, next_token):
        append_host(self, next_token)
        recorder.sampled(self, int(next_token.reshape(-1)[0]))

    core.Context.forward_batch, core.Req.append_host = traced_forward_batch, traced_append_host
    try:
        from minisgl.engine import Engine  # 第 6 章起：池的最后一页是假页
    except ImportError:
        return
    init = Engine.__init__

    def traced_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        recorder.dummy_page = getattr(self, "num_pages", None)

    Engine.__init__ = traced_init


def record(gen_args: list[str], model: str) -> dict:
    """用检查点自己的 generate.main 跑一遍，返回记录；检查点报错时记下原因和已经走完的步。"""
    from transformers import AutoTokenizer

    rec = Recorder(AutoTokenizer.from_pretrained(model))
    install(rec)
    generate = importlib.import_module("generate")
    out, err, error = io.StringIO(), io.StringIO(), None
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            generate.main(gen_args)
    except SystemExit as e:
        if e.code not in (0, None):
            lines = err.getvalue().strip().splitlines() or [f"退出码 {e.code}"]
            error = e.code if isinstance(e.code, str) else lines[-1]
    except Exception as e:  # noqa: BLE001  读者的代码抛什么都要记下来，已经走完的步照样保留
        error = f"{type(e).__name__}: {e}"
    rec.finish()
    return {"steps": rec.steps, "vocab": {str(k): v for k, v in rec.vocab.items()}, "error": error}


def main(argv: list[str]) -> int:
    out_path, gen_args = argv[0], argv[2:]
    model = gen_args[gen_args.index("--model") + 1]
    result = record(gen_args, model)
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(result, f, ensure_ascii=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
