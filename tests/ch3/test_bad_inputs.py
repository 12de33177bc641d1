"""第 3 章起：模型目录和权重文件出错时，报错说出是哪个路径、哪个文件、哪个字段、哪个张量；绝不 unpickle。
最后是加载器"切 + 合并"的性质测试：随机形状的检查点按 TP=1、2、4 加载，各 rank 的分片拼回去等于完整的张量。

（缺张量、多出来的张量、形状不符、只有 pickle 的检查点见 test_loading.py 的 task6。）
"""

import json
import pickle
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load as load_safetensors_bytes
from safetensors.torch import save_file

from minisgl.models import ModelConfig, RotaryConfig, load_hf_config
from tests.ch3.common import build_meta, config_of, load_into, refusals, stream
from tests.harness.errors import expect_error

ARCHS = ["LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"]
NEEDED = ["architectures", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
          "vocab_size", "max_position_embeddings", "rms_norm_eps"]



def copy_model(tiny_models, name, tmp_path):
    return shutil.copytree(tiny_models[name], tmp_path / name)


def edit_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (path / "config.json").write_text(json.dumps(cfg))


# ---------------------------------------------------------------- 模型目录和 config.json

def test_model_path_missing(tmp_path):
    missing = tmp_path / "no_such_model"
    with expect_error("ch3/model_dir_missing", path=missing):
        load_hf_config(str(missing))


def test_model_path_is_a_file(tmp_path):
    file = tmp_path / "model.safetensors"
    file.write_bytes(b"")
    with expect_error("ch3/model_path_is_a_file", path=file):
        load_hf_config(str(file))


def test_model_dir_without_config_json(tiny_models, tmp_path):
    path = copy_model(tiny_models, "qwen3-tied", tmp_path)
    (path / "config.json").unlink()
    with expect_error("ch3/no_config_json", path=path):
        load_hf_config(str(path))


def test_config_json_not_json(tiny_models, tmp_path):
    path = copy_model(tiny_models, "qwen3-tied", tmp_path)
    (path / "config.json").write_text('{"architectures": ["Qwen3ForCausalLM"],')
    with expect_error("ch3/config_not_json", file=path / "config.json"):
        load_hf_config(str(path))


@pytest.mark.parametrize("arch", ["GPT2LMHeadModel", "MistralForCausalLM"])
def test_config_with_unsupported_architecture_lists_supported(tiny_models, tmp_path, arch):
    """在读权重之前就拒绝，说出它的名字并列出支持的三个。"""
    path = copy_model(tiny_models, "qwen3-tied", tmp_path)
    edit_config(path, architectures=[arch])
    with expect_error("ch3/config_unsupported_architecture", file=path / "config.json", arch=arch):
        load_hf_config(str(path))


@pytest.mark.parametrize("field", NEEDED)
def test_config_missing_a_needed_field(tiny_models, tmp_path, field):
    """缺了就会被 transformers 悄悄填上默认值（比如 hidden_size=4096）的字段：说出缺哪个、在哪个文件。"""
    path = copy_model(tiny_models, "qwen2", tmp_path)
    edit_config(path, **{field: None})
    with expect_error("ch3/missing_field", field=field, file=path / "config.json"):
        load_hf_config(str(path))


@pytest.mark.parametrize("name", ["qwen3-tied", "qwen3-untied", "qwen2", "llama3"])
def test_good_configs_load_the_same_as_autoconfig(tiny_models, name):
    assert ModelConfig.from_hf(load_hf_config(str(tiny_models[name]))) == config_of(tiny_models[name])


# ---------------------------------------------------------------- 权重文件

@pytest.mark.parametrize("cut", ["half", "header_only", "garbage"])
def test_truncated_or_corrupted_safetensors(tiny_models, tmp_path, cut):
    path = copy_model(tiny_models, "qwen3-tied", tmp_path)
    file = path / "model.safetensors"
    data = file.read_bytes()
    header_end = 8 + int.from_bytes(data[:8], "little")
    file.write_bytes({"half": data[:len(data) // 2], "header_only": data[:header_end],
                      "garbage": b"\x00not a safetensors file" * 4}[cut])
    model = build_meta(config_of(path))
    with expect_error("ch3/corrupt_safetensors", file=file):
        stream(path, model)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int8, torch.float8_e4m3fn])
def test_tensor_of_wrong_dtype(tiny_models, tmp_path, dtype):
    """整数或 fp8 的权重会被引擎的 .to(dtype) 悄悄转成错的数：加载时就拒绝，说出张量和文件。"""
    path = copy_model(tiny_models, "qwen3-tied", tmp_path)
    file = path / "model.safetensors"
    tensors = load_safetensors_bytes(file.read_bytes())
    key = "model.layers.1.mlp.down_proj.weight"
    tensors[key] = tensors[key].to(dtype)
    save_file(tensors, str(file))
    model = build_meta(config_of(path))
    with expect_error("ch3/non_float_weight", name="model.safetensors", key=key, dtype=dtype):
        stream(path, model)


