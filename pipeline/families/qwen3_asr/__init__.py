"""Qwen3-ASR: encoder, prefill and step graphs on a ladder of attention windows; byte-level BPE; prompt contexts."""
