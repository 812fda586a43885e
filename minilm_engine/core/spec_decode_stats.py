"""How well the draft guesses: counters per request and per engine, and the textbook formula.

Contract: `SpecDecodingStats.observe(num_draft_tokens, num_accepted_tokens)` records one
verification round (vLLM's "draft"); the properties are the rates a chapter plots (vLLM's names).

If each drafted token were accepted independently with probability alpha, a round of K drafts
would produce on average (Leviathan et al. 2023, eq. 1):

    E[tokens per round] = 1 + alpha + alpha^2 + ... + alpha^K = (1 - alpha^(K+1)) / (1 - alpha)

(the accepted prefix, plus the one token the target adds: a correction or a bonus).  Real
acceptances are not independent (easy stretches of text are easy for several tokens in a row),
so the measured value departs from it; `acceptance_rate_per_pos` shows where.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def expected_tokens_per_round(alpha: float, num_speculative_tokens: int) -> float:
    """(1 - alpha^(K+1)) / (1 - alpha): tokens one target forward yields, if acceptances are iid."""
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    k = num_speculative_tokens
    if alpha == 1:
        return float(k + 1)  # the limit of the formula: every draft accepted, plus the bonus
    return (1 - alpha ** (k + 1)) / (1 - alpha)


@dataclass
class SpecDecodingStats:
    """Counters of verification rounds.  Invariant: num_accepted_tokens <= num_draft_tokens, and
    num_accepted_tokens_per_pos[i] counts rounds whose first i + 1 drafts were all accepted."""

    num_spec_tokens: int  # K, the most drafts per round
    num_drafts: int = 0  # verification rounds (each: one target forward for the request)
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    # Drafts the target actually ruled on: the accepted ones plus, per round, the first rejected
    # one (the drafts after a rejection are discarded unread).  alpha = accepted / compared.
    num_compared_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)
    num_compared_tokens_per_pos: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.num_accepted_tokens_per_pos:
            self.num_accepted_tokens_per_pos = [0] * self.num_spec_tokens
        if not self.num_compared_tokens_per_pos:
            self.num_compared_tokens_per_pos = [0] * self.num_spec_tokens

    def observe(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        """One round: `num_draft_tokens` proposed, the first `num_accepted_tokens` accepted."""
        if not 0 <= num_accepted_tokens <= num_draft_tokens <= self.num_spec_tokens:
            raise ValueError(
                f"a round must have 0 <= accepted ({num_accepted_tokens}) <= drafted "
                f"({num_draft_tokens}) <= K ({self.num_spec_tokens})"
            )
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens
        num_compared = min(num_accepted_tokens + 1, num_draft_tokens)
        self.num_compared_tokens += num_compared
        for pos in range(num_compared):
            self.num_compared_tokens_per_pos[pos] += 1
        for pos in range(num_accepted_tokens):
            self.num_accepted_tokens_per_pos[pos] += 1

    def merge(self, other: SpecDecodingStats) -> None:
        """Add another set of counters (a request's into the engine's)."""
        self.num_drafts += other.num_drafts
        self.num_draft_tokens += other.num_draft_tokens
        self.num_accepted_tokens += other.num_accepted_tokens
        self.num_compared_tokens += other.num_compared_tokens
        for pos in range(min(self.num_spec_tokens, other.num_spec_tokens)):
            self.num_accepted_tokens_per_pos[pos] += other.num_accepted_tokens_per_pos[pos]
            self.num_compared_tokens_per_pos[pos] += other.num_compared_tokens_per_pos[pos]

    @property
    def draft_acceptance_rate(self) -> float | None:
        """vLLM's "draft acceptance rate": accepted / proposed drafts."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None

    @property
    def alpha(self) -> float | None:
        """Per-token acceptance probability, estimated over the drafts the target ruled on
        (the alpha of the formula; the draft acceptance rate counts unread drafts as failures)."""
        return self.num_accepted_tokens / self.num_compared_tokens if self.num_compared_tokens else None

    @property
    def mean_acceptance_length(self) -> float | None:
        """Tokens produced per verification round (= per target forward): 1 + accepted / rounds."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else None

    @property
    def acceptance_rate_per_pos(self) -> list[float | None]:
        """P(draft i accepted | every draft before it accepted), i = 0..K-1.  Flat at alpha if
        acceptances were independent; rising with i when easy stretches come in runs."""
        return [
            accepted / compared if compared else None
            for accepted, compared in zip(self.num_accepted_tokens_per_pos, self.num_compared_tokens_per_pos)
        ]
