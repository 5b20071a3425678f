"""PyTorch definitions of the paddable models (state_dict-compatible with FunASR's SenseVoiceSmall)."""
