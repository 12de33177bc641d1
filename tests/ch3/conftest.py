"""第 3 章测试的本地配置：每个测试前后都清掉 TP 身份。

minisgl 在夹具里才 import：`pytest tests/ch3 --checkpoint ch3` 时本文件比 --checkpoint 生效得早。"""

import pytest


@pytest.fixture(autouse=True)
def fresh_tp_info():
    """每个算子在构造时读 TP 身份：每个测试前后都清掉，测试之间不串。"""
    from minisgl.distributed import reset_tp_info

    reset_tp_info()
    try:
        yield
    finally:
        reset_tp_info()
