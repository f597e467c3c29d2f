"""Runtimes behind one contract (``base.Runtime``): the ones that need no MindSpore live here (Lite, ONNX
Runtime); ``registry`` names all of them, the MindSpore ones (``msrl_consistency.runtimes``) imported on demand."""
