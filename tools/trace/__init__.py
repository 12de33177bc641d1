"""course.py trace：cli 起检查点的进程、比较、写文件；record 在那个进程里记每一步；diff 找第一个不同；
html 和 assets/ 画成离线能开的页面。course.py、书的构建钩子调用它；python -m tools.trace 和 course.py trace 相同。
"""
