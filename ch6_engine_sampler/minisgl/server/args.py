"""generate.py 的命令行（官方也把它放在 server/args.py）：参数本身、只看参数就能查的错误，以及按提示词长度
定下 EngineConfig。这些错误按命令行参数的名字报，并且在加载模型之前。"""

from __future__ import annotations

import argparse
import os
from typing import List, NoReturn

import torch

from minisgl.distributed import DistributedInfo
from minisgl.engine import EngineConfig
from minisgl.utils import div_ceil

from .launch import free_addr


class _Parser(argparse.ArgumentParser):
    """参数错了只打印一行 错误：…（argparse 默认先打一整段 usage）；完整用法 --help 里有。"""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"错误：{message}（用法见 {self.prog} --help）\n")


def parse_args(argv: List[str] | None = None, doc: str | None = None) -> argparse.Namespace:
    ap = _Parser(prog="generate.py", description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="models/Qwen3-0.6B", help="Hugging Face 格式的模型目录")
    ap.add_argument("--prompt", action="append", help="可以给多次；默认一个英文句子")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--page-size", type=int, default=1, help="一页几个槽位；不超过 --max-seq-len")
    ap.add_argument("--json", action="store_true", help="最后一行输出 {\"outputs\": [[token id...], ...]}")
    ap.add_argument("--dump-logits", help="把每一步的 logits 存成 safetensors（测试报告不一致时用）")
    ap.add_argument("--num-pages", type=int, help="KV 池的页数；默认正好够用")
    ap.add_argument("--max-seq-len", type=int, help="一个请求最多几个位置；默认最长提示词 + 生成长度")
    ap.add_argument("--attention-backend", default="auto", help="注意力后端：torch、fi、fa，或 预填充,解码 两个名字")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 表示贪心")
    ap.add_argument("--top-k", type=int, default=-1)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0, help="采样的随机种子：同一个种子，同样的输出")
    ap.add_argument("--tp", type=int, default=1, help="张量并行的份数：起这么多个进程（CPU 上 gloo，GPU 上 NCCL）")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                    help="auto：有 GPU 就用（每个 rank 一块）；cpu：GPU 机器上也在 CPU 上跑（卡比 --tp 少时）")
    ap.add_argument("--dist-addr", help="各进程会合的地址（tcp://HOST:PORT 或 file://PATH）；默认找一个空闲端口")
    ap.add_argument("--dist-timeout", type=float, default=60.0, help="会合和每次集合通信最多等几秒，超时报错而不是挂着")
    args = ap.parse_args(argv)
    args.prompt = args.prompt or ["The capital of France is"]
    if args.page_size < 1 or args.max_new_tokens < 1 or args.tp < 1:
        ap.error("--page-size、--max-new-tokens 和 --tp 都必须是正整数")
    if any(v is not None and v < 1 for v in (args.num_pages, args.max_seq_len)):
        ap.error("--num-pages 和 --max-seq-len 给了就必须是正整数")
    if not os.path.isfile(os.path.join(args.model, "config.json")):
        ap.error(f"--model {args.model}：找不到 {os.path.join(args.model, 'config.json')}")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda：这台机器上的 torch 看不到 GPU")
    if args.dump_logits and os.path.isdir(args.dump_logits):  # 生成完才发现就晚了
        ap.error(f"--dump-logits {args.dump_logits}：这是一个目录，要给文件路径")
    return args


def engine_config(args: argparse.Namespace, prompt_ids: List[List[int]]) -> EngineConfig:
    """所有请求一个 batch：max_running_req 是请求数，max_seq_len 和 KV 池默认正好够用。
    空提示词、放不下的长度、用不满的页：加载模型之前就按命令行参数的名字报错。"""
    n, ps = args.max_new_tokens, args.page_size
    if empty := [p for p, ids in zip(args.prompt, prompt_ids) if not ids]:
        raise ValueError(f"--prompt {empty[0]!r} 被分词器编码成了 0 个 token：提示词至少要有一个 token")
    need = max(map(len, prompt_ids)) + n
    max_seq_len = args.max_seq_len or need
    if need > max_seq_len:
        raise ValueError(f"最长的提示词 {need - n} 个 token + --max-new-tokens {n} = {need}，超过了 --max-seq-len "
                         f"{max_seq_len}（规则：提示词 token 数 + --max-new-tokens <= --max-seq-len）")
    if ps > max_seq_len:
        raise ValueError(f"--page-size {ps} 大于 --max-seq-len {max_seq_len}：一页里多出来的槽位没有请求用得到")
    # 每个请求最多写 len + n - 1 个位置的 KV（最后采出的那个 token 不再前向），按页向上取整
    num_pages = args.num_pages or sum(div_ceil(len(ids) + n - 1, ps) for ids in prompt_ids)
    return EngineConfig(model_path=args.model, tp_info=DistributedInfo(0, args.tp), dtype=torch.float32,
                        max_running_req=len(prompt_ids), attention_backend=args.attention_backend,
                        page_size=ps, num_page_override=num_pages, max_seq_len_override=max_seq_len,
                        distributed_timeout=args.dist_timeout, distributed_addr=args.dist_addr or free_addr(),
                        device=args.device)
