"""书：mkdocs 构建时的钩子（mkdocs_hooks，mkdocs.yml 里登记）、示意图（make_figures、figures_more、svgkit）、
报错表（error_cases），以及作者在检查点之间往后带修正的 carry_forward。读者不直接调用，mkdocs 和作者用。
"""
