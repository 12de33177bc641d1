"""python course.py trace（tools/trace/）：记下的数就是引擎自己的张量；--against 找得到埋下的错、自己对自己找不到；
HTML 不取网络资源；坏参数只有一行"错误：…"。

引擎自己的张量由另一个"探针"读：它按名字包住检查点的 forward_batch（第 6 章是 Engine.forward_batch），
在前向前后各拷一份 batch、页表、注意力元数据和采样结果，再看 KV 池里哪些槽位真的被写过（池开始时全是 0）。
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tools.manifest import ROOT, find_checkpoint
from tools.trace.cli import run_trace, trace
from tools.trace.diff import first_difference
from tools.trace.html import render

PROMPTS = ["hello world how are you", "你好", "abc"]  # 小模型的分词器下长度 15、3、2
NEW = 5
ENV = dict(os.environ, OMP_NUM_THREADS="1")

SPY = r'''
import importlib, json, sys
import torch
from tools.trace import record as trace_record

out, model, gen_args = sys.argv[1], sys.argv[2], sys.argv[3:]
generate = importlib.import_module("generate")
from minisgl.core import get_global_ctx
seen = []


def spy(fn):
    def wrapped(*args, **kwargs):
        batch = next(a for a in args if hasattr(a, "phase"))
        ctx = get_global_ctx()
        snap = {name: getattr(batch, name).tolist() if hasattr(batch, name) else None
                for name in ("positions", "input_ids", "out_loc")}
        snap["phase"] = batch.phase
        snap["reqs"] = [[r.uid, r.table_idx, r.cached_len, r.device_len] for r in batch.reqs]
        snap["page_table"] = ctx.page_table.clone().tolist() if hasattr(ctx, "page_table") else None
        meta = getattr(batch, "attn_metadata", None)
        snap["attn"] = None if meta is None else {
            k: v.int().tolist() for k, v in vars(meta).items() if isinstance(v, torch.Tensor)}
        res = fn(*args, **kwargs)
        tokens = res.next_tokens_cpu if hasattr(res, "next_tokens_cpu") else res[0]
        snap["sampled"] = tokens.tolist()
        snap["after"] = [[r.cached_len, r.device_len] for r in batch.reqs]
        pool = getattr(ctx, "kv_cache", None)
        if hasattr(pool, "k_cache"):  # 哪些槽位的 K 不再是 0：真的写过
            k = pool.k_cache(0)
            snap["written"] = torch.nonzero(k.reshape(k.shape[0] * k.shape[1], -1).abs().sum(-1)).flatten().tolist()
        seen.append(snap)
        return res
    return wrapped


if hasattr(generate, "Engine"):
    generate.Engine.forward_batch = spy(generate.Engine.forward_batch)
else:
    generate.forward_batch = spy(generate.forward_batch)
result = trace_record.record(gen_args, model)
json.dump({"trace": result, "spy": seen}, open(out, "w"))
'''


def _spied(ck_name: str, model: Path, ps: int, tmp_path: Path) -> tuple[dict, list]:
    ck = find_checkpoint(ck_name)
    script, out = tmp_path / "spy.py", tmp_path / "spy.json"
    script.write_text(SPY, encoding="utf-8")
    args = [a for p in PROMPTS for a in ("--prompt", p)] + ["--model", str(model), "--max-new-tokens", str(NEW),
                                                           "--page-size", str(ps), "--json"]
    env = dict(ENV, PYTHONPATH=os.pathsep.join([str(ck.path), str(ROOT)]))
    res = subprocess.run([sys.executable, str(script), str(out), str(model), *args], cwd=ck.path, env=env,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads(out.read_text(encoding="utf-8"))
    return data["trace"], data["spy"]


@pytest.mark.parametrize("ck_name,family,ps", [("ch4", "llama3", 1), ("ch4", "llama3", 4), ("ch5", "qwen2", 1),
                                               ("ch5", "qwen2", 4), ("ch6", "llama3", 1), ("ch6", "qwen3-tied", 4),
                                               ("ch2", "qwen3-tied", 1)])
def test_recorded_numbers_are_the_engines_own_tensors(ck_name, family, ps, tiny_models, tmp_path):
    trace_data, spy = _spied(ck_name, tiny_models[family], ps, tmp_path)
    assert trace_data["error"] is None
    steps = trace_data["steps"]
    assert len(steps) == len(spy) == NEW
    assert len({len(r["tokens"]) for r in steps[0]["reqs"]}) == 3, "3 个请求的长度应该各不相同"
    for k, (s, e) in enumerate(zip(steps, spy)):
        where = f"第 {k + 1} 步"
        assert s["phase"] == e["phase"] == ("prefill" if k == 0 else "decode"), where
        for name in ("positions", "input_ids", "out_loc"):
            assert s[name] == e[name], f"{where} {name}"
        assert [[r["uid"], r["table_idx"], r["cached_len"], r["device_len"]] for r in s["reqs"]] == e["reqs"], where
        assert [[a["cached_len"], a["device_len"]] for a in s["after"]] == e["after"], where
        assert s["sampled"] == e["sampled"], where
        if e["page_table"] is None:  # 第 1~3 章：没有池，记录里也什么都不编
            assert s["page_table"] is s["pool"] is s["slots"] is None and s["out_loc"] is None, where
            continue
        rows = [e["page_table"][r["table_idx"]][:r["device_len"]] for r in s["reqs"]]
        assert s["page_table"] == rows, f"{where} 页表"
        assert s["pool"]["page_size"] == ps, where
        assert s["pages"] == sorted({slot // ps for row in rows for slot in row}), where
        cached = {r["uid"]: a["cached_len"] for r, a in zip(s["reqs"], s["after"])}
        filled = sorted(slot for slot, uid, p in s["slots"] if p < cached[uid])
        assert filled == sorted(e["written"]), f"{where}：记录说写过的槽位和 KV 池里真写过的不一样"
        if e["attn"] is not None:
            for name, value in e["attn"].items():
                assert s["attn"][name] == value, f"{where} attn_metadata.{name}"
            assert ("decode_slots" in e["attn"]) == (k > 0), where
        else:
            assert s["attn"] is None, where


def _copy_with_bug(tmp_path: Path, old: str, new: str) -> Path:
    dest = tmp_path / "my_ch4"
    shutil.copytree(ROOT / "ch4_kv_pool", dest, ignore=shutil.ignore_patterns("__pycache__"))
    src = (dest / "generate.py").read_text(encoding="utf-8")
    assert src.count(old) == 1, f"ch4 的 generate.py 里找不到要改的那一行：{old}"
    (dest / "generate.py").write_text(src.replace(old, new), encoding="utf-8")
    return dest


def _argv(tiny: Path, out: Path, ps: int = 4) -> list[str]:
    return [a for p in PROMPTS for a in ("--prompt", p)] + ["--model", str(tiny), "--max-new-tokens", "4",
                                                           "--page-size", str(ps), "-o", str(out)]


def test_against_names_a_page_index_rounded_down(tiny_models, tmp_path):
    """分页时页号向下取整：第 1 步 prefill，请求 0 位置 12 起（第 4 页）就写错了槽位。"""
    mine = _copy_with_bug(tmp_path, "range(div_ceil(req.cached_len, ps), div_ceil(req.device_len, ps))",
                          "range(req.cached_len // ps, req.device_len // ps)")
    out = tmp_path / "t.html"
    res = subprocess.run([sys.executable, "-m", "tools.trace", str(mine), "--as", "ch4", "--against", "ch4",
                          *_argv(tiny_models["llama3"], out)], cwd=ROOT, env=ENV, capture_output=True, text=True)
    assert res.returncode == 1, res.stdout + res.stderr
    first = res.stdout.splitlines()[0]
    m = re.fullmatch(r"第 1 步 prefill：out_loc\[(\d+)\] 是 (\d+)，参考是 (\d+)（请求 0 的位置 (\d+)）", first)
    assert m, first
    j, ours, ref, p = map(int, m.groups())
    assert j == p == 12 and ours != ref  # 提示词 15 个 token、每页 4 个：位置 12~14 在第 4 页，向下取整时没有分配
    page = out.read_text(encoding="utf-8")
    data = json.loads(re.search(r'<script type="application/json" id="trace-data">(.*?)</script>', page, re.S)
                      .group(1).replace("<\\/", "</"))
    a, b = (t["steps"][0] for t in data["traces"])
    assert a["out_loc"][:j] == b["out_loc"][:j] and (a["out_loc"][j], b["out_loc"][j]) == (ours, ref)
    assert a["positions"] == b["positions"] and a["input_ids"] == b["input_ids"]
    assert data["diff"] == {"step": 0, "state": "prepared", "key": f"out_loc:{j}", "message": first}


def test_against_names_a_later_decode_step(tiny_models, tmp_path):
    """每个请求的新 token 都写成请求 0 的：prefill 全对，第 2 步 decode 请求 1 的 input_ids 才错。"""
    mine = _copy_with_bug(tmp_path, "slots.token_pool[r.table_idx, r.device_len - 1] = next_tokens[i]",
                          "slots.token_pool[r.table_idx, r.device_len - 1] = next_tokens[0]")
    traces, diff, _ = trace([str(mine), "--as", "ch4", "--against", "ch4", *_argv(tiny_models["llama3"],
                                                                                  tmp_path / "t.html")])
    ours, ref = traces[0]["steps"][1]["input_ids"], traces[1]["steps"][1]["input_ids"]
    assert ours[0] == ref[0] and ours[1] != ref[1], (ours, ref)
    assert diff["step"] == 1 and diff["key"] == "input_ids:1"
    assert diff["message"] == f"第 2 步 decode：input_ids[1] 是 {ours[1]}，参考是 {ref[1]}（请求 1 的位置 3）"


def test_against_itself_finds_nothing(tiny_models, tmp_path):
    out = tmp_path / "t.html"
    res = subprocess.run([sys.executable, "-m", "tools.trace", "ch5", "--against", "ch5",
                          *_argv(tiny_models["qwen2"], out)], cwd=ROOT, env=ENV, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.startswith("和参考 ch5_attention 逐步逐字段相同（4 步）"), res.stdout
    assert "和参考逐步逐字段相同" in out.read_text(encoding="utf-8")


def test_against_reports_a_checkpoint_that_crashes_mid_run(tiny_models, tmp_path):
    """读者的代码在第 3 步抛异常：已经走完的步照样比，报"没有走到这一步"和它的错误。"""
    mine = _copy_with_bug(tmp_path, "    ctx = get_global_ctx()\n    batch = Batch(reqs=reqs, phase=phase)",
                          "    ctx = get_global_ctx()\n    if reqs[0].cached_len > 15:\n"
                          "        raise RuntimeError('页表写满了')\n    batch = Batch(reqs=reqs, phase=phase)")
    traces, diff, _ = trace([str(mine), "--as", "ch4", "--against", "ch4", *_argv(tiny_models["llama3"],
                                                                                  tmp_path / "t.html")])
    assert len(traces[0]["steps"]) == 2 and traces[0]["error"] == "页表写满了"
    assert diff["message"] == "第 3 步 decode：你的检查点没有走到这一步（它出错了：页表写满了）"


def _record(steps: list[dict], error: str | None = None) -> dict:
    return {"checkpoint": "x", "steps": steps, "error": error}


def test_first_difference_orders_fields_like_the_batch_is_filled():
    step = {"phase": "decode", "reqs": [{"uid": 0, "table_idx": 0, "cached_len": 5, "device_len": 6, "extend_len": 1}],
            "positions": [5], "input_ids": [7], "out_loc": [9], "page_table": [[1, 2, 3, 4, 5, 9]],
            "attn": {"cu_seqlens_q": [0, 1]}, "sampled": [3],
            "after": [{"uid": 0, "cached_len": 6, "device_len": 7, "extend_len": 1}]}
    assert first_difference(_record([step]), _record([step])) is None
    changed = {**step, "out_loc": [8], "page_table": [[1, 2, 3, 4, 5, 8]], "sampled": [4]}
    d = first_difference(_record([step, changed]), _record([step, step]))
    assert (d["step"], d["key"]) == (1, "out_loc:0")
    assert d["message"] == "第 2 步 decode：out_loc[0] 是 8，参考是 9（请求 0 的位置 5）"
    d = first_difference(_record([step, {**step, "sampled": [4]}]), _record([step, step]))
    assert (d["state"], d["key"]) == ("after", "sampled:0")
    assert d["message"] == "第 2 步 decode：采样出的 token[0] 是 4，参考是 3"
    d = first_difference(_record([{**step, "attn": None}]), _record([step]))
    assert d["message"] == "第 1 步 decode：你的检查点没有 attn_metadata.cu_seqlens_q，参考有"
    d = first_difference(_record([step, step]), _record([step]))
    assert d["message"] == "第 2 步：参考已经结束，你的检查点多走了一步"


def test_html_takes_nothing_from_the_network(tiny_models, tmp_path):
    ck = find_checkpoint("ch6")
    t = run_trace(ck, tiny_models["qwen3-tied"], PROMPTS[:2], 2, 4)
    page = render([t], None)
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//|url\(\s*["']?\s*(https?:)?//|@import""", page, re.I)
    assert "http://" not in page and "https://" not in page
    assert not re.search(r"\bfetch\(|XMLHttpRequest|<link\b|<iframe\b", page)
    assert page.count("<script") == 2 and "<script src" not in page