def test_no_safetensors_names_the_dir(tiny_models, tmp_path):
    path = tmp_path / "empty"
    path.mkdir()
    shutil.copy(tiny_models["qwen3-tied"] / "config.json", path / "config.json")
    with expect_error("ch3/no_weights", dir=path):
        stream(path, build_meta(config_of(path)))


@pytest.mark.parametrize("key, engine_key", [
    ("model.layers.1.mlp.down_proj.weight", "model.layers.1.mlp.down_proj.weight"),  # 转置了
    ("model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.qkv_proj.weight"),  # 合并前的一块
])
def test_tensor_of_wrong_shape(tiny_models, tmp_path, key, engine_key):
    """单个张量形状不对（config.json 没问题）：说出引擎里的键和两边的形状。"""
    path = copy_model(tiny_models, "qwen3-tied", tmp_path)
    file = path / "model.safetensors"
    tensors = load_safetensors_bytes(file.read_bytes())
    t = tensors[key]
    tensors[key] = t.t().contiguous()
    save_file(tensors, str(file))
    model = build_meta(config_of(path))
    refused = refusals(path, model)
    assert [(r["key"], r["engine"]) for r in refused] == [(key, engine_key)], "shard() 应当只拒绝改过的这一个张量"
    with expect_error("ch3/shard_shape", **refused[0]):
        load_into(model, path)


def test_norm_of_wrong_shape(tiny_models, tmp_path):
    """norm 不切（shard 原样交出）：形状不对由 load_state_dict 报（第 2 章的检查），说出键和两边的形状。"""
    path = copy_model(tiny_models, "qwen3-tied", tmp_path)
    file = path / "model.safetensors"
    tensors = load_safetensors_bytes(file.read_bytes())
    t = tensors["model.norm.weight"]
    tensors["model.norm.weight"] = torch.cat([t, t[:1]])
    save_file(tensors, str(file))
    with expect_error("ch2/state_mismatch", key="model.norm.weight", want=tuple(t.shape), got=(len(t) + 1,)):
        load_into(build_meta(config_of(path)), path)


def test_broken_shard_index(tiny_models, tmp_path):
    path = copy_model(tiny_models, "qwen3-untied", tmp_path)
    index = path / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}}))  # 没有 weight_map
    model = build_meta(config_of(path))
    with expect_error("ch3/bad_index", index=index):
        stream(path, model)


def test_no_code_path_unpickles(tiny_models, tmp_path, monkeypatch):
    """pickle 和 torch.load 一被调用就失败；目录里还放着一个会留下痕迹的 pytorch_model.bin：
    整个加载（配置 + 流式读权重 + 换进模型）照样成功，而且那个 .bin 从没被打开过。"""
    path = copy_model(tiny_models, "qwen3-untied", tmp_path)
    marker = tmp_path / "was_unpickled"

    class Trap:
        def __reduce__(self):
            return open, (str(marker), "w")

    (path / "pytorch_model.bin").write_bytes(pickle.dumps(Trap()))

    def forbidden(*args, **kwargs):
        raise AssertionError("加载器调用了 pickle / torch.load")

    for target, name in [(pickle, "load"), (pickle, "loads"), (pickle, "Unpickler"), (torch, "load")]:
        monkeypatch.setattr(target, name, forbidden)
    config = ModelConfig.from_hf(load_hf_config(str(path)))
    model = build_meta(config)
    load_into(model, path)
    assert not marker.exists()
    assert model.state_dict()["model.norm.weight"].device.type == "cpu"


# ---------------------------------------------------------------- 性质测试：切 + 合并，拼回去等于完整张量

@st.composite
def checkpoints(draw):
    hq = draw(st.sampled_from([4, 8]))
    hkv = draw(st.sampled_from([h for h in (1, 2, 4) if hq % h == 0]))
    head_dim = draw(st.sampled_from([4, 8]))
    return dict(arch=draw(st.sampled_from(ARCHS)), hq=hq, hkv=hkv, head_dim=head_dim,
                hidden=draw(st.sampled_from([8, 16])), inter=4 * draw(st.integers(1, 3)),
                vocab=draw(st.sampled_from([16, 18, 21])), layers=draw(st.integers(1, 2)), tie=draw(st.booleans()),
                seed=draw(st.integers(0, 2**31 - 1)))


def model_config(c):
    return ModelConfig(num_layers=c["layers"], num_qo_heads=c["hq"], num_kv_heads=c["hkv"], head_dim=c["head_dim"],
                       hidden_size=c["hidden"], vocab_size=c["vocab"], intermediate_size=c["inter"],
                       rms_norm_eps=1e-6, rotary_config=RotaryConfig(c["head_dim"], c["head_dim"], 64, 1e4, None),
                       hidden_act="silu", tie_word_embeddings=c["tie"], model_type="test",
                       architectures=[c["arch"]])


