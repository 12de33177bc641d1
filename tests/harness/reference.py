"""Hugging Face transformers 参考：fp32、eager 注意力、贪心，正好 N 个新 token（不因 EOS 提前停）。

HF 这一边的结果（token 和每一步的 logits）只取决于模型目录里的文件、提示词、N 和 torch / transformers 的版本：
算过一次就存进 .cache/hf_reference/，之后的 check 直接读（真模型上 HF 自己跑一遍要几十秒，读回来不到一秒）。
模型文件一改（大小、修改时间）、换了版本，键就变了，重新算。
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import os
from pathlib import Path

import torch

CACHE = Path(__file__).resolve().parents[2] / ".cache" / "hf_reference"


@functools.lru_cache(maxsize=4)
def load_hf(model_dir: str):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    return model.eval(), load_tokenizer(model_dir)


@functools.lru_cache(maxsize=8)
def load_tokenizer(model_dir: str):
    """只要分词器（编码提示词、把 token 解码成文字写报告）时不必把整个 HF 模型读进来。"""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def cache_key(model_dir: str | Path, prompt: str, n: int) -> str:
    h = hashlib.sha256("\0".join([prompt, str(n), importlib.metadata.version("torch"),
                                  importlib.metadata.version("transformers")]).encode())
    for p in sorted(Path(model_dir).iterdir()):
        if p.is_file():
            st = p.stat()
            h.update(f"{p.name}:{st.st_size}:{st.st_mtime_ns}\0".encode())
    return h.hexdigest()[:32]


@functools.lru_cache(maxsize=64)
def hf_greedy(model_dir: str | Path, prompt: str, n: int) -> tuple[list[int], torch.Tensor]:
    """返回 (n 个 token, 每一步的 logits (n, vocab))。先查 .cache/hf_reference/，没有才让 HF 跑。"""
    from safetensors.torch import load_file, save_file

    path = CACHE / f"{cache_key(model_dir, prompt, n)}.safetensors"
    if not path.is_file():
        CACHE.mkdir(parents=True, exist_ok=True)
        with _locked(path.with_suffix(".lock")):  # 几份测试同时要同一份参考：一个进程算，其余的等它写完再读
            if not path.is_file():
                tokens, logits = _run_hf(str(model_dir), prompt, n)
                part = path.with_suffix(f".{os.getpid()}.part")  # 写完再改名：不加锁的读者也读不到半个文件
                save_file({"tokens": torch.tensor(tokens, dtype=torch.int64), "logits": logits.contiguous()}, str(part))
                os.replace(part, path)
                return tokens, logits
    data = load_file(str(path))
    return data["tokens"].tolist(), data["logits"]


@contextlib.contextmanager
def _locked(lock: Path):
    """文件锁（POSIX 的 flock；没有 fcntl 的平台不锁，最多两个进程各算一遍）。"""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _run_hf(model_dir: str, prompt: str, n: int) -> tuple[list[int], torch.Tensor]:
    """自己写贪心循环而不用 generate()：generate 会在 EOS 处停下，而我们要求两边都正好生成 n 个。
    每一步仍然是 HF 自己的 forward 和 KV 缓存。"""
    model, tok = load_hf(model_dir)
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
    return load_tokenizer(str(model_dir))(prompt).input_ids
