"""Per-token log-probabilities of a streamed response, in one shape for both OpenAI endpoints.

The equivalence guard asks the baseline for its top-k log-probabilities on the greedy replays,
so that where a candidate's greedy output leaves the baseline's, the baseline's own margin
between the two tokens there is known (``search._equivalence``). Completions stream
``logprobs: {tokens, token_logprobs, top_logprobs: [{token: lp}]}`` per chunk; chat streams
``logprobs: {content: [{token, logprob, top_logprobs: [{token, logprob}]}]}``. Both become a
list of ``[token, logprob, [[token, logprob], ...]]`` rows, the top list best first, a token its
id (an int) where the request asked for ids, else its text.
"""

from __future__ import annotations

TOP_LOGPROBS = 5
"""How many alternatives the baseline reports per position: a candidate's token outside them is
at least the fifth-best token's margin behind, far past any near-tie."""


ID_PREFIX = "token_id:"


def request_fields(endpoint: str, top: int = TOP_LOGPROBS) -> dict:
    """The body fields that ask for ``top`` log-probabilities per generated token, the tokens
    named by their ids (a token's text need not spell the output: a SentencePiece token drops its
    leading space, a word-level tokenizer's its separator), and the output's token ids."""
    lp = {"logprobs": True, "top_logprobs": top} if endpoint == "chat" else {"logprobs": top}
    return {**lp, "return_tokens_as_token_ids": True, **ID_FIELDS}


ID_FIELDS = {"return_token_ids": True}
"""The body field that has vLLM stream each chunk's token ids (``token_ids``)."""


def _tok(t) -> int | str:
    """A token as reported: its id where the server named it ``token_id:N``, else its text."""
    t = str(t)
    if t.startswith(ID_PREFIX) and t[len(ID_PREFIX):].lstrip("-").isdigit():
        return int(t[len(ID_PREFIX):])
    return t


def _top(entries) -> list[list]:
    if isinstance(entries, dict):  # completions: {token: lp}
        pairs = [[_tok(t), float(lp)] for t, lp in entries.items() if lp is not None]
    else:  # chat: [{token, logprob}]
        pairs = [[_tok(e.get("token", "")), float(e["logprob"])] for e in entries or []
                 if isinstance(e, dict) and e.get("logprob") is not None]
    return sorted(pairs, key=lambda p: -p[1])


def chunk_ids(choice: dict) -> list[int]:
    """The token ids one streamed choice carries (``return_token_ids``; [] without them)."""
    ids = choice.get("token_ids")
    return [int(i) for i in ids] if isinstance(ids, list) else []


def chunk_rows(choice: dict) -> list[list]:
    """The rows one streamed choice carries ([] when it has no log-probabilities)."""
    lp = choice.get("logprobs")
    if not isinstance(lp, dict):
        return []
    if isinstance(lp.get("content"), list):  # chat
        return [[_tok(e.get("token", "")), float(e.get("logprob") or 0.0), _top(e.get("top_logprobs"))]
                for e in lp["content"] if isinstance(e, dict)]
    tokens = lp.get("tokens") or []
    lps = lp.get("token_logprobs") or []
    tops = lp.get("top_logprobs") or []
    return [[_tok(t), float(lps[i]) if i < len(lps) and lps[i] is not None else 0.0,
             _top(tops[i] if i < len(tops) else None)] for i, t in enumerate(tokens)]
