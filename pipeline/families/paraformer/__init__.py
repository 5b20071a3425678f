"""Paraformer: encoder + CIF, then the decoder on the token container that holds the CIF count; FunASR's text."""
