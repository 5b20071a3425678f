"""Benchmarks of Unipad ASR: `python -m bench model|paraformer|load|failover|train|report` (docs/benchmarks.md).

The top of the house: a client of the server (it starts servers and streams to them with the client library)
and of export (the peer, the training loop), imported by nothing but tests.

    model.py      one inference per container and shape policy, fp32/int8, beside the peer (peer.py)
    paraformer.py one Paraformer inference, ours against FunASR's export
    load.py       N concurrent real-time streams against a server: end-of-speech-to-final latency, capacity
    failover.py   resumable streams through HAProxy (cluster.py) while servers drain, die and hang
    train.py      seconds per training step of the demo model
    report.py     docs/benchmarks.md sections and docs/latency_vs_streams.png from saved results
    make_peer.py  writes the peer (FunASR's own export of the same weights); needs the funasr package
    make_sensevoice_checkpoint.py, make_paraformer_checkpoint.py  released-layout checkpoints with FunASR's
                  own seeded initialisation (reference_checkpoint.py: what they share); need funasr
"""
