"""一个检查点 × 一个模型 × 一个页大小：跑契约，逐 token 对 HF，不一致时写报告。"""

from __future__ import annotations

import tempfile
from pathlib import Path

from safetensors.torch import load_file

from .contract import ContractError, build_argv, parse_outputs, run_in_process, run_subprocess
from .reference import hf_greedy, load_tokenizer
from .report import logits_report, mismatch_report


def run_contract(entry: Path, argv: list[str], in_process: bool) -> str:
    if in_process:
        return run_in_process(entry, argv)
    res = run_subprocess(entry, argv)
    if res.returncode != 0:
        raise ContractError(f"{entry} 以状态 {res.returncode} 退出：\n{res.stderr[-3000:]}")
    return res.stdout


def generate(entry: Path, model: Path, prompts: list[str], n: int, page_size: int | None = None,
             in_process: bool = True) -> list[list[int]]:
    out = run_contract(entry, build_argv(model, prompts, n, page_size), in_process)
    return parse_outputs(out, len(prompts), n)


def parity_failures(entry: Path, model: Path, prompts: list[str], n: int, page_size: int | None = None,
                    in_process: bool = True, extra: list[str] | None = None) -> list[str]:
    """所有提示词放在一次调用里（第 4 章起它们在同一个 batch 里），逐个和 HF 单独跑的结果比较：
    token 逐个相同，并且每一步的 logits 在 LOGITS_RTOL 之内（见 logits_report）。一次调用同时取回 token 和 logits。"""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "logits.safetensors"
        argv = build_argv(model, prompts, n, page_size, dump_logits=path) + list(extra or [])
        outputs = parse_outputs(run_contract(entry, argv, in_process), len(prompts), n)
        our_logits = load_file(str(path)) if path.exists() else None
    refs = [hf_greedy(str(model), p, n) for p in prompts]
    decode = load_tokenizer(str(model)).decode
    where = f"[{entry.parent.name} · {model.name} · page_size={page_size}{' ' + ' '.join(extra) if extra else ''}]"
    reports = []
    for i, (p, o, (ref, ref_logits)) in enumerate(zip(prompts, outputs, refs)):
        ours = None if our_logits is None else our_logits.get(f"p{i}")
        rep = mismatch_report(p, o, ref, ref_logits, ours, decode) or logits_report(i, p, ref_logits, ours, decode)
        if rep:
            reports.append(f"{where} {rep}")
    return reports
