"""SenseVoice: one CTC graph on the session grid; greedy CTC, SenseVoice's tags, hotwords as a biased beam search."""
