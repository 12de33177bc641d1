"""第 6 章页面上的 torch.cuda / torch.distributed 接口表从参考代码现读（tools/book/torch_apis.py）：
读者要写的代码调的每个接口都在表里、都有一句说明，页面上有占位符。"""

from __future__ import annotations

from tools.book import torch_apis
from tools.manifest import ROOT, find_checkpoint


def test_every_api_the_reference_calls_is_on_the_page():
    ck = find_checkpoint("ch6_engine_sampler")
    found = {u.api: u for u in torch_apis.uses(ck)}
    assert set(found) <= set(torch_apis.WHAT), f"WHAT 里缺说明：{set(found) - set(torch_apis.WHAT)}"
    assert set(torch_apis.WHAT) <= set(found), f"WHAT 里有代码不再用的接口：{set(torch_apis.WHAT) - set(found)}"
    for api in ["torch.cuda.Event.record", "torch.distributed.destroy_process_group", "torch.cuda.CUDAGraph.pool",
                "torch.cuda.CUDAGraph.replay"]:
        assert api in found, api
    assert any("init_method=" in s and "timeout=" in s for s in found["torch.distributed.init_process_group"].shapes)
    assert any('backend="gloo"' in s for s in found["torch.distributed.new_group"].shapes)
    assert any("pool=" in s for s in found["torch.cuda.graph"].shapes)
    table = torch_apis.table(ck)
    assert "`torch.cuda.Event` 的 `.record()`" in table
    assert torch_apis.MARK in (ROOT / "docs" / "ch6.md").read_text(encoding="utf-8")


def test_methods_are_found_through_locals_and_annotations():
    src = '''
import torch
import torch.distributed as dist

class R:
    def __init__(self):
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.event: torch.cuda.Event = torch.cuda.Event()

    def go(self, x: torch.cuda.Stream):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=None):
            pass
        g.replay()
        self.graphs[1].reset()
        self.event.synchronize()
        return dist.group.WORLD
'''
    import ast

    tree = ast.parse(src)
    aliases = torch_apis._aliases(tree)
    cls = tree.body[2]
    c = torch_apis._Collector(aliases, torch_apis._attr_types(cls, aliases))
    for stmt in cls.body[1].body:
        c.visit(stmt)
    assert [a for a, _ in c.hits] == ["torch.cuda.CUDAGraph", "torch.cuda.graph", "torch.cuda.CUDAGraph.replay",
                                      "torch.cuda.CUDAGraph.reset", "torch.cuda.Event.synchronize",
                                      "torch.distributed.group.WORLD"]
