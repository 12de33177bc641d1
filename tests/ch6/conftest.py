"""第 6 章测试的本地配置：每个测试前后都清掉全局 Context 和 TP 身份。

minisgl 在夹具里才 import：`pytest tests/ch6 --checkpoint ch6` 时本文件比 --checkpoint 生效得早。"""

import pytest


@pytest.fixture(autouse=True)
def clean_global_state():
    """别的测试文件留下的全局 Context / TP 身份不该让这里失败；测试里面的清理由测试自己检查。"""
    from minisgl.core import reset_global_ctx
    from minisgl.distributed import reset_tp_info

    reset_global_ctx()
    reset_tp_info()
    yield
    reset_global_ctx()
    reset_tp_info()
