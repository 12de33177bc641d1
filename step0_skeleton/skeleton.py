"""第 0 步：最朴素的推理程序，已经和 Hugging Face 逐 token 一致。

一个权重 dict、四个函数、每层一个用 torch.cat 变长的 KV 列表、einsum 加显式掩码的注意力、argmax。
后面六章把这里的每个朴素部件换成正式模块；这个文件是它们在正确性和速度上的对照基线。
只支持 Qwen3 结构（GQA、绑定或不绑定词嵌入、显式 head_dim）。
"""

import argparse
import glob
import json
import os
import time

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoTokenizer

# --8<-- [start:ops]
W: dict[str, torch.Tensor] = {}  # 全部权重，一次读完
cfg: dict = {}


def rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x / sqrt(mean(x²) + eps) * w，在最后一维上归一化。"""
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg["rms_norm_eps"]))


def rope(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """x: (T, heads, D)。前一半和后一半配对旋转（HF 的 rotate_half 约定）。"""
    d = x.shape[-1]
    inv_freq = 1.0 / (cfg["theta"] ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    freqs = pos[:, None].float() * inv_freq[None, :]
    cos, sin = torch.cat([freqs, freqs], -1).cos()[:, None], torch.cat([freqs, freqs], -1).sin()[:, None]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin
# --8<-- [end:ops]


# --8<-- [start:attention]
def attention(i: int, x: torch.Tensor, pos: torch.Tensor, kv: list) -> torch.Tensor:
    """第 i 层注意力块：x (T, hidden) -> (T, hidden)。新的 K/V 接到 kv[i] 后面，再和全部历史算因果注意力。"""
    p = f"model.layers.{i}.self_attn."
    T, H, KV, D = x.shape[0], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    q = (x @ W[p + "q_proj.weight"].T).view(T, H, D)
    k = (x @ W[p + "k_proj.weight"].T).view(T, KV, D)
    v = (x @ W[p + "v_proj.weight"].T).view(T, KV, D)
    q = rope(rms_norm(q, W[p + "q_norm.weight"]), pos)  # Qwen3：每个头先做 RMSNorm，再旋转
    k = rope(rms_norm(k, W[p + "k_norm.weight"]), pos)
    if kv[i] is not None:  # 朴素 KV：每一步把整段历史复制一遍
        k, v = torch.cat([kv[i][0], k]), torch.cat([kv[i][1], v])
    kv[i] = (k, v)
    k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)  # GQA：kv 头复制给 q 头
    s = torch.einsum("qhd,khd->hqk", q, k) * D**-0.5
    s = s.masked_fill(torch.arange(k.shape[0])[None, :] > pos[:, None], float("-inf"))  # 不看未来
    o = torch.einsum("hqk,khd->qhd", s.softmax(-1), v).reshape(T, H * D)
    return o @ W[p + "o_proj.weight"].T
# --8<-- [end:attention]


# --8<-- [start:forward]
def forward(ids: torch.Tensor, pos: torch.Tensor, kv: list) -> torch.Tensor:
    """ids, pos: (T,)；返回最后一个位置的 logits: (vocab,)。"""
    x = W["model.embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = x + attention(i, rms_norm(x, W[p + "input_layernorm.weight"]), pos, kv)
        h = rms_norm(x, W[p + "post_attention_layernorm.weight"])
        gate, up = h @ W[p + "mlp.gate_proj.weight"].T, h @ W[p + "mlp.up_proj.weight"].T
        x = x + (F.silu(gate) * up) @ W[p + "mlp.down_proj.weight"].T
    lm_head = W.get("lm_head.weight", W["model.embed_tokens.weight"])  # 绑定词嵌入时没有 lm_head
    return rms_norm(x[-1], W["model.norm.weight"]) @ lm_head.T
# --8<-- [end:forward]


def main() -> None:
    """命令行入口：打印 repr(提示词) -> repr(生成的文本)，最后一行 tokens/s；--json、--dump-logits 见第 0 步正文。"""
    ap = argparse.ArgumentParser(description="第 0 步：朴素的 Qwen3 贪心生成")
    ap.add_argument("--model", default="models/Qwen3-0.6B", help="Hugging Face 格式的模型目录")
    ap.add_argument("--prompt", action="append", help="可以给多次；默认一个英文句子")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--page-size", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="最后一行输出 {\"outputs\": [[token id...], ...]}")
    ap.add_argument("--dump-logits", help="把每一步的 logits 存成 safetensors（测试报告不一致时用）")
    args = ap.parse_args()
    if args.page_size != 1:
        ap.error(f"--page-size {args.page_size}：第 0 步没有分页 KV，只能是 1（分页 KV 从第 4 章开始）")
    # --8<-- [start:main]
    files = sorted(glob.glob(os.path.join(args.model, "*.safetensors")))
    if not files:
        ap.error(f"{args.model} 里没有 *.safetensors 文件")
    cfg.update(json.load(open(os.path.join(args.model, "config.json"))))
    if cfg.get("model_type") != "qwen3":
        ap.error(f"第 0 步只支持 Qwen3，{args.model}/config.json 的 model_type 是 {cfg.get('model_type')!r}")
    cfg["theta"] = cfg.get("rope_theta") or cfg["rope_parameters"]["rope_theta"]  # 老形式在顶层，新形式在字典里
    cfg["head_dim"] = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    for f in files:
        with safe_open(f, framework="pt") as sf:
            W.update({k: sf.get_tensor(k).float() for k in sf.keys()})
    tok = AutoTokenizer.from_pretrained(args.model)
    outputs, dumped, total, seconds = [], {}, 0, 0.0
    with torch.inference_mode():
        for n, prompt in enumerate(args.prompt or ["The capital of France is"]):
            ids = torch.tensor(tok(prompt).input_ids)
            pos, kv, out, logits_seen = torch.arange(len(ids)), [None] * cfg["num_hidden_layers"], [], []
            t0 = time.perf_counter()
            for _ in range(args.max_new_tokens):
                logits = forward(ids, pos, kv)
                out.append(int(logits.argmax()))
                logits_seen.append(logits)
                ids, pos = torch.tensor(out[-1:]), pos[-1:] + 1
            seconds += time.perf_counter() - t0
            total += len(out)
            outputs.append(out)
            dumped[f"p{n}"] = torch.stack(logits_seen)
            # --8<-- [end:main]
            if not args.json:
                print(f"{prompt!r} -> {tok.decode(out)!r}")
    if args.dump_logits:
        save_file(dumped, args.dump_logits)
    if args.json:
        print(json.dumps({"outputs": outputs}))
    else:
        print(f"{total} tokens，{total / seconds:.1f} tokens/s（逐个请求，含 prefill）")


if __name__ == "__main__":
    main()
