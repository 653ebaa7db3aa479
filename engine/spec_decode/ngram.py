"""Prompt-lookup (n-gram) proposals: the tokens that followed the latest earlier occurrence of
the context's last n tokens, for the longest n in [min_n, max_n] that occurs. Free to compute
and right often on copy-heavy work (editing, summarizing with quotes, code), useless on text
that does not repeat: then it proposes nothing and the step is an ordinary decode."""

from __future__ import annotations

import numpy as np

from engine.core.request import Request


def find_ngram_proposal(tokens: np.ndarray, min_n: int, max_n: int, k: int) -> list[int]:
    """Up to k tokens following the latest earlier match of the longest suffix n-gram."""
    total = len(tokens)
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        suffix = tokens[total - n :]
        # Windows starting at 0..total-n-1: every occurrence but the suffix itself.
        windows = np.lib.stride_tricks.sliding_window_view(tokens[: total - 1], n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if len(hits):
            start = int(hits[-1]) + n
            return tokens[start : start + k].tolist()
    return []


class NgramProposer:
    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n

    def num_wanted(self, req: Request, k: int) -> int:
        tokens = np.asarray(req.token_ids, dtype=np.int64)
        req.spec_token_ids = find_ngram_proposal(tokens, self.min_n, self.max_n, k)
        return len(req.spec_token_ids)

    def propose(self, batch: list[tuple[Request, int]]) -> None:
        for req, granted in batch:
            del req.spec_token_ids[granted:]
