"""写出几个随机权重的小 Hugging Face 检查点，离线也能跑全部测试和演示。

每个模型都由真正的 transformers 配置类构造、用 save_pretrained 保存，所以它们和真模型走同一条加载路径；
分词器在仓库自带的语料（英文、中文、代码）上本地训练，不碰任何 hub。结果完全确定：同样的版本，同样的字节。

    python -m tools.make_tiny_models              # 写到 models/tiny/<name>/
    python -m tools.make_tiny_models --out DIR    # 写到 DIR/<name>/
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
CORPUS = Path(__file__).resolve().parent / "corpus"
DEFAULT_OUT = ROOT / "models" / "tiny"
VOCAB = 1024  # 能被 2 和 4 整除：第 2 章的张量并行测试要切词表
SEED = 1234
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# 名字 -> (配置类名, 配置参数, 写 config.json 的形式, 分片大小)
# "hub" 是 transformers 4 写出的老形式（rope_theta / rope_scaling / torch_dtype 在顶层），
# "t5" 是 transformers 5 的新形式（rope_parameters / dtype）。两种都要能读。
_COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
               max_position_embeddings=512, rms_norm_eps=1e-6, vocab_size=VOCAB)
FAMILIES: dict[str, tuple[str, dict, str, str | None]] = {
    # Qwen3、绑定词嵌入、GQA（4 个 q 头共用 2 个 kv 头）
    "qwen3-tied": ("Qwen3Config", dict(_COMMON, num_key_value_heads=2, head_dim=16, rope_theta=1e6,
                                       tie_word_embeddings=True), "t5", None),
    # Qwen3、不绑定、只有 1 个 kv 头、head_dim=24 而不是 64/4=16；存成多个分片，config 用 hub 老形式
    "qwen3-untied": ("Qwen3Config", dict(_COMMON, num_key_value_heads=1, head_dim=24, rope_theta=1e6,
                                         tie_word_embeddings=False), "hub", "150KB"),
    # Qwen2（Qwen2.5 家族）：q/k/v 有 bias，不绑定
    "qwen2": ("Qwen2Config", dict(_COMMON, num_key_value_heads=2, rope_theta=1e6,
                                  tie_word_embeddings=False), "t5", None),
    # Llama 3：llama3 形式的 RoPE 缩放 + GQA；original_max_position_embeddings 取得很小，缩放才真正起作用
    "llama3": ("LlamaConfig", dict(_COMMON, num_key_value_heads=2, tie_word_embeddings=True,
                                   rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
                                   rope_theta=500000.0), "hub", None),
}
QWEN3_FAMILIES = ["qwen3-tied", "qwen3-untied"]


def train_tokenizer(out_dir: Path) -> None:
    """字节级 BPE：任何 UTF-8 文本（中文也一样）都能编码，不会出现未知词。"""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train([str(p) for p in sorted(CORPUS.glob("*.txt"))], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.save_pretrained(out_dir)


def _init_weights(model: torch.nn.Module, seed: int) -> None:
    """全部参数随机化，包括 norm 的权重和 bias：默认的 1 和 0 会让"漏掉一个 norm / bias"的错误蒙混过关。
    尺度取得偏大，让 logits 的第一名和第二名拉开距离，贪心选择不会被浮点误差翻转。"""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)  # U(0.5, 1.5)
            elif name.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            elif "embed_tokens" in name or "lm_head" in name:
                p.copy_(torch.randn(p.shape, generator=g) * (2.0 / math.sqrt(p.shape[1])) * 2)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * (1.5 / math.sqrt(p.shape[1])))


def _to_hub_form(config_path: Path) -> None:
    """把 transformers 5 写出的 config.json 改写成 hub 上（transformers 4 写的）老形式。"""
    cfg = json.loads(config_path.read_text())
    rope = dict(cfg.pop("rope_parameters"))
    cfg["rope_theta"] = rope.pop("rope_theta")
    cfg["rope_scaling"] = None if rope.get("rope_type", "default") == "default" else rope
    cfg["torch_dtype"] = cfg.pop("dtype", "float32")
    cfg["transformers_version"] = "4.51.0"
    config_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def make_model(name: str, out_dir: Path, tokenizer_dir: Path) -> Path:
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cls_name, kwargs, form, shard = FAMILIES[name]
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = getattr(transformers, cls_name)(**kwargs, bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id,
                                             pad_token_id=tok.eos_token_id)
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _init_weights(model, SEED + sorted(FAMILIES).index(name))
    if config.tie_word_embeddings:
        model.tie_weights()
    path = out_dir / name
    if path.exists():
        shutil.rmtree(path)
    model.save_pretrained(path, **({"max_shard_size": shard} if shard else {}))
    tok.save_pretrained(path)
    if form == "hub":
        _to_hub_form(path / "config.json")
    (path / "TINY_MODEL").write_text(f"random weights, seed {SEED}, written by tools/make_tiny_models.py\n")
    return path


# 给基准测试用：和 Qwen3-0.6B 一样的形状（所以每步要读 ~2.2 GiB 的 fp32 权重），随机权重，配小分词器
QWEN3_06B_SHAPE = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960,
                       rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=True)


def make_random_qwen3_06b(out: Path = ROOT / "models" / "random-qwen3-0.6b") -> Path:
    """写一个 Qwen3-0.6B 形状的随机权重检查点（约 2.4 GB），已经写过就直接复用。"""
    if (out / "TINY_MODEL").exists():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3Config

    tok_dir = DEFAULT_OUT / "_tokenizer"
    if not (tok_dir / "tokenizer.json").exists():
        train_tokenizer(tok_dir)
    tok = AutoTokenizer.from_pretrained(tok_dir)
    config = Qwen3Config(**QWEN3_06B_SHAPE, eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _init_weights(model, SEED)
    model.tie_weights()
    model.save_pretrained(out)
    tok.save_pretrained(out)
    (out / "TINY_MODEL").write_text(f"random weights with Qwen3-0.6B's shape, seed {SEED}\n")
    return out


def make_all(out: Path = DEFAULT_OUT, names: list[str] | None = None) -> dict[str, Path]:
    """写出（或复用已写好的）小模型；返回 名字 -> 目录。"""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # 测试日志里不要进度条
    out.mkdir(parents=True, exist_ok=True)
    tok_dir = out / "_tokenizer"
    if not (tok_dir / "tokenizer.json").exists():
        train_tokenizer(tok_dir)
    paths = {}
    for name in names or list(FAMILIES):
        path = out / name
        paths[name] = path if (path / "TINY_MODEL").exists() else make_model(name, out, tok_dir)
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("names", nargs="*", help=f"默认全部：{', '.join(FAMILIES)}")
    args = ap.parse_args()
    unknown = sorted(set(args.names) - set(FAMILIES))
    if unknown:
        ap.error(f"未知的小模型 {unknown}；可选：{', '.join(FAMILIES)}")
    for name, path in make_all(args.out, args.names or None).items():
        print(f"{name:14} {path}")


if __name__ == "__main__":
    main()
