"""第 6 章测试的本地配置：每个测试前后都清掉全局 Context 和 TP 身份。"""

import pytest

from minisgl.core import reset_global_ctx
from minisgl.distributed import reset_tp_info


@pytest.fixture(autouse=True)
def clean_global_state():
    """别的测试文件留下的全局 Context / TP 身份不该让这里失败；测试里面的清理由测试自己检查。"""
    reset_global_ctx()
    reset_tp_info()
    yield
    reset_global_ctx()
    reset_tp_info()
