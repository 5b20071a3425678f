"""Benchmarks of Unipad ASR: `python -m server.bench model|load|report` (see docs/benchmarks.md).

    model.py      one inference per container and shape policy, fp32/int8, beside the peer (peer.py)
    load.py       N concurrent real-time streams against a server: end-of-speech-to-final latency, capacity
    report.py     docs/benchmarks.md sections and docs/latency_vs_streams.png from saved results
    make_peer.py  writes the peer (FunASR's own export of the same weights); needs the funasr package
"""
