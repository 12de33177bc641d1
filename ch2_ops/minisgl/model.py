"""Qwen3，用算子层搭起来：每个算子自己管权重的形状、加载和张量并行的切法。

类的层次和键名与官方一致（RopeAttn / GatedMLP / DecoderLayer / Model / ForCausalLM）。
加载还是朴素的：safe_open 把全部权重一次读进 dict，再切分、合并（q/k/v -> qkv，gate/up -> gate_up）；
第 3 章换成边读边切的流式加载，并让同一份代码装下 Qwen2.5 和 Llama 3。
"""

from __future__ import annotations

import glob
import json
import os
from collections import defaultdict

import torch
from safetensors import safe_open

from minisgl.core import get_global_ctx
from minisgl.layers import (AttentionLayer, BaseOP, LinearColParallelMerged, LinearOProj, LinearQKVMerged,
                            LinearRowParallel, OPList, ParallelLMHead, RMSNorm, RMSNormFused, RotaryConfig,
                            VocabParallelEmbedding, silu_and_mul)


class RopeAttn(BaseOP):
    def __init__(self, cfg: dict, layer_id: int) -> None:
        head_dim = cfg["head_dim"]
        self.qkv_proj = LinearQKVMerged(cfg["hidden_size"], head_dim, cfg["num_attention_heads"],
                                        cfg["num_key_value_heads"], has_bias=False)
        self.q_norm = RMSNorm(head_dim, cfg["rms_norm_eps"])
        self.k_norm = RMSNorm(head_dim, cfg["rms_norm_eps"])
        rotary = RotaryConfig(head_dim, head_dim, cfg["max_position_embeddings"], cfg["theta"], None)
        self.attn = AttentionLayer(layer_id, cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim,
                                   rotary, q_norm=self.q_norm, k_norm=self.k_norm)
        self.o_proj = LinearOProj(head_dim * cfg["num_attention_heads"], cfg["hidden_size"], has_bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.o_proj.forward(self.attn.forward(self.qkv_proj.forward(x)))


class GatedMLP(BaseOP):
    def __init__(self, cfg: dict) -> None:
        inter = cfg["intermediate_size"]
        self.gate_up_proj = LinearColParallelMerged(cfg["hidden_size"], [inter, inter], has_bias=False)
        self.down_proj = LinearRowParallel(inter, cfg["hidden_size"], has_bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj.forward(silu_and_mul(self.gate_up_proj.forward(x)))


class Qwen3DecoderLayer(BaseOP):
    def __init__(self, cfg: dict, layer_id: int) -> None:
        self.self_attn = RopeAttn(cfg, layer_id)
        self.mlp = GatedMLP(cfg)
        self.input_layernorm = RMSNormFused(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.post_attention_layernorm = RMSNormFused(cfg["hidden_size"], cfg["rms_norm_eps"])

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        x, residual = self.input_layernorm.forward(x, residual)
        x = self.self_attn.forward(x)
        x, residual = self.post_attention_layernorm.forward(x, residual)
        return self.mlp.forward(x), residual


class Qwen3Model(BaseOP):
    def __init__(self, cfg: dict) -> None:
        self.embed_tokens = VocabParallelEmbedding(cfg["vocab_size"], cfg["hidden_size"])
        self.layers = OPList([Qwen3DecoderLayer(cfg, i) for i in range(cfg["num_hidden_layers"])])
        self.norm = RMSNormFused(cfg["hidden_size"], cfg["rms_norm_eps"])

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x, residual = self.embed_tokens.forward(input_ids), None
        for layer in self.layers.op_list:
            x, residual = layer.forward(x, residual)
        return self.norm.forward(x, residual)[0]


class Qwen3ForCausalLM(BaseOP):
    def __init__(self, cfg: dict) -> None:
        self.cfg = cfg  # generate.py 建 Req 时要 vocab_size 和 max_position_embeddings
        self.model = Qwen3Model(cfg)
        tie = cfg.get("tie_word_embeddings", False)
        self.lm_head = ParallelLMHead(cfg["vocab_size"], cfg["hidden_size"], tie_word_embeddings=tie,
                                      tied_embedding=self.model.embed_tokens if tie else None)

    def forward(self) -> torch.Tensor:
        """不接收参数：从全局 Context 读当前 batch。返回 (bs, vocab) 的 logits。"""
        return self.lm_head.forward(self.model.forward(get_global_ctx().batch.input_ids))


# HF 的名字 -> (我们合并后的名字, 第几块, 一共几块)
_MERGED = {".q_proj.": (".qkv_proj.", 0, 3), ".k_proj.": (".qkv_proj.", 1, 3), ".v_proj.": (".qkv_proj.", 2, 3),
           ".gate_proj.": (".gate_up_proj.", 0, 2), ".up_proj.": (".gate_up_proj.", 1, 2)}


def find_op(root: BaseOP, name: str) -> BaseOP:
    """'model.layers.3.mlp.down_proj' -> 对应的算子对象。"""
    op = root
    for part in name.split("."):
        op = op.op_list[int(part)] if isinstance(op, OPList) else getattr(op, part, None)
        if not isinstance(op, BaseOP):
            raise KeyError(f"检查点里的 {name} 在模型里没有对应的算子")
    return op


def read_config(path: str) -> dict:
    cfg = json.load(open(os.path.join(path, "config.json")))
    if cfg.get("model_type") != "qwen3":
        raise ValueError(f"本章只支持 Qwen3，{path}/config.json 的 model_type 是 {cfg.get('model_type')!r}")
    rope_params = cfg.get("rope_parameters") or {}  # transformers 5 的新形式；hub 上的老形式在顶层
    cfg["theta"] = cfg.get("rope_theta") or rope_params["rope_theta"]
    cfg["head_dim"] = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return cfg


def load_model(path: str) -> Qwen3ForCausalLM:
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"{path} 里没有 *.safetensors 文件")
    model = Qwen3ForCausalLM(read_config(path))
    full: dict[str, torch.Tensor] = {}
    for f in files:  # 朴素：全部一次读进内存
        with safe_open(f, framework="pt") as sf:
            for k in sf.keys():
                t = sf.get_tensor(k)
                if not t.is_floating_point():  # 量化的整数权重转成 float 只会是错的数
                    raise ValueError(f"{f}: 张量 {k} 的 dtype 是 {t.dtype}，权重必须是浮点数（量化的检查点不支持）")
                full[k] = t.float()
    parts: dict[str, dict[int, torch.Tensor]] = defaultdict(dict)
    for key, tensor in full.items():
        name, idx = key, 0
        for old, (new, i, _) in _MERGED.items():
            if old in name:
                name, idx = name.replace(old, new), i
                break
        try:
            parts[name][idx] = find_op(model, name.rsplit(".", 1)[0]).shard(tensor, idx)
        except ValueError as e:  # shard 只知道形状，名字在这里补上
            raise ValueError(f"{path}: 张量 {key}：{e}") from None
    model.load_state_dict({name: torch.cat([p[i] for i in sorted(p)]) for name, p in parts.items()})
    return model
