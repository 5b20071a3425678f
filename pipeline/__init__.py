"""Everything between PCM bytes and text, with no network: sans-I/O, numpy and onnxruntime only."""
