"""第 3 章（一）：ModelConfig 从 HF 配置里取数，注册表按 architectures 选类，三个家族的两个开关，
meta 设备上构造模型不分配内存、加载后按引擎的 dtype 换成真张量。"""

import copy
import json

import pytest
import torch
from transformers import Qwen3Config

from minisgl.distributed import set_tp_info
from minisgl.models import BaseLLMModel, ModelConfig, load_weight
from minisgl.models.register import get_model_class
from tests.ch3.common import FAMILIES, MERGED, build_meta, config_of, load_into
from tests.harness.errors import expect_error
from tests.harness.reference import hf_tensors
from tools.models.make_tiny_models import FAMILIES as TINY

ARCHS = ["LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"]

ARCH_OF = {"Qwen3Config": "Qwen3ForCausalLM", "Qwen2Config": "Qwen2ForCausalLM", "LlamaConfig": "LlamaForCausalLM"}


def spec(name):
    """tools/models/make_tiny_models.py 给这个小模型的配置（期望值从那张表算，不在这里再抄一遍）。"""
    cls, kw, _, _ = TINY[name]
    head_dim = kw.get("head_dim") or kw["hidden_size"] // kw["num_attention_heads"]
    return dict(kw, architecture=ARCH_OF[cls], head_dim=head_dim)


# 名字 -> (q/k/v 有 bias, q/k 有 RMSNorm)
SWITCHES = {"qwen3-tied": (False, True), "qwen3-untied": (False, True), "qwen2": (True, False),
            "llama3": (False, False)}


def engine_name(hf_key):
    for merged, parts in MERGED.items():
        for p in parts:
            if f".{p}." in hf_key:
                return hf_key.replace(f".{p}.", f".{merged}.")
    return hf_key


def merged_from_hf(engine_key, hf):
    for merged, parts in MERGED.items():
        if f".{merged}." in engine_key:
            return torch.cat([hf[engine_key.replace(f".{merged}.", f".{p}.")] for p in parts])
    return hf[engine_key]


# ---------------------------------------------------------------- task1：ModelConfig.from_hf

@pytest.mark.parametrize("name", FAMILIES)
def test_task1_config_fields(tiny_models, name):
    """四个小模型各自的配置：head_dim（含显式给出的）、头数、层数、宽度、词表、eps、RoPE base 和表长。"""
    c, e = config_of(tiny_models[name]), spec(name)
    assert c.architectures[0] == e["architecture"]
    assert c.head_dim == e["head_dim"]
    assert (c.rotary_config.head_dim, c.rotary_config.rotary_dim) == (e["head_dim"], e["head_dim"])
    assert (c.num_qo_heads, c.num_kv_heads) == (e["num_attention_heads"], e["num_key_value_heads"])
    assert c.tie_word_embeddings is e["tie_word_embeddings"]
    assert c.rotary_config.base == e["rope_theta"]
    assert isinstance(c.rotary_config.base, float)
    assert (c.num_layers, c.hidden_size, c.vocab_size, c.intermediate_size) == \
        (e["num_hidden_layers"], e["hidden_size"], e["vocab_size"], e["intermediate_size"])
    assert (c.hidden_act, c.rms_norm_eps, c.rotary_config.max_position) == \
        ("silu", e["rms_norm_eps"], e["max_position_embeddings"])


def test_task1_rope_scaling(tiny_models):
    """只有 llama3 带缩放（rope_type=llama3 和它的四个参数）；其余是默认 RoPE，scaling 为 None。"""
    scaling = config_of(tiny_models["llama3"]).rotary_config.scaling
    assert isinstance(scaling, dict)
    assert scaling["rope_type"] == "llama3"
    want = spec("llama3")["rope_scaling"]
    for key in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
        assert scaling[key] == want[key], key
    for name in ["qwen3-tied", "qwen3-untied", "qwen2"]:
        assert config_of(tiny_models[name]).rotary_config.scaling is None, name


