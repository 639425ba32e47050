"""A discrete-event simulation of the swarm's rollout gossip (issue 15, item 3).

Layers, each module one concept: ``config`` (the inputs) <- ``wan`` (latencies), ``cpu``
(where work waits), ``pool`` (SAPO's sampling), ``announce`` (peer announcements, fixed or
growing period, closed form) <- ``schemes`` (flood, feeds) <- ``engine`` (the event loop) <- ``metrics`` (what a run
measured) <- ``calibrate`` (costs from real gossip_bench rows, and the error) <- ``__main__``
(the grid, JSON and PNG). ``realbench`` runs gossip_bench's rows for calibration.

Beside them, the Sybil farm (issue 32), slot choice only: ``picker`` (``swarm/feeds.py``'s
``FeedClient`` choice, mirrored without trio) <- ``sybil`` (honest nodes and a farm, round by
round) <- ``sybil_grid`` (N x F x farm x policy, JSON and PNG) <- ``__main__ sybil``.

    PYTHONPATH=$PWD python -m bench.sim calibrate --quiet bench/results/gossip_quiet_*.json
    PYTHONPATH=$PWD python -m bench.sim grid
    PYTHONPATH=$PWD python -m bench.sim sybil
"""