BAD = [
    (["nope"], "找不到检查点 'nope'"),
    (["step0"], "第 0 步的骨架没有 Req 和 Batch"),
    (["ch3", "--page-size", "4"], "第 3 章还没有分页 KV"),
    (["ch4", "--page-size", "0"], "--page-size: 要一个正整数，收到 '0'"),
    (["ch4", "--max-new-tokens", "x"], "--max-new-tokens: 要一个正整数，收到 'x'"),
    (["ch1"], "llama3 是 model_type='llama'，第 1 章只支持 qwen3-tied、qwen3-untied"),
    (["ch4", "--against", "ch4", "--page-size", "1", "--page-size", "4"], "--against 只能配一个 --page-size"),
    (["ch4", "-o", "/no/such/dir/t.html"], "它所在的目录必须已经存在"),
    (["ch4", "--bogus"], "不认识的参数： --bogus"),
    (["ch4", "--prompt", ""], "0 个 token"),
]


@pytest.mark.parametrize("args,words", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_one_line_naming_the_problem(args, words, tiny_models, tmp_path):
    cmd = [sys.executable, "course.py", "trace", *args, "--model", str(tiny_models["llama3"])]
    if "-o" not in args:
        cmd += ["-o", str(tmp_path / "t.html")]
    res = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True)
    lines = (res.stdout + res.stderr).strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith("错误："), res.stdout + res.stderr
    assert words in lines[0], lines[0]
    assert not (tmp_path / "t.html").exists()


def test_missing_model_dir_is_named(tmp_path):
    res = subprocess.run([sys.executable, "course.py", "trace", "ch4", "--model", str(tmp_path / "m")], cwd=ROOT,
                         env=ENV, capture_output=True, text=True)
    m = tmp_path / "m"
    assert res.returncode == 2 and res.stderr.strip() == f"错误：--model {m}：找不到 {m / 'config.json'}"


def test_a_chapter_that_cannot_run_the_model_says_why(tiny_models):
    """第 1、2 章只有 Qwen3：没给 --model 时 trace 据此退回小模型，给了就报错。"""
    from tools.trace.cli import unsupported

    assert unsupported(find_checkpoint("ch1"), tiny_models["llama3"]).startswith(
        "llama3 是 model_type='llama'，第 1 章只支持 qwen3-tied、qwen3-untied")
    assert unsupported(find_checkpoint("ch1"), tiny_models["qwen3-tied"]) is None
    assert unsupported(find_checkpoint("ch4"), tiny_models["llama3"]) is None
