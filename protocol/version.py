"""Version numbers. PROTOCOL_VERSION is the wire major version: peers reject other majors."""

PROTOCOL_VERSION = 2
"""2: the outer step's DHT records are four types by meaning (OuterVersion, OuterVote, OuterJoin,
OuterLeft) instead of one OuterStepCommit with a kind; no outer_commit gossip topic."""
SOFTWARE_VERSION = "0.1.0"
