"""阶段二调度器的三个角色，阶段一手工用：TableManager 管行和 token pool，CacheManager 管 KV 页，
prepare_batch 把一步的 batch 填好。generate.py 和 tools/bench 都用它们。"""

from .cache import CacheManager
from .prepare import add_req, prepare_batch, process_output
from .table import TableManager

__all__ = ["CacheManager", "TableManager", "add_req", "prepare_batch", "process_output"]
