"""第 3 章两个测试文件共用的常量和小工具。按完整的点分名字导入：from tests.ch3.common import ...
（各章目录没有 __init__.py，pytest 会把它们放上 sys.path，只写 common 会和别章的同名模块撞上）。"""

from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoConfig

from minisgl.distributed import reset_tp_info, set_tp_info
from minisgl.models import ModelConfig, create_model, load_weight
from minisgl.utils import torch_dtype

FAMILIES = ["qwen3-tied", "qwen3-untied", "qwen2", "llama3"]
MERGED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def config_of(path):
    return ModelConfig.from_hf(AutoConfig.from_pretrained(path))


def build_meta(config, dtype=torch.float32, rank=0, size=1):
    set_tp_info(rank, size)
    try:
        with torch.device("meta"), torch_dtype(dtype):
            return create_model(config)
    finally:
        reset_tp_info()


def load_into(model, path, dtype=torch.float32, rank=0, size=1):
    """边收边转 dtype，整体换进模型（模型已在 meta 上构造好）。"""
    set_tp_info(rank, size)
    try:
        model.load_state_dict({name: t.to(dtype) for name, t in load_weight(str(path), model)})
    finally:
        reset_tp_info()


def stream(path, model, rank=0, size=1):
    """load_weight 交出的 (名字, 张量)，按交出的顺序。"""
    set_tp_info(rank, size)
    try:
        return list(load_weight(str(path), model))
    finally:
        reset_tp_info()


def op_of(model, prefix):
    """按点分名字找算子（测试自己找，不经过被测的 find_op）；找不到返回 None。"""
    op = model
    for part in prefix.split("."):
        op = op.op_list[int(part)] if part.isdigit() and hasattr(op, "op_list") else getattr(op, part, None)
        if op is None:
            return None
    return op


def refusals(path, model, rank=0, size=1):
    """检查点里 shard 会拒绝的每个张量，写成报错清单 ch3/shard_shape 的回显：file、key、engine、reason。
    config 写小了时往往不止一个张量对不上，加载器先碰到哪个都对（expect_error 的 one_of）。"""
    out = []
    set_tp_info(rank, size)
    try:
        for file in sorted(Path(path).glob("*.safetensors")):
            with safe_open(str(file), framework="pt") as f:
                for key in f.keys():
                    engine, part = key, 0
                    for merged, parts in MERGED.items():
                        for i, p in enumerate(parts):
                            if f".{p}." in key:
                                engine, part = key.replace(f".{p}.", f".{merged}."), i
                    op = op_of(model, engine.rsplit(".", 1)[0])
                    if op is None or not hasattr(op, "shard"):
                        continue
                    try:
                        op.shard(f.get_tensor(key), part)
                    except ValueError as e:
                        out.append(dict(file=str(file), key=key, engine=engine, reason=str(e)))
    finally:
        reset_tp_info()
    assert out, f"{path} 和 config 对不上，shard() 却一个张量也不拒绝：形状检查在第 2 章任务 3 的 shard 里"
    return out
