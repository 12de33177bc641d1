"""每个检查点的脊梁：fp32、贪心，所有提示词放在一次调用里，每个都和 HF 单独跑的结果逐 token 相同。"""

from tools.manifest import PROMPTS, TINY_NEW_TOKENS
from tests.harness.parity import generate, parity_failures
from tests.harness.reference import encode


def test_prompts_cover_what_we_promise(tiny_models):
    lengths = [len(encode(tiny_models["qwen3-tied"], p)) for p in PROMPTS]
    assert max(lengths) >= 64, f"需要一条 60+ token 的长提示词，现在各条长度是 {lengths}"
    assert any("\u4e00" <= ch <= "\u9fff" for ch in "".join(PROMPTS)), "需要有中文提示词"


def test_parity_with_hf(checkpoint, tiny_models, family, page_size):
    failures = parity_failures(checkpoint.entry_path, tiny_models[family], PROMPTS, TINY_NEW_TOKENS, page_size)
    assert not failures, "\n\n".join(failures)


def test_each_prompt_alone_equals_batch(checkpoint, tiny_models, family):
    """批处理不改变任何一个请求的结果：一起跑和单独跑逐 token 相同。"""
    model, ps = tiny_models[family], checkpoint.page_sizes[-1]
    together = generate(checkpoint.entry_path, model, PROMPTS, TINY_NEW_TOKENS, ps)
    alone = [generate(checkpoint.entry_path, model, [p], TINY_NEW_TOKENS, ps)[0] for p in PROMPTS]
    assert together == alone
