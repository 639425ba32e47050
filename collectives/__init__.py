"""DiLoCo-style outer steps on hivemind, with a consistency layer."""
