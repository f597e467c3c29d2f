"""MindSpore Lite on the deploy side: one home for everything that talks to Lite's C++ SDK.

``common`` (the errors each failure maps to, the dtypes both paths speak, where the runner lives), ``inprocess``
(``LiteModel``: Lite in the calling process through ``libmsrl-lite.so``), ``client`` (``LiteRunner``: the runner
process and its pipe), ``runner_info`` (what a build of the runner reports of its SDK, and the graph file it loads),
``build_lite.sh`` and ``runner/`` (the C++ runner, the
in-process library and the converter, built against the device's SDK).
"""
