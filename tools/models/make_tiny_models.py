"""写出几个随机权重的小 Hugging Face 检查点，离线也能跑全部测试和演示。

每个模型都由真正的 transformers 配置类构造、用 save_pretrained 保存，所以它们和真模型走同一条加载路径；
分词器在仓库自带的语料（英文、中文、代码）上本地训练，不碰任何 hub。结果完全确定：同样的版本，同样的字节。

    python -m tools.models.make_tiny_models              # 写到 models/tiny/<name>/
    python -m tools.models.make_tiny_models --out DIR    # 写到 DIR/<name>/
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import math
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

ROOT = Path(__file__).resolve().parents[2]
CORPUS = Path(__file__).resolve().parent / "corpus"
DEFAULT_OUT = ROOT / "models" / "tiny"
VOCAB = 1024  # 能被 2 和 4 整除：第 2 章的张量并行测试要切词表
SEED = 1234
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# 名字 -> (配置类名, 配置参数, 写 config.json 的形式, 分片大小)
# "hub" 是 transformers 4 写出的老形式（rope_theta / rope_scaling / torch_dtype 在顶层），
# "t5" 是 transformers 5 的新形式（rope_parameters / dtype）。两种都要能读。
# decoder 读的每个 config 字段，至少有一个模型取和 qwen3-tied 不同的值：把字段写死成常数的实现在那个模型上对不上
# （哪个字段由哪个模型、哪个测试抓，见 FIELD_COVERAGE 和 docs/testing.md）。
_COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
               max_position_embeddings=512, rms_norm_eps=1e-6, vocab_size=VOCAB)
FAMILIES: dict[str, tuple[str, dict, str, str | None]] = {
    # Qwen3、绑定词嵌入、GQA（4 个 q 头共用 2 个 kv 头）：基准，别的模型和它比
    "qwen3-tied": ("Qwen3Config", dict(_COMMON, num_key_value_heads=2, head_dim=16, rope_theta=1e6,
                                       tie_word_embeddings=True), "t5", None),
    # Qwen3、不绑定、只有 1 个 kv 头、head_dim=24 而不是 80/4=20；存成多个分片，config 用 hub 老形式。
    # 真实的初始化尺度（initializer_range 0.02）：激活小，rms_norm_eps 才真的起作用；
    # 词表比分词器大（像真 Qwen 一样补齐）
    "qwen3-untied": ("Qwen3Config", dict(_COMMON, hidden_size=80, intermediate_size=192, num_hidden_layers=4,
                                         num_key_value_heads=1, head_dim=24, rope_theta=1e6, rms_norm_eps=1e-5,
                                         max_position_embeddings=384, vocab_size=VOCAB + 32,
                                         tie_word_embeddings=False, initializer_range=0.02), "hub", "150KB"),
    # Qwen2（Qwen2.5 家族）：q/k/v 有 bias，不绑定；8 个 q 头，head_dim 由 hidden_size / num_attention_heads 算出（8）
    "qwen2": ("Qwen2Config", dict(_COMMON, intermediate_size=96, num_attention_heads=8,
                                  num_key_value_heads=2,
                                  rope_theta=1e4, rms_norm_eps=1e-5, max_position_embeddings=256,
                                  tie_word_embeddings=False), "t5", None),
    # Llama 3：llama3 形式的 RoPE 缩放 + GQA；head_dim=16 显式给出（q 的宽度 64 不等于 hidden_size 96）；
    # original_max_position_embeddings 取得很小，缩放才真正起作用，四个缩放参数都不取 Llama 3.1 的值；
    # 波长约 32.4 的那个频率落在平滑过渡带 [64/8, 64/1.5] 里，high_freq_factor 才影响结果
    "llama3": ("LlamaConfig", dict(_COMMON, hidden_size=96, head_dim=16, intermediate_size=160, num_hidden_layers=4,
                                   num_key_value_heads=2, tie_word_embeddings=True, rms_norm_eps=1e-5,
                                   max_position_embeddings=1024,
                                   rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.5,
                                                 "high_freq_factor": 8.0, "original_max_position_embeddings": 64},
                                   rope_theta=500000.0), "hub", None),
}
# decoder 读的 config 字段 -> (取了和 qwen3-tied 不同的值的模型, 把它写死成常数时会失败的测试)。
# tests/repo/test_tiny_models.py 检查：第 3~6 章的 ModelConfig.from_hf 和 RoPE 读的每个字段都在这里或 NOT_VARIED 里，
# 列出的模型真的取了不同的值，列出的测试真的存在；docs/testing.md 的表由它生成。
PARITY = "tests/checkpoint/test_parity.py::test_parity_with_hf"
FIELD_COVERAGE: dict[str, tuple[list[str], str]] = {
    "rms_norm_eps": (["qwen3-untied", "qwen2", "llama3"], PARITY),  # qwen3-untied 是真实尺度：只有 logits 抓得到
    "rope_theta": (["qwen2", "llama3"], PARITY),
    "hidden_size": (["qwen3-untied", "llama3"], PARITY),
    "intermediate_size": (["qwen3-untied", "qwen2", "llama3"], PARITY),
    "num_hidden_layers": (["qwen3-untied", "llama3"], PARITY),  # 都多于 3 层：测试里按名字找第 0~2 层
    "num_attention_heads": (["qwen2"], PARITY),
    "num_key_value_heads": (["qwen3-untied"], PARITY),
    "head_dim": (["qwen3-untied", "qwen2"], PARITY),  # 显式的 24、llama3 的 16 ≠ 96/4、qwen2 算出来的 8
    "vocab_size": (["qwen3-untied"], PARITY),
    "tie_word_embeddings": (["qwen3-untied", "qwen2"], PARITY),
    "max_position_embeddings": (["qwen3-untied", "qwen2", "llama3"],
                                "tests/ch3/test_generate_limits.py::test_positions_past_max_position_embeddings_are_refused"),
    "rope_type": (["llama3"], PARITY),
    "factor": (["llama3"], PARITY),
    "low_freq_factor": (["llama3"], PARITY),
    "high_freq_factor": (["llama3"], PARITY),
    "original_max_position_embeddings": (["llama3"], PARITY),
    "attention_bias (Qwen2 的 q/k/v bias)": (["qwen2"], PARITY),  # 不是 config 字段：由结构决定，见 has_attn_bias
}
# 读了、但不靠变化来测的字段：为什么，以及管它的测试
_SLIDING = "tests/ch3/test_loader_inputs.py::test_task1_sliding_window_config_is_refused"
_CLASS = "tests/ch3/test_models.py::test_task2_model_class_per_family"
_FIELDS = "tests/ch3/test_models.py::test_task1_config_fields"
NOT_VARIED: dict[str, tuple[str, str]] = {
    "hidden_act": ("阶段一只实现 silu，四个家族都是它", _FIELDS),
    "layer_types": ("有滑动窗口层就拒绝", _SLIDING),
    "sliding_window": ("同上：只出现在拒绝的消息里", _SLIDING),
    "model_type": ("只用在报错消息里；选类看 architectures", _CLASS),
    "architectures": ("选哪个模型类：三种结构各有小模型", _CLASS),
    "text_config": ("多模态外壳才有；四个小模型都没有，读到就拆开", _FIELDS),
    "rope_parameters": ("装 rope_theta 和缩放参数的容器：里面的字段各有一行", PARITY),
}
# Llama 3.1 真配置里的缩放参数：小模型的四个值都不取它们，写死这几个数的实现在 llama3 上对不上
LLAMA31_SCALING = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192}

# 真实尺度的模型 logits 挤在一起：选一个让每一步贪心的第一名和第二名至少差 max|logit| 的 1e-3 的种子
# （参考检查点和 HF 的相对差约 1e-6，翻不动它），其余模型用各自在 FAMILIES 里的序号
SEED_OFFSET = {"qwen3-untied": 11}
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


def _init_weights(model: torch.nn.Module, seed: int, std: float | None = None) -> None:
    """全部参数随机化，包括 norm 的权重和 bias：默认的 1 和 0 会让"漏掉一个 norm / bias"的错误蒙混过关。
    默认尺度取得偏大，让 logits 的第一名和第二名拉开距离，贪心选择不会被浮点误差翻转；
    给了 std（配置的 initializer_range）就按真模型的尺度：激活小到和 rms_norm_eps 可比，eps 写错 logits 就变。"""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)  # U(0.5, 1.5)
            elif name.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=g) * (0.5 if std is None else std))
            elif std is not None:
                p.copy_(torch.randn(p.shape, generator=g) * std)
            elif "embed_tokens" in name or "lm_head" in name:
                p.copy_(torch.randn(p.shape, generator=g) * (2.0 / math.sqrt(p.shape[1])) * 2)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * (1.5 / math.sqrt(p.shape[1])))


def spec_digest(name: str) -> str:
    """这个模型的配置写进 TINY_MODEL：FAMILIES 改了，make_all 就重写它，不会拿旧模型去测新表。"""
    spec = [FAMILIES[name], SEED, SEED_OFFSET.get(name)]
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


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
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # 测试日志里不要进度条

    cls_name, kwargs, form, shard = FAMILIES[name]
    kwargs = copy.deepcopy(kwargs)  # 配置类会往 rope_scaling 字典里添键：别让它改了 FAMILIES（spec_digest 就变了）
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = getattr(transformers, cls_name)(**kwargs, bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id,
                                             pad_token_id=tok.eos_token_id)
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _init_weights(model, SEED + SEED_OFFSET.get(name, sorted(FAMILIES).index(name)), kwargs.get("initializer_range"))
    if config.tie_word_embeddings:
        model.tie_weights()
    path = out_dir / name
    if path.exists():
        shutil.rmtree(path)
    model.save_pretrained(path, **({"max_shard_size": shard} if shard else {}))
    tok.save_pretrained(path)
    if form == "hub":
        _to_hub_form(path / "config.json")
    # 这行字是模型字节的一部分（test_deterministic 比较整个目录），tools/ 分包前写出的小模型并不重做：
    # 所以保留旧路径的原文，新旧两份才逐字节相同
    (path / "TINY_MODEL").write_text(f"random weights, seed {SEED}, spec {spec_digest(name)}, "
                                     "written by tools/make_tiny_models.py\n")
    return path


# 给基准测试用：和 Qwen3-0.6B 一样的形状（所以每步要读 ~2.2 GiB 的 fp32 权重），随机权重，配小分词器
QWEN3_06B_SHAPE = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960,
                       rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=True)


def make_random_qwen3_06b(out: Path = ROOT / "models" / "random-qwen3-0.6b") -> Path:
    """写一个 Qwen3-0.6B 形状的随机权重检查点（约 2.4 GB），已经写过就直接复用。"""
    if (out / "TINY_MODEL").exists():
        return out
    import torch
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
    """写出（或复用已写好的）小模型；返回 名字 -> 目录。都已写好时不 import torch / transformers：
    每次 course.py check / test 都先调它，这样只花几毫秒。"""
    out.mkdir(parents=True, exist_ok=True)
    tok_dir = out / "_tokenizer"
    if not (tok_dir / "tokenizer.json").exists():
        train_tokenizer(tok_dir)
    paths = {}
    for name in names or list(FAMILIES):
        path = out / name
        marker = path / "TINY_MODEL"
        fresh = marker.exists() and f"spec {spec_digest(name)}," in marker.read_text()
        paths[name] = path if fresh else make_model(name, out, tok_dir)
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
