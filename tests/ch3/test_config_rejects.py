"""第 3 章：config.json 和权重对不上、transformers 自己不接受的配置，都是一个说出文件和字段的 ValueError；
读配置、查结构不会把模型类装进来（注册表只记名字，和官方一样用到时才 import）。"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from minisgl.models import load_hf_config
from tests.ch3.common import build_meta, config_of, stream
from tests.harness.errors import expect_error


def copy_with_config(tiny_models, tmp_path, **changes):
    path = shutil.copytree(tiny_models["qwen3-tied"], tmp_path / "m")
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))
    return path


def test_task6_more_layers_in_config_than_in_the_weights(tiny_models, tmp_path):
    """config.json 说 5 层、权重只有 3 层：读完文件就报，说出检查点里的名字（q_proj，不是合并后的 qkv_proj）和文件。"""
    path = copy_with_config(tiny_models, tmp_path, num_hidden_layers=5, layer_types=["full_attention"] * 5)
    with expect_error("ch3/more_layers_than_weights", key="model.layers.3.self_attn.q_proj.weight",
                      name="model.safetensors"):
        stream(path, build_meta(config_of(path)))


@pytest.mark.parametrize("changes, culprit", [
    ({"num_hidden_layers": 5}, "layer_types"),  # 层数和 layer_types 对不上：huggingface_hub 的校验异常
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e6}}, "factor"),  # llama3 缩放缺参数：KeyError
])
def test_task1_config_transformers_rejects_is_one_value_error(tiny_models, tmp_path, changes, culprit):
    path = copy_with_config(tiny_models, tmp_path, **changes)
    with expect_error("ch3/transformers_rejects", culprit=culprit):
        load_hf_config(str(path))


def test_task2_reading_the_config_does_not_import_the_model_classes(checkpoint):
    """ModelConfig、load_hf_config、check_architecture 都不需要 decoder.py：它只在 create_model 时才 import。"""
    code = ("import sys; from minisgl.models.config import ModelConfig, load_hf_config; "
            "from minisgl.models.register import check_architecture; check_architecture('Qwen3ForCausalLM'); "
            "print('minisgl.models.decoder' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=checkpoint.path,
                         env={"PYTHONPATH": str(checkpoint.path), "PATH": ""})
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False", res.stdout
