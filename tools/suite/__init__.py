"""python -m tools.run_tests 的几样家当：同时跑几份、怎么起一份、记下每份的用量（parts.py、procs.py），
以及测试页上"最慢的 20 个测试、每份的 CPU 秒"那张表（profile.py）。"""