def to_other_form(cfg):
    """hub 老形式（顶层 rope_theta / rope_scaling / torch_dtype）
    和 transformers 5 形式（rope_parameters / dtype）互换。"""
    cfg = copy.deepcopy(cfg)
    if "rope_parameters" in cfg:
        rope = dict(cfg.pop("rope_parameters"))
        cfg["rope_theta"] = rope.pop("rope_theta")
        cfg["rope_scaling"] = None if rope.get("rope_type", "default") == "default" else rope
        cfg["torch_dtype"] = cfg.pop("dtype", "float32")
    else:
        rope = dict(cfg.pop("rope_scaling", None) or {"rope_type": "default"})
        rope["rope_theta"] = cfg.pop("rope_theta")
        cfg["rope_parameters"] = rope
        cfg["dtype"] = cfg.pop("torch_dtype", "float32")
    return cfg


def rope_theta_of(cfg):
    return cfg["rope_parameters"]["rope_theta"] if "rope_parameters" in cfg else cfg["rope_theta"]


@pytest.mark.parametrize("name", FAMILIES)
def test_task1_both_config_forms_agree(tiny_models, tmp_path, name):
    """同一个模型的 config.json 写成另一种形式，得到的 ModelConfig 完全相同；改了那种形式里的 rope_theta 也读得到。"""
    original = json.loads((tiny_models[name] / "config.json").read_text())
    other = to_other_form(original)
    assert ("rope_parameters" in original) != ("rope_parameters" in other)  # 真的换了形式
    (tmp_path / "config.json").write_text(json.dumps(other))
    assert config_of(tmp_path) == config_of(tiny_models[name])

    changed = to_other_form(original)
    if "rope_parameters" in changed:
        changed["rope_parameters"]["rope_theta"] = 12345.0
    else:
        changed["rope_theta"] = 12345.0
    assert rope_theta_of(changed) == 12345.0
    (tmp_path / "config.json").write_text(json.dumps(changed))
    assert config_of(tmp_path).rotary_config.base == 12345.0


# ---------------------------------------------------------------- task2：注册表和家族开关

def test_task2_unknown_architecture_lists_supported(tiny_models):
    """不认识的结构：报错里说出它的名字，并列出支持的三个。"""
    config = config_of(tiny_models["qwen3-tied"])
    set_tp_info(0, 1)
    with expect_error("ch3/unsupported_architecture", arch="MistralForCausalLM"):
        get_model_class("MistralForCausalLM", config)


