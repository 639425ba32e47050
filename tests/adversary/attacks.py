"""The attacks of issue 11's table (plus Sybil flooding) and their default parameters."""

from __future__ import annotations

import enum
from typing import Any

__all__ = ["Attack", "DEFAULTS"]


class Attack(str, enum.Enum):
    """The attacks, by the name the command line takes."""

    CODE_EXEC = "code_exec"
    """Rollouts of unconfigured ReasoningGYM families whose completions are Python payloads
    that touch a marker file when a verifier evaluates them."""
    DILOCO_TAKEOVER = "diloco_takeover"
    """A fresh identity's signed head commit at step 10^6 for an all-zero state, served."""
    STEERING = "steering"
    """Valid tiny_add groups of 64 and 8 completions making "9999" the best answer."""
    CPU_BOMB = "cpu_bomb"
    """count_primes specs with max_n 2e7 and wrong prompts."""
    UNKNOWN_KEYS = "unknown_keys"
    """Valid batches carrying ~63k msgpack objects under an unknown key."""
    BAD_SIGNATURES = "bad_signatures"
    """~230 msg/s whose pubsub signature does not verify."""
    SYBIL = "sybil"
    """STEERING from 20 fresh identities at once."""
    FEED_SYBIL = "feed_sybil"
    """20 fresh identities announced like honest peers that serve feeds badly (``mode``: idle,
    wrong, trickle; ``mint_every_s``: a fresh key that often; tests/adversary/feeds.py)."""
    OBSERVE = "observe"
    """Not an attack: a silent peer that only records what the honest nodes publish (the
    hijack measure; it sends nothing, so no defence has a reason to shut it out)."""


# Rates are set for short honest runs: an attacked run can last ~8 s on a quiet 2-core machine
# (a CI run measured code_exec at 0.5/s sending 4 messages, steering at 2/s 18), so a slow
# attacker would barely reach it; the takeover re-stores its commit often enough to meet the
# first catch-up.
DEFAULTS: dict[Attack, dict[str, Any]] = {
    Attack.CODE_EXEC: {"rate_per_s": 2.0},
    Attack.DILOCO_TAKEOVER: {"step": 10**6, "restore_every_s": 0.5},
    Attack.STEERING: {"rate_per_s": 8.0, "group_sizes": [64, 64, 8, 8]},
    Attack.CPU_BOMB: {"messages": 2, "specs": 16, "max_n": 20_000_000, "rate_per_s": 0.5},
    Attack.UNKNOWN_KEYS: {"rate_per_s": 10.0, "objects": 63_000},
    Attack.BAD_SIGNATURES: {"rate_per_s": 230.0},
    Attack.SYBIL: {"rate_per_s": 1.0, "identities": 20, "group_sizes": [64, 64, 8, 8]},
    Attack.FEED_SYBIL: {"identities": 20, "mode": "idle", "trickle_s": 15.0, "mint_every_s": 0.0},
    Attack.OBSERVE: {},
}
"""Per-attack defaults; the JSON argument overrides them."""
