"""第 3 章两个测试文件共用的常量和小工具。按完整的点分名字导入：from tests.ch3.common import ...
（各章目录没有 __init__.py，pytest 会把它们放上 sys.path，只写 common 会和别章的同名模块撞上）。"""

import torch
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