def write_checkpoint(config, dirname, seed):
    """按 HF 的名字（q/k/v、gate/up 分开）写一个随机权重的检查点；形状从 TP=1 的模型反推。"""
    g = torch.Generator().manual_seed(seed)
    hq, hkv, d = config.num_qo_heads, config.num_kv_heads, config.head_dim
    hf = {}
    for key, t in build_meta(config).state_dict().items():
        if ".qkv_proj." in key:
            for part, n in (("q_proj", hq), ("k_proj", hkv), ("v_proj", hkv)):
                hf[key.replace("qkv_proj", part)] = torch.randn(n * d, *t.shape[1:], generator=g)
        elif ".gate_up_proj." in key:
            for part in ("gate_proj", "up_proj"):
                hf[key.replace("gate_up_proj", part)] = torch.randn(t.shape[0] // 2, *t.shape[1:], generator=g)
        else:
            hf[key] = torch.randn(*t.shape, generator=g)
    save_file(hf, str(Path(dirname) / "model.safetensors"))
    return hf


def recombine(key, shards, config):
    """各 rank 的分片 -> HF 名字下的完整张量（从头按切法拼，不用被测的代码）。"""
    tp, d = len(shards), config.head_dim
    if ".qkv_proj." in key:
        nq, nkv = config.num_qo_heads // tp, max(1, config.num_kv_heads // tp)
        q = torch.cat([s[:nq * d] for s in shards])
        k_parts = [s[nq * d:(nq + nkv) * d] for s in shards]
        v_parts = [s[(nq + nkv) * d:] for s in shards]
        step = max(1, tp // config.num_kv_heads)  # KV 头少于 TP 份数时，相邻 step 个 rank 共用一个头的副本
        for r in range(tp):
            assert torch.equal(k_parts[r], k_parts[r - r % step])
            assert torch.equal(v_parts[r], v_parts[r - r % step])
        return {key.replace("qkv_proj", "q_proj"): q,
                key.replace("qkv_proj", "k_proj"): torch.cat(k_parts[::step]),
                key.replace("qkv_proj", "v_proj"): torch.cat(v_parts[::step])}
    if ".gate_up_proj." in key:
        half = shards[0].shape[0] // 2
        return {key.replace("gate_up_proj", "gate_proj"): torch.cat([s[:half] for s in shards]),
                key.replace("gate_up_proj", "up_proj"): torch.cat([s[half:] for s in shards])}
    if ".o_proj." in key or ".down_proj." in key:
        return {key: torch.cat(shards, dim=1)}
    if "embed_tokens" in key or "lm_head" in key:
        full = torch.cat(shards)
        assert not full[config.vocab_size:].any(), "词表补齐的行应当是 0"
        return {key: full[:config.vocab_size]}
    assert all(torch.equal(s, shards[0]) for s in shards), f"{key} 应当每个 rank 一份完整的"
    return {key: shards[0]}


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(c=checkpoints())
def test_tp_shards_recombine_to_full_tensors(c):
    config = model_config(c)
    with tempfile.TemporaryDirectory() as dirname:
        hf = write_checkpoint(config, dirname, c["seed"])
        for tp in (1, 2, 4):
            per_rank = []
            for rank in range(tp):
                model = build_meta(config, rank=rank, size=tp)
                shapes = {k: tuple(t.shape) for k, t in model.state_dict().items()}
                got = dict(stream(dirname, model, rank, tp))
                assert got.keys() == shapes.keys()
                assert all(tuple(t.shape) == shapes[k] for k, t in got.items()), f"tp={tp} rank={rank} 形状不对"
                per_rank.append(got)
            rebuilt = {}
            for key in per_rank[0]:
                rebuilt.update(recombine(key, [r[key] for r in per_rank], config))
            assert rebuilt.keys() == hf.keys(), f"tp={tp}"
            for key, full in hf.items():
                assert torch.equal(rebuilt[key], full), f"tp={tp} {key}（{c}）"


@st.composite
def shrunk_configs(draw):
    """一个检查点，和一份把某个字段改小了的 config.json（改小后模型在 TP=1、2、4 下都还建得出来）。"""
    c = draw(checkpoints())
    options = {"vocab": list(range(4, c["vocab"])), "inter": list(range(4, c["inter"], 4)),
               "hq": [h for h in (4,) if h < c["hq"] and h % c["hkv"] == 0],
               "hkv": [h for h in (1, 2) if h < c["hkv"]]}
    field = draw(st.sampled_from(sorted(k for k, v in options.items() if v)))
    return c, {**c, field: draw(st.sampled_from(options[field]))}


@settings(max_examples=15, deadline=None, derandomize=True, database=None)
@given(pair=shrunk_configs())
def test_task6_config_smaller_than_checkpoint_is_refused__needs_layer_shard_checks(pair):
    """HF 在这里报 size mismatch；只切不查会悄悄截掉多出来的行或列。每个 TP 下都拒绝，说出是哪个文件。"""
    real, claimed = pair
    with tempfile.TemporaryDirectory() as dirname:
        write_checkpoint(model_config(real), dirname, real["seed"])
        for tp in (1, 2, 4):
            model = build_meta(model_config(claimed), rank=0, size=tp)
            with expect_error("ch3/shard_shape", one_of=refusals(dirname, model, 0, tp)):
                stream(dirname, model, 0, tp)
