"""第 4 章：预分配的 KV 池。一次分好、原地写新槽位、历史不搬家；page table 存原始槽位，页大小不影响结果。"""

import importlib.util

import pytest
import torch

from minisgl.core import Batch, Context, Req, SamplingParams, reset_global_ctx, set_global_ctx
from minisgl.distributed import reset_tp_info, set_tp_info
from minisgl.kvcache import BaseKVCachePool, MHAKVCache, create_kvcache_pool
from tests.harness import parity
from tests.harness.contract import build_argv, parse_outputs, run_in_process, run_subprocess
from tests.harness.errors import expect_exit, run_cli
from tools.manifest import PROMPTS

SENTINEL = 12345.0
H_KV, D, LAYERS = 2, 8, 3


@pytest.fixture
def tp1():
    reset_tp_info()
    set_tp_info(0, 1)
    yield
    reset_tp_info()


@pytest.fixture
def global_ctx():
    """每个测试自己的全局 Context；结束时一定清掉（后面的测试还要 set_global_ctx）。"""
    reset_global_ctx()

    def make(page_size):
        ctx = Context(page_size=page_size)
        set_global_ctx(ctx)
        return ctx

    yield make
    reset_global_ctx()


def make_pool(num_pages=6, page_size=4, dtype=torch.float32, h_kv=H_KV):
    return MHAKVCache(num_kv_heads=h_kv, num_layers=LAYERS, head_dim=D, num_pages=num_pages, page_size=page_size,
                      dtype=dtype, device=torch.device("cpu"))


def fill(pool, value=SENTINEL):
    for layer in range(pool.num_layers):
        pool.k_cache(layer).fill_(value)
        pool.v_cache(layer).fill_(value)


def snapshot(pool):
    """(2, 层数, 槽位数, H_kv, D) 的拷贝：按扁平槽位排好，方便逐槽位比较。"""
    ks = [pool.k_cache(i).reshape(-1, *pool.k_cache(i).shape[2:]) for i in range(pool.num_layers)]
    vs = [pool.v_cache(i).reshape(-1, *pool.v_cache(i).shape[2:]) for i in range(pool.num_layers)]
    return torch.stack([torch.stack(ks), torch.stack(vs)]).clone()


def storage_ptr(t):
    return t.untyped_storage().data_ptr()


# ---------------------------------------------------------------- 任务 1：池的形状、视图、只写给定槽位


def test_task1_shapes_dtype_device(tp1):
    pool = make_pool(num_pages=5, page_size=4, dtype=torch.float16)
    assert isinstance(pool, BaseKVCachePool)
    assert pool.num_layers == LAYERS
    assert pool.dtype == torch.float16
    assert pool.device == torch.device("cpu")
    for layer in range(LAYERS):
        assert tuple(pool.k_cache(layer).shape) == (5, 4, H_KV, D)
        assert tuple(pool.v_cache(layer).shape) == (5, 4, H_KV, D)
        assert pool.k_cache(layer).dtype == torch.float16


def test_task1_views_share_one_preallocated_buffer(tp1):
    """所有层的 K、V 都是同一块预分配内存的视图：总共只分配一次 2·层数·页数·page_size·H_kv·D 个元素。"""
    pool = make_pool(num_pages=6, page_size=4)
    views = [pool.k_cache(i) for i in range(LAYERS)] + [pool.v_cache(i) for i in range(LAYERS)]
    assert len({storage_ptr(v) for v in views}) == 1, "k_cache/v_cache 应该是同一个 buffer 的视图"
    storage = views[0].untyped_storage()
    assert storage.nbytes() == 2 * LAYERS * 6 * 4 * H_KV * D * 4
    starts = sorted(v.data_ptr() for v in views)
    assert len(set(starts)) == 2 * LAYERS  # 各占各的一段，互不重叠
    # 视图就是池本身：通过 k_cache 写进去的，下一次 k_cache 读得到
    pool.k_cache(1)[2, 3].fill_(7.0)
    assert torch.all(pool.k_cache(1)[2, 3] == 7.0)


