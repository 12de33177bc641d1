"""Qwen3 的朴素实现：和第 0 步一样是一个权重 dict 加几个函数，区别只有一处——
forward() 不再接收 ids 和 pos，而是从全局 Context 读当前的 Batch，一次算多个请求。
第 2 章把这些函数换成算子层，第 3 章换成正式的模型与加载。
"""

from __future__ import annotations

import glob
import json
import os

import torch
import torch.nn.functional as F
from safetensors import safe_open

from minisgl.core import get_global_ctx
from minisgl.naive import naive_attention

W: dict[str, torch.Tensor] = {}  # 全部权重，一次读完
cfg: dict = {}


def load(path: str) -> None:
    """读 path 下的 config.json 和全部 *.safetensors，填进 cfg 和 W（转成 fp32）；整数张量抛 ValueError。"""
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"{path} 里没有 *.safetensors 文件")
    cfg.clear()
    cfg.update(json.load(open(os.path.join(path, "config.json"))))
    if cfg.get("model_type") != "qwen3":
        raise ValueError(f"本章只支持 Qwen3，{path}/config.json 的 model_type 是 {cfg.get('model_type')!r}")
    rope_params = cfg.get("rope_parameters") or {}  # transformers 5 的新形式；hub 上的老形式在顶层
    cfg["theta"] = cfg.get("rope_theta") or rope_params["rope_theta"]
    cfg["head_dim"] = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    W.clear()
    for f in files:
        with safe_open(f, framework="pt") as sf:
            for k in sf.keys():
                t = sf.get_tensor(k)
                if not t.is_floating_point():  # 量化的整数权重转成 float 只会是错的数
                    raise ValueError(f"{f}: 张量 {k} 的 dtype 是 {t.dtype}，权重必须是浮点数（量化的检查点不支持）")
                W[k] = t.float()


def rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg["rms_norm_eps"]))


def rope(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """x: (N, heads, D)。前一半和后一半配对旋转（HF 的 rotate_half 约定）。"""
    d = x.shape[-1]
    inv_freq = 1.0 / (cfg["theta"] ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    freqs = pos[:, None].float() * inv_freq[None, :]
    cos, sin = torch.cat([freqs, freqs], -1).cos()[:, None], torch.cat([freqs, freqs], -1).sin()[:, None]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def attention(i: int, x: torch.Tensor) -> torch.Tensor:
    """第 i 层注意力块：x (N, hidden) -> (N, hidden)。位置从 ctx.batch.positions 读，
    和历史算注意力交给 naive_attention。"""
    p = f"model.layers.{i}.self_attn."
    N, H, KV, D = x.shape[0], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    pos = get_global_ctx().batch.positions
    q = (x @ W[p + "q_proj.weight"].T).view(N, H, D)
    k = (x @ W[p + "k_proj.weight"].T).view(N, KV, D)
    v = (x @ W[p + "v_proj.weight"].T).view(N, KV, D)
    q = rope(rms_norm(q, W[p + "q_norm.weight"]), pos)  # Qwen3：每个头先做 RMSNorm，再旋转
    k = rope(rms_norm(k, W[p + "k_norm.weight"]), pos)
    return naive_attention(q, k, v, i).reshape(N, H * D) @ W[p + "o_proj.weight"].T


def forward() -> torch.Tensor:
    """读 ctx.batch.input_ids / positions（各请求的新 token 首尾相接，共 N 个）；
    返回每个请求最后一个 token 的 logits: (bs, vocab)。"""
    batch = get_global_ctx().batch
    x = W["model.embed_tokens.weight"][batch.input_ids]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = x + attention(i, rms_norm(x, W[p + "input_layernorm.weight"]))
        h = rms_norm(x, W[p + "post_attention_layernorm.weight"])
        gate, up = h @ W[p + "mlp.gate_proj.weight"].T, h @ W[p + "mlp.up_proj.weight"].T
        x = x + (F.silu(gate) * up) @ W[p + "mlp.down_proj.weight"].T
    last = torch.tensor([r.extend_len for r in batch.reqs]).cumsum(0) - 1  # 每个请求最后一个 token 的行号
    lm_head = W.get("lm_head.weight", W["model.embed_tokens.weight"])  # 绑定词嵌入时没有 lm_head
    return rms_norm(x[last], W["model.norm.weight"]) @ lm_head.T
