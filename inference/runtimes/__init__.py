"""Runtimes behind one contract (``base.Runtime``): the ones that need no MindSpore live here (Lite, ONNX
Runtime); ``registry`` names all of them, and the training package registers its MindSpore ones there."""
