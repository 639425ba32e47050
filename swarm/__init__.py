"""The p2p layer on py-libp2p (trio). Never imports torch or hivemind."""
