"""PyTorch to ONNX, quantisation, padding-invariance verification and the demo model's training.

Commands (each a `run(args)` behind `python -m export`): sensevoice, verify, train-demo, eval.
torch is imported lazily so `--help` is instant and serving never pulls it in.
"""
