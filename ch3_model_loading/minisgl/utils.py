"""几个小工具：张量并行的切分要求整除（不整除时给出清楚的错误），按引擎 dtype 构造模型，读分词器。"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# 至少要有其中一个，分词器才有词表
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")


def div_even(a: int, b: int, allow_replicate: bool = False) -> int:
    """a 平均分给 b 份。allow_replicate：份数多于 a 时（比如 KV 头少于 TP 份数），每份 1 个、复制着用。"""
    if allow_replicate and b > a:
        if b % a != 0:
            raise ValueError(f"{b} 份无法均匀复制 {a} 个：{b} 不是 {a} 的整数倍")
        return 1
    if a % b != 0:
        raise ValueError(f"{a} 不能被 {b} 整除，无法平均切成 {b} 份")
    return a // b


def div_ceil(a: int, b: int) -> int:
    return (a + b - 1) // b


@contextmanager
def torch_dtype(dtype: torch.dtype) -> Iterator[None]:
    """在这段代码里把 torch 的默认 dtype 换成 dtype：模型构造时 torch.empty 就按引擎的 dtype 建参数。"""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def load_tokenizer(model_path: str) -> PreTrainedTokenizerBase:
    """缺词表文件时 AutoTokenizer 不报错，而是给一个空词表的分词器：每个 prompt 都编码成 []。"""
    if not any(os.path.isfile(os.path.join(model_path, f)) for f in TOKENIZER_FILES):
        raise FileNotFoundError(f"{model_path} 里没有分词器文件：{' / '.join(TOKENIZER_FILES)} 至少要有一个")
    from transformers import AutoTokenizer  # 只有入口用得到：算子 import 本模块时不必带上 transformers

    try:
        return AutoTokenizer.from_pretrained(model_path)
    except Exception as e:  # 分词器也读 config.json：transformers 不接受它时，原话是一长串异常链
        cause = e.__cause__ or e
        reason = " ".join(str(cause.args[0] if isinstance(cause, KeyError) and cause.args else cause).split())
        raise ValueError(f"{model_path}：transformers 读不了分词器或 config.json：{reason}") from None