@pytest.mark.parametrize("loc_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("kv_shape", ["flat", "heads"])
def test_task1_store_kv_writes_only_the_given_slots(tp1, loc_dtype, kv_shape):
    page_size, num_pages, layer = 4, 6, 1
    pool = make_pool(num_pages=num_pages, page_size=page_size)
    fill(pool)
    before = snapshot(pool)
    ptr = storage_ptr(pool.k_cache(0))
    slots = [21, 2, 9, 14, 3]  # 跨页、乱序：slot = page * page_size + offset
    g = torch.Generator().manual_seed(0)
    k = torch.randn(len(slots), H_KV, D, generator=g)
    v = torch.randn(len(slots), H_KV, D, generator=g)
    shape = (len(slots), H_KV * D) if kv_shape == "flat" else (len(slots), H_KV, D)
    pool.store_kv(k.reshape(shape), v.reshape(shape), torch.tensor(slots, dtype=loc_dtype), layer)

    for i, s in enumerate(slots):  # 分页视图里的位置：[slot // page_size, slot % page_size]
        assert torch.equal(pool.k_cache(layer)[s // page_size, s % page_size], k[i])
        assert torch.equal(pool.v_cache(layer)[s // page_size, s % page_size], v[i])
    after = snapshot(pool)
    changed = (after != before).flatten(3).any(-1)  # (2, 层数, 槽位数)
    expected = torch.zeros_like(changed)
    expected[:, layer, slots] = True
    assert torch.equal(changed, expected), "只有第 layer 层 K、V 的这几个槽位可以变"
    others = [s for s in range(num_pages * page_size) if s not in slots]
    assert torch.all(after[:, :, others] == SENTINEL)
    assert storage_ptr(pool.k_cache(0)) == ptr


def test_task1_many_stores_never_reallocate(tp1):
    """反复写：池的内存始终是同一块（没有 torch.cat、没有重新分配），每次写都能从视图里读回来。"""
    pool = make_pool(num_pages=8, page_size=2)
    storage = pool.k_cache(0).untyped_storage()
    ptr, views = storage.data_ptr(), [pool.k_cache(i) for i in range(LAYERS)]
    for step in range(40):
        slot = (step * 7) % 16
        val = torch.full((1, H_KV * D), float(step))
        for layer in range(LAYERS):
            pool.store_kv(val, -val, torch.tensor([slot], dtype=torch.int32), layer)
        assert storage_ptr(pool.k_cache(LAYERS - 1)) == ptr
        assert storage_ptr(pool.v_cache(0)) == ptr
        assert torch.all(views[0][slot // 2, slot % 2] == float(step))  # 早先拿到的视图也看得见新写入
        assert torch.all(pool.v_cache(2)[slot // 2, slot % 2] == -float(step))


def test_task1_page_size_does_not_change_the_flat_layout(tp1):
    """同一批槽位、同样的 K/V：page_size = 1、4、16 时，把分页视图摊平成 (槽位, H_kv, D) 完全一样。"""
    total, layer = 48, 2
    g = torch.Generator().manual_seed(1)
    slots = torch.randperm(total, generator=g)[:20]
    k, v = torch.randn(20, H_KV * D, generator=g), torch.randn(20, H_KV * D, generator=g)
    flats = []
    for ps in [1, 4, 16]:
        pool = make_pool(num_pages=total // ps, page_size=ps)
        fill(pool, 0.0)
        pool.store_kv(k, v, slots, layer)
        assert tuple(pool.k_cache(layer).shape) == (total // ps, ps, H_KV, D)
        flats.append(snapshot(pool))
    assert torch.equal(flats[0], flats[1])
    assert torch.equal(flats[0], flats[2])
    assert torch.equal(flats[0][0, layer, slots].reshape(20, -1), k)


@pytest.mark.parametrize("kv_heads,tp,local", [(4, 2, 2), (2, 2, 1), (1, 2, 1), (2, 4, 1)])
def test_task1_tensor_parallel_local_kv_heads(kv_heads, tp, local):
    """张量并行：每份只存自己的 kv 头；kv 头少于份数时每份存 1 个（复制）。"""
    reset_tp_info()
    set_tp_info(1, tp)
    try:
        pool = make_pool(num_pages=3, page_size=2, h_kv=kv_heads)
        assert tuple(pool.k_cache(0).shape) == (3, 2, local, D)
        pool.store_kv(torch.ones(2, local * D), torch.ones(2, local * D), torch.tensor([0, 5]), 0)
    finally:
        reset_tp_info()


def test_task1_create_kvcache_pool_from_model_config(tp1, tiny_models):
    from transformers import AutoConfig

    from minisgl.models import ModelConfig

    config = ModelConfig.from_hf(AutoConfig.from_pretrained(tiny_models["qwen3-untied"]))
    pool = create_kvcache_pool(config, 7, 3, torch.float32, torch.device("cpu"))
    assert isinstance(pool, BaseKVCachePool)
    assert pool.num_layers == config.num_layers
    assert tuple(pool.v_cache(0).shape) == (7, 3, config.num_kv_heads, config.head_dim) == (7, 3, 1, 24)


# ---------------------------------------------------------------- 任务 2：真实生成里历史原地不动


def load_tiny(path):
    """和 generate.py 的 load_model 同样的步骤，只用 minisgl 包的 API。"""
    from transformers import AutoConfig

    from minisgl.models import ModelConfig, create_model, load_weight
    from minisgl.utils import torch_dtype

    config = ModelConfig.from_hf(AutoConfig.from_pretrained(path))
    with torch.device("meta"), torch_dtype(torch.float32):
        model = create_model(config)
    model.load_state_dict({name: t.to(torch.float32) for name, t in load_weight(path, model)})
    return model, config


def test_task2_generation_writes_only_new_slots(tp1, global_ctx, tiny_models, checkpoint):
    """手工跑 prefill + 两步 decode：每一步池还是那块内存，只变了这一步 out_loc 里的槽位，个数等于新 token 数。"""
    from transformers import AutoTokenizer

    path, ps, n = tiny_models["llama3"], 2, 3
    prompts = ["The capital of France is", "def fibonacci(n):"]
    prompt_ids = [AutoTokenizer.from_pretrained(path)(p).input_ids for p in prompts]
    model, config = load_tiny(path)
    ctx = global_ctx(ps)
    num_pages = 16
    ctx.kv_cache = create_kvcache_pool(config, num_pages, ps, torch.float32, torch.device("cpu"))
    ctx.page_table = torch.zeros((len(prompts), 64), dtype=torch.int32)
    has_backend = importlib.util.find_spec("minisgl.attention") is not None
    if has_backend:  # 第 5 章起：注意力走可插拔后端，它在构造时拿到 ctx.kv_cache
        from minisgl.attention import create_attention_backend

        ctx.attn_backend = create_attention_backend("torch", config)
    fill(ctx.kv_cache)
    buffer_ptr = storage_ptr(ctx.kv_cache.k_cache(0))
    free_pages = list(range(num_pages))
    reqs = [Req(input_ids=torch.tensor(ids, dtype=torch.int32), table_idx=i, cached_len=0, output_len=n, uid=i,
                sampling_params=SamplingParams(max_tokens=n), cache_handle=None) for i, ids in enumerate(prompt_ids)]
    outs = [[] for _ in reqs]
    used_slots = set()
    with torch.inference_mode():
        for phase in ["prefill"] + ["decode"] * (n - 1):
            for r in reqs:  # 一页写满才拿下一页，空闲页从尾部拿：两个请求的页交替，不连续
                for page_idx in range(-(-r.cached_len // ps), -(-r.device_len // ps)):
                    page = free_pages.pop()
                    ctx.page_table[r.table_idx, page_idx * ps:(page_idx + 1) * ps] = torch.arange(page * ps,
                                                                                                   (page + 1) * ps)
            batch = Batch(reqs=reqs, phase=phase)
            batch.padded_reqs = reqs
            batch.positions = torch.cat([torch.arange(r.cached_len, r.device_len) for r in reqs]).int()
            batch.input_ids = torch.cat([r.input_ids[r.cached_len:r.device_len] for r in reqs]).int()
            rows = torch.cat([torch.full((r.extend_len,), r.table_idx) for r in reqs])
            batch.out_loc = ctx.page_table[rows, batch.positions.long()]
            new_tokens = sum(r.extend_len for r in reqs)
            if has_backend:
                ctx.attn_backend.prepare_metadata(batch)

            before = snapshot(ctx.kv_cache)
            with ctx.forward_batch(batch):
                logits = model.forward()
            for r in reqs:
                r.complete_one()
            after = snapshot(ctx.kv_cache)

            assert storage_ptr(ctx.kv_cache.k_cache(0)) == buffer_ptr, f"{phase}：KV 池被重新分配了"
            assert storage_ptr(ctx.kv_cache.v_cache(config.num_layers - 1)) == buffer_ptr
            changed = (after != before).flatten(3).any(-1)  # (2, 层数, 槽位数)
            out_loc = sorted(batch.out_loc.tolist())
            assert len(set(out_loc)) == new_tokens
            assert not used_slots & set(out_loc)
            for kv in range(2):
                for layer in range(config.num_layers):
                    got = changed[kv, layer].nonzero().flatten().tolist()
                    assert got == out_loc, f"{phase} 第 {layer} 层：变了的槽位 {got}，应当正好是 out_loc {out_loc}"
            used_slots |= set(out_loc)
            untouched = [s for s in range(num_pages * ps) if s not in used_slots]
            assert torch.all(after[:, :, untouched] == SENTINEL)

            tokens = logits.argmax(dim=-1).int()
            assert tokens.shape == (len(reqs),)
            for i, r in enumerate(reqs):
                r.append_host(tokens[i:i + 1])
                outs[i].append(int(tokens[i]))
    # 手工这一套（页不连续、池里先填满垃圾值）和命令行给出同样的 token：注意力只读 page table 指向的槽位
    reset_global_ctx()  # 入口脚本自己设全局 Context 和 TP 信息
    reset_tp_info()
    assert outs == parity.generate(checkpoint.entry_path, path, prompts, n, ps)


# ---------------------------------------------------------------- 任务 3：命令行上页大小不影响结果


def test_task3_page_size_invariance(checkpoint, tiny_models):
    model, n = tiny_models["llama3"], 10
    base = parity.generate(checkpoint.entry_path, model, PROMPTS, n, 1)
    for ps in [2, 3, 4, 16]:
        assert parity.generate(checkpoint.entry_path, model, PROMPTS, n, ps) == base, f"--page-size {ps} 结果变了"


def test_task3_larger_pool_same_tokens(checkpoint, tiny_models):
    """池比需要的大得多：空闲页从尾部拿，槽位全换了一批，结果不变。"""
    model, n, prompts = tiny_models["qwen3-tied"], 8, PROMPTS[:3]
    base = parity.generate(checkpoint.entry_path, model, prompts, n, 4)
    argv = build_argv(model, prompts, n, 4) + ["--num-pages", "500", "--max-seq-len", "300"]
    assert parse_outputs(run_in_process(checkpoint.entry_path, argv), len(prompts), n) == base


# ---------------------------------------------------------------- 任务 4：池或 page table 不够时的清楚报错


def cli_error(checkpoint, argv):
    """在本进程里跑入口脚本（tests/harness/errors.py 的 run_cli），结果交给 expect_exit。"""
    try:
        return run_cli(checkpoint.entry_path, argv)
    finally:
        reset_global_ctx()  # 出错时入口脚本可能没来得及清理
        reset_tp_info()


TWO_PROMPTS = ["The capital of France is", "def fibonacci(n):"]


def test_task4_num_pages_too_small_cli(checkpoint, tiny_models):
    """真的起一个子进程：池的页不够时非零退出，stderr 里点名 --num-pages。"""
    argv = build_argv(tiny_models["llama3"], TWO_PROMPTS, 8, 4) + ["--num-pages", "2"]
    expect_exit("ch4/pool_too_small", run_subprocess(checkpoint.entry_path, argv))


@pytest.mark.parametrize("ps,num_pages", [(1, 3), (1, 20), (16, 1)])
def test_task4_num_pages_too_small(checkpoint, tiny_models, ps, num_pages):
    """prefill 就放不下（3 页）、decode 途中用完（20 页 < 约 30 页）、一个请求一页但有两个请求（16, 1：
    --max-seq-len 16，页才不比序列长）。"""
    argv = build_argv(tiny_models["llama3"], TWO_PROMPTS, 8, ps) + ["--num-pages", str(num_pages),
                                                                    "--max-seq-len", "16"]
    expect_exit("ch4/pool_too_small", cli_error(checkpoint, argv))


def test_task4_num_pages_zero_is_refused(checkpoint, tiny_models):
    res = cli_error(checkpoint, build_argv(tiny_models["llama3"], ["Hello"], 2) + ["--num-pages", "0"])
    expect_exit("ch4/sizes_not_positive", res, name="--num-pages")


@pytest.mark.parametrize("case", ["prompt_longer_than_row", "generation_outgrows_row", "generation_exceeds_limit"])
def test_task4_max_seq_len_too_small(checkpoint, tiny_models, case):
    """--max-seq-len 比提示词 + 生成长度小：失败，报错点名 --max-seq-len。"""
    prompt, n = {"prompt_longer_than_row": (PROMPTS[3], 2),  # 提示词本身就放不进一行
                 "generation_outgrows_row": ("Hello world", 40),  # decode 途中超出 page table 一行
                 "generation_exceeds_limit": ("Hello world", 10)}[case]  # 超过给定的上限（即使补齐后还放得下）
    res = cli_error(checkpoint, build_argv(tiny_models["llama3"], [prompt], n) + ["--max-seq-len", "5"])
    expect_exit("ch4/max_seq_len_rule", res, max_seq_len=5)


def test_task4_max_seq_len_large_enough_is_fine(checkpoint, tiny_models):
    model = tiny_models["llama3"]
    argv = build_argv(model, ["Hello world"], 6)
    base = parse_outputs(run_in_process(checkpoint.entry_path, argv), 1, 6)
    assert parse_outputs(run_in_process(checkpoint.entry_path, argv + ["--max-seq-len", "64"]), 1, 6) == base
