"""Hotwords for a CTC model: a context graph over the model's tokens, which the beam search is biased to.

    ContextGraph(hotwords, Speller(tokens))   spelled with the model's tokens; ProtocolError bad_start when
                                      one cannot be spelled

The graph is a trie of the hotwords' token sequences with Aho-Corasick failure links, as in icefall's and
sherpa-onnx's ContextGraph: each token that extends a match earns its hotword's boost, a match that breaks
gives the bonus back (the failure link keeps only the bonus of the longest suffix still matching), and a
completed hotword keeps its bonus for good; its last token earns its boost again on each further frame it
holds (`run_bonus`, beam_search.py says why). Scores are natural-log units added to a path's
log-probability.

Spelling: greedy longest match of the text on the model's pieces (tokens.txt); a word starts with "▁" as in
sentencepiece. The text is spelled as written and in lower case (each way the model has pieces for goes
into the graph), and a phrase that begins with a CJK character also without the leading "▁", since
Chinese and Japanese words inside a sentence carry none.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

from ...errors import ProtocolError
from ...hotwords import Hotword
from ...transcript import is_cjk
from .decoding import SPECIAL_TOKENS, WORD_START


# ---- spelling ----------------------------------------------------------------------------------------

class Speller:
    """Greedy longest match of text on a model's pieces (tokens.txt order = ids)."""

    def __init__(self, tokens: Sequence[str]) -> None:
        self.ids = {piece: i for i, piece in enumerate(tokens)
                    if piece and piece not in SPECIAL_TOKENS and not piece.startswith("<|")}
        self.longest = max((len(p) for p in self.ids), default=0)

    def spell(self, text: str) -> list[int] | None:
        """Token ids of `text` ("▁" already in place), or None when some part has no piece."""
        ids, i = [], 0
        while i < len(text):
            for j in range(min(len(text), i + self.longest), i, -1):
                token = self.ids.get(text[i:j])
                if token is not None:
                    ids.append(token)
                    i = j
                    break
            else:
                return None
        return ids

    def spellings(self, word: Hotword) -> list[list[int]]:
        """Every way the model may write the hotword (see the module doc); ProtocolError when there is none."""
        variants = []
        for text in dict.fromkeys([word.text, word.text.lower()]):  # as written, and as a lower-case model has it
            marked = WORD_START + text.replace(" ", WORD_START)
            variants += [marked, marked[1:]] if is_cjk(text[0]) else [marked]
        found = [ids for ids in map(self.spell, variants) if ids]
        if not found:
            raise ProtocolError(f"hotword {word.text!r} cannot be spelled with this model's tokens",
                                code="bad_start", hotword=word.text)
        return [ids for n, ids in enumerate(found) if ids not in found[:n]]


# ---- the graph ---------------------------------------------------------------------------------------

@dataclass(eq=False)
class ContextState:
    token: int = -1  # -1 at the root
    token_score: float = 0.0  # bonus for reaching this state from its parent
    node_score: float = 0.0  # bonus accumulated from the root to here
    output_score: float = 0.0  # bonus kept for good when a hotword ends here (itself or a suffix of it)
    is_end: bool = False
    next: dict[int, "ContextState"] = field(default_factory=dict)
    fail: "ContextState | None" = None
    output: "ContextState | None" = None  # the longest hotword that ends here as a proper suffix


class ContextGraph:
    """A trie of hotword token sequences with failure links. `root` is the state of an unmatched prefix."""

    def __init__(self, hotwords: Sequence[Hotword], speller: Speller) -> None:
        self.hotwords = tuple(hotwords)
        self.root = ContextState()
        self.root.fail = self.root
        for word in self.hotwords:
            for ids in speller.spellings(word):
                self._insert(ids, word.boost)
        self._link()

    def _insert(self, ids: list[int], boost: float) -> None:
        node = self.root
        for j, token in enumerate(ids):
            child = node.next.get(token)
            if child is None:
                child = node.next[token] = ContextState(token=token, token_score=boost)
            else:
                child.token_score = max(child.token_score, boost)
            child.node_score = node.node_score + child.token_score
            child.is_end = child.is_end or j == len(ids) - 1
            node = child
        # Scores along a shared prefix may have grown: recompute the whole trie's node scores.
        self._rescore(self.root)

    def _rescore(self, node: ContextState) -> None:
        for child in node.next.values():
            child.node_score = node.node_score + child.token_score
            child.output_score = child.node_score if child.is_end else 0.0
            self._rescore(child)

    def _link(self) -> None:
        """Breadth-first: failure links to the longest proper suffix in the trie, and output links."""
        queue = deque()
        for child in self.root.next.values():
            child.fail = self.root
            queue.append(child)
        while queue:
            node = queue.popleft()
            for token, child in node.next.items():
                fail = node.fail
                while token not in fail.next and fail is not self.root:
                    fail = fail.fail
                child.fail = fail.next.get(token, self.root)
                output = child.fail
                while output is not self.root and not output.is_end:
                    output = output.fail
                child.output = None if output is self.root else output
                if child.output is not None:
                    child.output_score += child.output.output_score
                queue.append(child)
        states = list(self._states(self.root))
        self.max_bonus = max((s.output_score for s in states), default=0.0)  # the most a prefix keeps

    def _states(self, node: ContextState):
        for child in node.next.values():
            yield child
            yield from self._states(child)

    def step(self, state: ContextState, token: int) -> tuple[float, ContextState]:
        """Advance a prefix's state by one emitted token: (score change, new state)."""
        node = state.next.get(token)
        if node is not None:
            score = node.token_score
        else:
            node = state.fail
            while token not in node.next and node is not self.root:
                node = node.fail
            node = node.next.get(token, self.root)
            score = node.node_score - state.node_score  # give back the bonus of the broken match
        return score + node.output_score, node

    def run_bonus(self, state: ContextState) -> float:
        """The bonus each further frame earns while the token that led to `state` goes on: its boost when it
        completed a hotword (kept for good, so never given back), else nothing (a partial match's bonus may
        be given back, a frame's could not)."""
        return state.token_score if state.is_end else 0.0

    def finish(self, state: ContextState) -> float:
        """Score change at the end of the utterance: an unfinished match gives its bonus back."""
        return -state.node_score