def test_task2_create_model_follows_architectures(tiny_models, tmp_path):
    """create_model 按 config.json 的 architectures[0] 选类：换成不支持的名字就报错，不悄悄当成 Llama。"""
    cfg = json.loads((tiny_models["qwen3-tied"] / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with expect_error("ch3/unsupported_architecture", arch="GPT2LMHeadModel"):
        build_meta(config_of(tmp_path))


def test_task2_activation_other_than_silu_is_refused(tiny_models, tmp_path):
    """hidden_act 不是 silu（HF 认 gelu 等）：建模型时就是一行 ValueError，不悄悄按 silu 算。"""
    cfg = json.loads((tiny_models["llama3"] / "config.json").read_text())
    cfg["hidden_act"] = "gelu_pytorch_tanh"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with expect_error("ch3/unsupported_activation", act="gelu_pytorch_tanh"):
        build_meta(config_of(tmp_path))


@pytest.mark.parametrize("name", FAMILIES)
def test_task2_model_class_per_family(tiny_models, name):
    model = build_meta(config_of(tiny_models[name]))
    assert isinstance(model, BaseLLMModel)
    assert type(model).__name__ == spec(name)["architecture"]


@pytest.mark.parametrize("name", FAMILIES)
def test_task2_family_switches(tiny_models, name):
    """Qwen3：q/k norm、无 bias；Qwen2：qkv 有 bias、无 q/k norm；Llama：都没有。每一层都一样。"""
    keys = set(build_meta(config_of(tiny_models[name])).state_dict())
    has_bias, has_qk_norm = SWITCHES[name]
    for i in range(spec(name)["num_hidden_layers"]):
        p = f"model.layers.{i}.self_attn."
        assert p + "qkv_proj.weight" in keys
        assert (p + "qkv_proj.bias" in keys) is has_bias, (name, i, "qkv bias")
        assert (p + "q_norm.weight" in keys) is has_qk_norm, (name, i, "q_norm")
        assert (p + "k_norm.weight" in keys) is has_qk_norm, (name, i, "k_norm")
        assert p + "o_proj.bias" not in keys  # o_proj 在三个家族里都没有 bias
        assert f"model.layers.{i}.mlp.gate_up_proj.weight" in keys


@pytest.mark.parametrize("name", FAMILIES)
def test_task2_state_dict_keys_match_checkpoint(tiny_models, name):
    """引擎的键 = 检查点的键合并 q/k/v、gate/up 之后的名字；lm_head.weight 只在不绑定时有。"""
    model = build_meta(config_of(tiny_models[name]))
    keys = set(model.state_dict())
    hf_keys = set(hf_tensors(tiny_models[name]))
    expected = {engine_name(k) for k in hf_keys} - ({"lm_head.weight"} if spec(name)["tie_word_embeddings"] else set())
    assert keys == expected, (sorted(keys - expected), sorted(expected - keys))
    assert ("lm_head.weight" in keys) is (not spec(name)["tie_word_embeddings"])


# ---------------------------------------------------------------- task3：meta 构造、加载后的设备和 dtype

@pytest.mark.parametrize("name", FAMILIES)
def test_task3_meta_build_has_shapes_but_no_memory(tiny_models, name):
    """构造完、加载前：每个参数都在 meta 上（没有分配），形状已经是检查点合并后的形状。"""
    model = build_meta(config_of(tiny_models[name]))
    sd = model.state_dict()
    assert sd
    not_meta = [k for k, t in sd.items() if t.device.type != "meta"]
    assert not not_meta, f"这些参数在构造时就分配了内存：{not_meta}"
    hf = hf_tensors(tiny_models[name])
    for key, t in sd.items():
        assert tuple(t.shape) == tuple(merged_from_hf(key, hf).shape), key


def test_task3_eight_billion_parameters_on_meta_cost_nothing():
    """按 Qwen3-8B 的尺寸画一个模型：三十多 GB 的参数全在 meta 上，瞬间完成。"""
    hf = Qwen3Config(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=512,
                     tie_word_embeddings=False, architectures=["Qwen3ForCausalLM"])
    model = build_meta(ModelConfig.from_hf(hf))
    sd = model.state_dict()
    total = sum(t.numel() * t.element_size() for t in sd.values())
    assert total > 30e9  # 确实是一个 8B 级别的模型（fp32）
    assert all(t.device.type == "meta" for t in sd.values())
    assert sd["model.layers.35.self_attn.qkv_proj.weight"].shape == ((32 + 2 * 8) * 128, 4096)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", FAMILIES)
def test_task3_loaded_weights_are_real_in_engine_dtype(tiny_models, name, dtype):
    """加载之后没有一个参数还在 meta 上，全是 CPU 上引擎要的 dtype；bf16 时是检查点的值在进来的路上转换的结果。"""
    model = build_meta(config_of(tiny_models[name]), dtype)
    assert all(t.dtype == dtype for t in model.state_dict().values())  # meta 张量也带 dtype
    load_into(model, tiny_models[name], dtype)
    sd = model.state_dict()
    still_meta = [k for k, t in sd.items() if t.device.type == "meta"]
    assert not still_meta, f"加载后还在 meta 上：{still_meta}"
    assert all(t.device.type == "cpu" for t in sd.values())
    wrong = {k: t.dtype for k, t in sd.items() if t.dtype != dtype}
    assert not wrong, f"dtype 不是 {dtype}：{wrong}"
    hf = hf_tensors(tiny_models[name])
    for key, t in sd.items():
        assert torch.equal(t, merged_from_hf(key, hf).to(dtype)), key


def test_task3_load_without_conversion_is_refused(tiny_models):
    """按 bf16 构造的模型收到 fp32 张量（忘了边收边转）：报错说出是哪个键、两边的 dtype。"""
    path = tiny_models["qwen3-tied"]
    model = build_meta(config_of(path), torch.bfloat16)
    set_tp_info(0, 1)
    with expect_error("ch2/state_mismatch", key="model.embed_tokens.weight", want=torch.bfloat16,
                      got=torch.float32):
        model.load_state_dict(dict(load_weight(str(path), model)))

